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

// gather_weights: a weighted fit's batch row weights (Trainer.fit(sample_weight=...)), launched only by a weighted
// fit, beside the batch's labels: out_w[j] = w[the sample of batch row j], the same order (shuffle.cuh's
// permuted_index of pos0 + j, the epoch read at replay) as gather_row's. The gathers above are untouched.
// Launch: grid-stride over the rows (any grid, any block).
#if !defined(ONLY_LISTED) || defined(KERNEL_gather_weights)
extern "C" __global__ void gather_weights(const float* __restrict__ w, u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits,
                                          const EpochState* __restrict__ st, int pos0, int rows,
                                          float* __restrict__ out_w) {
    u32 keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, st ? st->epoch : 0u, keys);
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < rows; j += gridDim.x * blockDim.x) {
        const u32 pos = (u32)(pos0 + j);
        out_w[j] = w[st ? permuted_index(keys, half_bits, n, pos) : pos];
    }
}
#endif
