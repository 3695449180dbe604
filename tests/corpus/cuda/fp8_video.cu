// Narrow types and SIMD video arithmetic, built for Ada and for Blackwell targets: fp8 (e4m3 and
// e5m2) conversions through cuda_fp8.h, half2 and bfloat162 math, the SIMD-within-a-word
// intrinsics (__vadd4, __vabsdiffu4, __vcmpgtu2, __vsads2 ...) and video instructions inlined as
// PTX (vadd4, vabsdiff4, vmax2, vset4 with accumulation, vshl with merge), prmt, bfe/bfi, dp4a.
// corpus-ptx: fp8_video_sm89 -arch=sm_89
// corpus-ptx: fp8_video_sm100a -arch=sm_100a
// corpus-ptx: fp8_video_sm120 -arch=sm_120
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

extern "C" __global__ void fp8_convert(const float2* in, __nv_fp8x2_e4m3* e4, __nv_fp8x2_e5m2* e5,
                                       float2* back, __half2* h, __nv_bfloat162* bf, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float2 v = in[i];
    __nv_fp8x2_e4m3 a(v);
    __nv_fp8x2_e5m2 b(v);
    e4[i] = a;
    e5[i] = b;
    float2 r = static_cast<float2>(a);
    __half2 hv = __floats2half2_rn(v.x, v.y);
    __half2 hb = static_cast<__half2>(b);
    hv = __hfma2(hv, hb, __float2half2_rn(0.5f));
    __nv_bfloat162 bv = __floats2bfloat162_rn(r.x, r.y);
    bv = __hmul2(bv, bv);
    h[i] = __hmax2(hv, __habs2(hv));
    bf[i] = bv;
    back[i] = make_float2(r.x + __low2float(bv), r.y + __high2float(hv));
}

__device__ __forceinline__ uint32_t video(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d, e, f, g, h;
    asm("vadd4.u32.u32.u32.sat %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    asm("vabsdiff4.u32.u32.u32.add %0, %1, %2, %3;" : "=r"(e) : "r"(a), "r"(b), "r"(c));
    asm("vmax2.s32.s32.s32 %0, %1, %2, %3;" : "=r"(f) : "r"(a), "r"(b), "r"(c));
    asm("vset4.u32.u32.ne.add %0, %1, %2, %3;" : "=r"(g) : "r"(a), "r"(b), "r"(c));
    asm("vshl.u32.u32.u32.clamp.add %0, %1.b0, %2.b1, %3;" : "=r"(h) : "r"(a), "r"(b), "r"(c));
    return d ^ e ^ f ^ g ^ h;
}

extern "C" __global__ void simd_video(const uint32_t* a, const uint32_t* b, uint32_t* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint32_t x = a[i], y = b[i];
    uint32_t s = __vadd4(x, y) ^ __vabsdiffu4(x, y) ^ __vcmpgtu2(x, y) ^ __vsads2(x, y) ^ __vmaxs4(x, y);
    uint32_t p = __byte_perm(x, y, 0x5140);
    uint32_t f = (x >> 7) & 0x1f;                 // bfe
    uint32_t m = (y & ~0x3f0u) | ((x << 4) & 0x3f0u);   // bfi
    int dp = __dp4a((int)x, (int)y, (int)s);
    out[i] = video(s, p, f) + m + (uint32_t)dp + __popc(x) + __clz(y) + __brev(x);
}
