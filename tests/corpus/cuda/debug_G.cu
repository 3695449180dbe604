// A small kernel compiled with -G (device debug): the PTX carries .section .debug_* blocks,
// .loc lines with inlined_at, and $L__ labels.
// corpus-ptx: debug_G -arch=sm_90 -G
__device__ float clamp01(float v) { return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); }

extern "C" __global__ void saxpy_clamped(float a, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = clamp01(a * x[i] + y[i]);
}
