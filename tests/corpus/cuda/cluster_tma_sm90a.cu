// Hopper asynchronous machinery as nvcc writes it, for sm_90a: thread-block clusters
// (__cluster_dims__, cluster.sync, distributed shared memory through mapa), mbarriers from
// cuda::barrier and inline PTX (init, expect_tx, try_wait.parity loops), a TMA tensor load and
// a bulk copy into shared memory, fence.proxy.async, elect.sync, griddepcontrol, setmaxnreg and
// a stmatrix. Inline PTX blocks come out inside { } scopes with their own .reg declarations.
// corpus-ptx: cluster_tma_sm90a -arch=sm_90a
#include <cooperative_groups.h>
#include <cuda/barrier>
#include <cstdint>

namespace cg = cooperative_groups;
// cuda::barrier in __shared__ is the documented idiom; its initialisation is the init() below.
#pragma nv_diag_suppress static_var_with_dynamic_init

__device__ __forceinline__ uint32_t smem_u32(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_sum(const float* in, float* out)
{
    __shared__ float buf[128];
    cg::cluster_group cluster = cg::this_cluster();
    unsigned rank = cluster.block_rank();
    buf[threadIdx.x] = in[blockIdx.x * 128 + threadIdx.x];
    cluster.sync();
    float* other = cluster.map_shared_rank(buf, rank ^ 1);
    float v = buf[threadIdx.x] + other[threadIdx.x];
    cluster.sync();
    if (threadIdx.x == 0)
        out[blockIdx.x] = v + (float)cluster.num_blocks() + (float)cluster.dim_blocks().x;
}

extern "C" __global__ void __launch_bounds__(128) tma_load(const uint64_t tmap_addr, float* out, const float* src)
{
    __shared__ alignas(128) float tile[32 * 32];
    __shared__ alignas(8) uint64_t bar;
    __shared__ alignas(16) float bulk[256];
    const uint32_t b = smem_u32(&bar);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    uint32_t leader;
    asm volatile("{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(leader));
    if (threadIdx.x < 32 && leader) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(4096 + 1024));
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(smem_u32(tile)), "l"(tmap_addr), "r"(0), "r"((int)blockIdx.x * 32), "r"(b) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 1024, [%2];"
                     :: "r"(smem_u32(bulk)), "l"(src), "r"(b) : "memory");
    }
    __syncthreads();
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n\t}" :: "r"(b), "r"(0) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    out[blockIdx.x * 1024 + threadIdx.x] = tile[threadIdx.x] + bulk[threadIdx.x & 255];
    uint32_t packed = __float_as_uint(tile[threadIdx.x * 2]);
    asm volatile("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};"
                 :: "r"(smem_u32(&tile[(threadIdx.x & 7) * 8])), "r"(packed));
    asm volatile("griddepcontrol.launch_dependents;");
}

extern "C" __global__ void barrier_pipeline(float* data, int n)
{
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    __shared__ float stage[256];
    if (threadIdx.x == 0)
        init(&bar, blockDim.x);
    __syncthreads();
    for (int k = 0; k < n; ++k) {
        stage[threadIdx.x] = data[k * 256 + threadIdx.x];
        bar.arrive_and_wait();
        data[k * 256 + threadIdx.x] = stage[255 - threadIdx.x] * 2.0f;
        bar.arrive_and_wait();
    }
}
