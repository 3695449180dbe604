// Textures and surfaces through texture/surface objects: tex.1d/2d/3d fetches (float and int),
// a layered and a cube fetch, tld4 (tex2Dgather), a level-of-detail fetch, surface loads and
// stores with clamping and trapping, and txq/suq queries inlined as PTX.
// corpus-ptx: tex_surf -arch=sm_90
// corpus-ptx: tex_surf_sm75 -arch=sm_75
#include <cuda_runtime.h>

extern "C" __global__ void tex_fetch(cudaTextureObject_t t1, cudaTextureObject_t t2, cudaTextureObject_t t3,
                                     cudaTextureObject_t tl, cudaTextureObject_t tc, cudaTextureObject_t ti,
                                     float4* out, int* iout, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float u = (i + 0.5f) / n;
    float4 a = tex1Dfetch<float4>(t1, i);
    float b = tex2D<float>(t2, u, 1.0f - u);
    float4 c = tex3D<float4>(t3, u, u, 0.5f);
    float d = tex2DLayered<float>(tl, u, u, i & 3);
    float e = texCubemap<float>(tc, u, -u, 1.0f);
    float4 g = tex2Dgather<float4>(t2, u, u, 1);
    float l = tex2DLod<float>(t2, u, u, 1.5f);
    int k = tex1Dfetch<int>(ti, i);
    out[i] = make_float4(a.x + b + c.y + g.w, d, e, l + a.w + c.z);
    iout[i] = k;
}

extern "C" __global__ void surf_copy(cudaSurfaceObject_t src, cudaSurfaceObject_t dst, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h)
        return;
    float4 v = surf2Dread<float4>(src, x * 16, y, cudaBoundaryModeClamp);
    uchar4 c = surf2Dread<uchar4>(src, x * 4, y);
    v.x += c.x;
    surf2Dwrite(v, dst, x * 16, y, cudaBoundaryModeTrap);
    surf1Dwrite(c, dst, x * 4);
    int width, height;
    asm("txq.width.b32 %0, [%1];" : "=r"(width) : "l"(src));
    asm("suq.height.b32 %0, [%1];" : "=r"(height) : "l"(dst));
    if (width != height)
        surf2Dwrite(width, dst, 0, 0);
}
