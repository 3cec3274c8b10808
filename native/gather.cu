// gather.cu: build one batch from the dataset resident on the GPU (gather.cuh says how). The training
// graph gathers its first batch here and every later one inside the previous step's update kernel
// (update.cu); evaluation gathers every chunk here.
// Launch: grid = (rows), block = (GATHER_THREADS): one block per batch row.
#include "gather.cuh"

#define GATHER(name, TIn, TOut)                                                                              \
    extern "C" __global__ void name(const TIn* x, const u32* y, int yw, int d, u32 n, u32 seed_lo,          \
                                    u32 seed_hi, u32 half_bits, const EpochState* st, int pos0, float scale, \
                                    float shift, const float* fscale, const float* fshift, TOut* out,        \
                                    u32* out_y) {                                                            \
        gather_row<TIn, TOut>(x, y, yw, d, n, seed_lo, seed_hi, half_bits, st, pos0, scale, shift, fscale,   \
                              fshift, out, out_y, blockIdx.x);                                               \
    }

// Every kernel below is compiled, or with -DONLY_LISTED only those named -DKERNEL_<name>: an engine compiles the
// ones its precision launches (graph/kernels.py: fewer kernels, a shorter cold NVRTC compile).
#if !defined(ONLY_LISTED) || defined(KERNEL_gather_u8_f16)
GATHER(gather_u8_f16, u8, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_gather_u8_f32)
GATHER(gather_u8_f32, u8, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_gather_f32_f16)
GATHER(gather_f32_f16, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_gather_f32_f32)
GATHER(gather_f32_f32, float, float)
#endif
