// Device-function calls: __noinline__ functions become .func with call.uni; a struct returned by
// value (.param .align .b8 func_retval0[]), a recursive function (a stack frame), an indirect
// call through a function-pointer table (.callprototype), and printf (.extern .func vprintf and
// $str string constants).
// corpus-ptx: device_call -arch=sm_90
// corpus-ptx: device_call_G -arch=sm_90 -G
#include <cstdio>

struct Pair {
    float x;
    float y;
};

__device__ __noinline__ float horner(float x, float a, float b, float c)
{
    return fmaf(fmaf(a, x, b), x, c);
}

__device__ __noinline__ Pair rotate(Pair p, float cs, float sn)
{
    Pair r;
    r.x = cs * p.x - sn * p.y;
    r.y = sn * p.x + cs * p.y;
    return r;
}

__device__ __noinline__ void bump(int* counter, int by) { atomicAdd(counter, by); }

__device__ __noinline__ unsigned collatz_steps(unsigned long long n, unsigned depth)
{
    if (n <= 1 || depth > 64)
        return depth;
    return collatz_steps((n & 1) ? 3 * n + 1 : n / 2, depth + 1);
}

typedef int (*BinOp)(int, int);
__device__ __noinline__ int op_add(int a, int b) { return a + b; }
__device__ __noinline__ int op_sub(int a, int b) { return a - b; }
__device__ __noinline__ int op_mul(int a, int b) { return a * b; }
__device__ BinOp op_table[3] = {op_add, op_sub, op_mul};

extern "C" __global__ void call_kernel(const float* __restrict__ x, Pair* __restrict__ out, int* counter,
                                       unsigned* steps, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float h = horner(x[i], 0.5f, -1.25f, 3.0f);
    Pair p = {h, x[i]};
    out[i] = rotate(p, 0.8f, 0.6f);
    steps[i] = collatz_steps(static_cast<unsigned long long>(i) + 7, 0);
    if (h < 0.0f)
        bump(counter, 1);
}

extern "C" __global__ void indirect_call(const int* __restrict__ a, const int* __restrict__ b,
                                         const int* __restrict__ which, int* __restrict__ out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = op_table[which[i] % 3](a[i], b[i]);
}

extern "C" __global__ void hello(int tag, double value)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        printf("tag %d: value %f, block %u\n", tag, value, blockDim.x);
}
