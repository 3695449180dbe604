// Warp-shuffle reductions: a per-warp sum with __shfl_xor_sync, a block reduction through shared
// memory, a templated max-reduction (mangled names), and ballot/popc/redux.sync.
// corpus-ptx: reduce_shfl -arch=sm_90
#include <cstdint>

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        T other = __shfl_down_sync(0xffffffffu, v, offset);
        v = other > v ? other : v;
    }
    return __shfl_sync(0xffffffffu, v, 0);  // broadcast lane 0
}

extern "C" __global__ void warp_reduce_sum(const float* __restrict__ in, float* __restrict__ out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? in[i] : 0.0f;
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(out, v);
}

extern "C" __global__ void block_reduce_sum(const float* __restrict__ in, float* __restrict__ out, int n)
{
    __shared__ float partial[32];
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc += in[i];
    acc = warp_sum(acc);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0)
        partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        acc = lane < warps ? partial[lane] : 0.0f;
        acc = warp_sum(acc);
        if (lane == 0)
            out[blockIdx.x] = acc;
    }
}

template <typename T>
__global__ void block_reduce_max(const T* __restrict__ in, T* __restrict__ out, int n, T identity)
{
    __shared__ T partial[32];
    T acc = identity;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc = in[i] > acc ? in[i] : acc;
    acc = warp_max(acc);
    if ((threadIdx.x & 31) == 0)
        partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : identity;
        acc = warp_max(acc);
        if (threadIdx.x == 0)
            out[blockIdx.x] = acc;
    }
}

template __global__ void block_reduce_max<int>(const int*, int*, int, int);
template __global__ void block_reduce_max<double>(const double*, double*, int, double);

// Count positive values per warp with a ballot, and sum small integers with redux.sync.
extern "C" __global__ void warp_vote(const int* __restrict__ in, unsigned* __restrict__ counts,
                                     unsigned* __restrict__ sums, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    unsigned mask = __ballot_sync(0xffffffffu, v > 0);
    unsigned total = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(v & 0xff));
    if ((threadIdx.x & 31) == 0) {
        counts[i >> 5] = __popc(mask);
        sums[i >> 5] = total;
    }
}
