// Tiled copies through shared memory with cp.async: once with inline asm (cp.async.ca / .cg with
// a zero-fill source size, commit_group, wait_group) in a double-buffered loop, once with the
// <cuda_pipeline.h> primitives.
// corpus-ptx: cp_async_copy -arch=sm_90
#include <cuda_pipeline.h>
#include <cstdint>

constexpr int kTile = 128;  // float4 per tile == threads per block

__device__ __forceinline__ uint32_t smem_addr(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_ca16(void* smem, const void* gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}

// Copies `bytes` (0..16) and zero-fills the rest of the 16-byte chunk.
__device__ __forceinline__ void cp_async_cg16_zfill(void* smem, const void* gmem, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

extern "C" __global__ void __launch_bounds__(kTile) tiled_copy_async(const float4* __restrict__ in,
                                                                     float4* __restrict__ out, int tiles)
{
    __shared__ float4 buf[2][kTile];
    const int t = threadIdx.x;
    int tile = blockIdx.x;
    int stage = 0;
    if (tile < tiles)
        cp_async_ca16(&buf[0][t], &in[tile * kTile + t]);
    cp_async_commit();
    for (; tile < tiles; tile += gridDim.x) {
        const int next = tile + gridDim.x;
        if (next < tiles)
            cp_async_ca16(&buf[stage ^ 1][t], &in[next * kTile + t]);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        // Read a neighbour's element so the barrier matters; rotate the tile by one.
        out[tile * kTile + t] = buf[stage][(t + 1) % kTile];
        __syncthreads();
        stage ^= 1;
    }
    cp_async_wait<0>();
}

extern "C" __global__ void tail_copy_zfill(const float* __restrict__ in, float* __restrict__ out, int n)
{
    __shared__ __align__(16) float tile[4 * 64];
    const int base = blockIdx.x * 256 + threadIdx.x * 4;
    int remain = n - base;
    int bytes = remain >= 4 ? 16 : (remain > 0 ? remain * 4 : 0);
    const float* src = remain > 0 ? in + base : in;
    cp_async_cg16_zfill(&tile[threadIdx.x * 4], src, bytes);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s = tile[threadIdx.x * 4] + tile[threadIdx.x * 4 + 1] + tile[threadIdx.x * 4 + 2] + tile[threadIdx.x * 4 + 3];
    if (remain > 0)
        out[base / 4] = s;
}

extern "C" __global__ void tiled_copy_pipeline(const float* __restrict__ in, float* __restrict__ out, int n)
{
    __shared__ __align__(16) float tile[2][256];
    const int base = blockIdx.x * 512;
    for (int s = 0; s < 2; ++s) {
        const int i = base + s * 256 + threadIdx.x;
        if (i < n)
            __pipeline_memcpy_async(&tile[s][threadIdx.x], &in[i], sizeof(float));
        __pipeline_commit();
    }
    __pipeline_wait_prior(1);
    __syncthreads();
    if (base + threadIdx.x < n)
        out[base + threadIdx.x] = 2.0f * tile[0][255 - threadIdx.x];
    __pipeline_wait_prior(0);
    __syncthreads();
    if (base + 256 + threadIdx.x < n)
        out[base + 256 + threadIdx.x] = -tile[1][255 - threadIdx.x];
}
