// Hopper (sm_90a) warpgroup MMA through inline asm: wgmma.fence, one
// wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 with shared-memory matrix descriptors,
// commit_group and wait_group; plus a cluster kernel with mbarrier waits, elect.sync and
// setmaxnreg. It only has to compile: the descriptors describe a plausible layout, nothing more.
// corpus-ptx: wgmma_sm90a -arch=sm_90a
#include <cuda_fp16.h>
#include <cstdint>

__device__ __forceinline__ uint64_t smem_desc(const void* smem, uint32_t lead_bytes, uint32_t stride_bytes)
{
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    uint64_t desc = 0;
    desc |= static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);
    desc |= static_cast<uint64_t>((lead_bytes & 0x3FFFFu) >> 4) << 16;
    desc |= static_cast<uint64_t>((stride_bytes & 0x3FFFFu) >> 4) << 32;
    desc |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
    return desc;
}

// One warpgroup (128 threads): D[64x64] (+)= A[64x16] * B[16x64], both operands from shared memory.
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_m64n64k16(const half* __restrict__ A,
                                                                    const half* __restrict__ B,
                                                                    float* __restrict__ D, int accumulate)
{
    __shared__ __align__(1024) half sA[64 * 16];
    __shared__ __align__(1024) half sB[64 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += 128) {
        sA[i] = A[i];
        sB[i] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
        d[i] = accumulate ? D[threadIdx.x * 32 + i] : 0.0f;
    const uint64_t desc_a = smem_desc(sA, 16, 1024);
    const uint64_t desc_b = smem_desc(sB, 16, 1024);

    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
          "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

#pragma unroll
    for (int i = 0; i < 32; ++i)
        D[threadIdx.x * 32 + i] = d[i];
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
                 "r"(count));
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar)
{
    asm volatile("{\n"
                 ".reg .b64 state;\n"
                 "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
                 "}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_AGAIN:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_AGAIN;\n"
                 "}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
                 "r"(phase)
                 : "memory");
}

// A producer/consumer warp-specialised skeleton in a 2-CTA cluster.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256, 1)
    cluster_mbarrier(const float* __restrict__ in, float* __restrict__ out)
{
    __shared__ uint64_t full_bar;
    __shared__ float stage[128];
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    if (threadIdx.x == 0)
        mbar_init(&full_bar, 128);
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        uint32_t leader;
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "elect.sync _|p, 0xffffffff;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(leader));
        stage[threadIdx.x] = in[(blockIdx.x * 128 + threadIdx.x)] * (leader ? 1.0f : 1.0f);
        mbar_arrive(&full_bar);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        mbar_wait(&full_bar, 0);
        const int t = threadIdx.x - 128;
        out[blockIdx.x * 128 + t] = stage[127 - t] + static_cast<float>(rank);
    }
}
