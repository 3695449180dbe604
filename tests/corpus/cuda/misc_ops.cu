// A grab-bag of ordinary code, compiled with -lineinfo so .loc/.file appear: float and double
// literals (inf, nan, -0, subnormals), predicates and selp, atomics (global and shared), float4
// loads and stores, a loop kept rolled with #pragma unroll 1, fast-math intrinsics and bit tricks.
// corpus-ptx: misc_ops_lineinfo -arch=sm_90 -lineinfo
#include <cstdint>
#include <cmath>

extern "C" __global__ void literals(float* __restrict__ f, double* __restrict__ d, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = f[i];
    float y = x > 0.0f ? 3.14159265f * x : -1.5e-3f;
    y = isnan(x) ? INFINITY : y;
    y = x == 0.0f ? -0.0f : y;
    y = fabsf(x) < 1.0e-40f ? NAN : y;          // a subnormal constant
    f[i] = y + 0x1.8p+1f;
    double dx = d[i];
    double dy = dx * 2.718281828459045 + 1.0e-300;
    dy = dx < -1.0e308 ? -INFINITY : dy;
    d[i] = sqrt(fabs(dy)) + 4.9e-324;
}

extern "C" __global__ void preds_and_atomics(const float4* __restrict__ in, float4* __restrict__ out,
                                             int* __restrict__ hist, float* __restrict__ total,
                                             unsigned long long* __restrict__ maxbits, int n4)
{
    __shared__ int s_hist[16];
    if (threadIdx.x < 16)
        s_hist[threadIdx.x] = 0;
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = in[i];
        const bool pos = v.x > 0.0f && v.y > 0.0f;
        const bool big = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)) > 100.0f;
        v.x = pos ? v.x : -v.x;
        v.w = big ? 100.0f : v.w;
        out[i] = v;
        const int bucket = min(15, max(0, static_cast<int>(v.x)));
        atomicAdd(&s_hist[bucket], 1);
        atomicAdd(total, v.x + v.y + v.z + v.w);
        atomicMax(maxbits, static_cast<unsigned long long>(__float_as_uint(v.z)));
        int old = atomicCAS(&hist[16], 0, i);
        if (old == 0 && pos)
            atomicExch(&hist[17], __popc(i) + __clz(i) + __ffs(i) + static_cast<int>(__brev(i) & 7));
    }
    __syncthreads();
    if (threadIdx.x < 16)
        atomicAdd(&hist[threadIdx.x], s_hist[threadIdx.x]);
}

extern "C" __global__ void rolled_loop(const float* __restrict__ x, float* __restrict__ y, int n, int iters)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float v = x[i];
    float s = 0.0f;
#pragma unroll 1
    for (int k = 0; k < iters; ++k) {
        v = __fmaf_rn(v, 0.999f, __expf(-v) * 0.001f);
        s += __sinf(v) * __frcp_rn(1.0f + k);
    }
    y[i] = s / static_cast<float>(iters) + static_cast<float>(i) / 3.0f + static_cast<float>(i % 7);
}
