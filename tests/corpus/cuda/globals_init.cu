// Module-scope data with initialisers: __constant__ and __device__ (.global) arrays of several
// types, a struct, a pointer initialised with another global's address (generic()), an
// uninitialised counter, a static (file-local) table, and dynamic (extern) shared memory.
// corpus-ptx: globals_init -arch=sm_90
#include <cstdint>

struct Params {
    int rows;
    int cols;
    float scale;
    double bias;
};

__constant__ float c_coeffs[8] = {1.0f, -0.5f, 0.25f, -0.125f, 3.14159265f, 2.71828f, 1.0e-20f, -0.0f};
__constant__ double c_weights[4] = {0.1, 1.0 / 3.0, 1.0e300, -2.5e-310};
__constant__ int8_t c_bytes[6] = {-1, 2, -3, 4, 127, -128};
__constant__ Params c_params = {64, 32, 0.5f, -1.0};
__constant__ unsigned c_lookup[64];

__device__ int g_table[16] = {0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610};
__device__ unsigned long long g_masks[3] = {0xFFFFFFFFFFFFFFFFull, 0x8000000000000000ull, 0x5555555555555555ull};
__device__ int* g_table_ptr = g_table;
__device__ unsigned int g_counter;
static __device__ short s_small[5] = {1, -2, 3, -4, 5};

extern "C" __global__ void use_globals(float* __restrict__ out, double* __restrict__ dout, int n)
{
    extern __shared__ __align__(16) float dyn[];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    dyn[threadIdx.x] = c_coeffs[threadIdx.x & 7] * c_params.scale + static_cast<float>(c_bytes[threadIdx.x % 6]);
    __syncthreads();
    if (i < n) {
        float acc = dyn[(threadIdx.x + 1) % blockDim.x];
        acc += static_cast<float>(g_table_ptr[i & 15] + s_small[i % 5]) + static_cast<float>(c_lookup[i & 63]);
        out[i] = acc;
        dout[i] = c_weights[i & 3] * static_cast<double>(acc) + c_params.bias;
        if ((g_masks[i % 3] >> (i & 63)) & 1ull)
            atomicInc(&g_counter, 1000u);
    }
}
