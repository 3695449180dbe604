// One warp per block computes a 16x8 tile of C = A * B with ldmatrix + mma.sync.m16n8k16 (inline
// asm): fp16 inputs with fp32 accumulation (B given transposed, ldmatrix without .trans), and fp16
// accumulation with B row-major (ldmatrix .trans).
// corpus-ptx: mma_ldmatrix -arch=sm_90
#include <cuda_fp16.h>
#include <cstdint>

__device__ __forceinline__ uint32_t smem_u32(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}

// A: 16 x K row-major.  Bt: 8 x K row-major (that is, B column-major).  C: 16 x 8 row-major.
extern "C" __global__ void __launch_bounds__(32) mma_f16_f32acc(const half* __restrict__ A,
                                                               const half* __restrict__ Bt,
                                                               float* __restrict__ C, int K)
{
    __shared__ __align__(16) half sA[16][16];
    __shared__ __align__(16) half sB[8][16];
    const int lane = threadIdx.x;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 16) {
        const int row = lane >> 1, col = (lane & 1) * 8;
        *reinterpret_cast<uint4*>(&sA[row][col]) = *reinterpret_cast<const uint4*>(&A[row * K + k0 + col]);
        if (lane < 16)
            *reinterpret_cast<uint4*>(&sB[row][col]) = *reinterpret_cast<const uint4*>(&Bt[row * K + k0 + col]);
        __syncwarp();
        uint32_t a[4], b[2];
        ldmatrix_x4(a, &sA[lane & 15][(lane >> 4) * 8]);
        ldmatrix_x2(b, &sB[lane & 7][((lane >> 3) & 1) * 8]);
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        __syncwarp();
    }
    const int r = lane >> 2, c = (lane & 3) * 2;
    *reinterpret_cast<float2*>(&C[r * 8 + c]) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(&C[(r + 8) * 8 + c]) = make_float2(acc[2], acc[3]);
}

// A: 16 x 16 row-major, B: 16 x 8 row-major, C (fp16) = alpha * A * B.
extern "C" __global__ void __launch_bounds__(32) mma_f16_f16acc(const half* __restrict__ A,
                                                               const half* __restrict__ B,
                                                               half* __restrict__ C, half alpha)
{
    __shared__ __align__(16) half sA[16][16];
    __shared__ __align__(16) half sB[16][8];
    const int lane = threadIdx.x;
    *reinterpret_cast<uint4*>(&sA[lane >> 1][(lane & 1) * 8]) = reinterpret_cast<const uint4*>(A)[lane];
    if (lane < 16)
        *reinterpret_cast<uint4*>(&sB[lane][0]) = reinterpret_cast<const uint4*>(B)[lane];
    __syncwarp();
    uint32_t a[4], b[2], d[2] = {0u, 0u};
    ldmatrix_x4(a, &sA[lane & 15][(lane >> 4) * 8]);
    ldmatrix_x2_trans(b, &sB[lane & 15][0]);
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 "
        "{%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\n"
        : "+r"(d[0]), "+r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    const half2 scale = __half2half2(alpha);
    half2 lo = __hmul2(*reinterpret_cast<half2*>(&d[0]), scale);
    half2 hi = __hmul2(*reinterpret_cast<half2*>(&d[1]), scale);
    const int r = lane >> 2, c = (lane & 3) * 2;
    *reinterpret_cast<half2*>(&C[r * 8 + c]) = lo;
    *reinterpret_cast<half2*>(&C[(r + 8) * 8 + c]) = hi;
}
