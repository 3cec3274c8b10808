// epoch.cu: the small kernels every GPU engine runs around its epochs, whatever trains them (the graph step or a
// persistent epoch kernel): the fp16 copy of fp32 master weights (cast_f32_f16), the epoch-end check of the training
// state (check_state), its snapshot while the loss and state stay finite (snapshot), a data-parallel run's history
// staging for the all-reduce (history_stage) and the epoch counters' advance (advance). Kept apart from update.cu
// (the optimizer step, with its gather) so that an engine that never records the graph step does not compile it:
// this file compiles in a fraction of update.cu's time on a cold kernel cache.
// Launch: cast_f32_f16, check_state and snapshot: any grid-stride grid (the engine uses UPDATE_THREADS-wide
// blocks); history_stage and advance: grid = 1, block = 1.
#include "common.cuh"

// fp16 copy of fp32 master weights (after an upload or a restore).
extern "C" __global__ void cast_f32_f16(const float* src, half_t* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = from_f<half_t>(src[i]);
}

// End of an epoch, part 0: is the training state the epoch's last update left finite? The loss is
// measured before each update, so it cannot tell. Scans n32 words of fp32 values at f32 and n16 words
// of fp16 pairs at f16 (exponent bits all ones: inf or NaN; the zero padding between tensors passes) and
// sets st->bad_state if any is not finite. The host passes the parameters in their storage type, the
// optimizer state as fp32, and for "mixed" the fp16 copy that feeds the GEMMs (fp32 weights beyond 65504
// make it inf). Launch: any grid-stride grid; every thread of a block reaches the block-wide OR.
extern "C" __global__ void check_state(const u32* f32, u64 n32, const u32* f16, u64 n16, EpochState* st) {
    if (st->diverged) return;  // uniform: nothing in this kernel writes it
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    int bad = 0;
    for (u64 i = first; i < n32; i += stride) bad |= (f32[i] & 0x7f800000u) == 0x7f800000u;
    for (u64 i = first; i < n16; i += stride) {
        const u32 w = f16[i];
        bad |= ((w & 0x7c00u) == 0x7c00u) | ((w & 0x7c000000u) == 0x7c000000u);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) st->bad_state = 1u;  // every writer writes 1
}

// End of an epoch, part 1 (after part 0 completes): while no epoch has diverged and this epoch's loss
// and resulting state are finite, copy the training state (parameters and optimizer state, 4-byte
// words) to the snapshot: the weights a divergence falls back to. Launch: any grid-stride grid.
extern "C" __global__ void snapshot(const u32* src, u32* dst, u64 words, const EpochState* st) {
    if (st->diverged || st->bad_state || !is_finite_d(st->hist[2 * st->epoch_in_fit])) return;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// Data-parallel runs, before the epoch-end nodes: the epoch's history slot (loss sum, correct count) to a
// fixed scratch pair (to_scratch = 1) that an NCCL all-reduce sums over the ranks, then back (to_scratch = 0).
// The slot moves every epoch and a captured all-reduce has fixed pointers, hence the scratch.
// Launch: grid = 1, block = 1.
extern "C" __global__ void history_stage(EpochState* st, double* scratch, int to_scratch) {
    double* slot = st->hist + 2 * st->epoch_in_fit;
    for (int i = 0; i < 2; ++i) {
        if (to_scratch) scratch[i] = slot[i];
        else slot[i] = scratch[i];
    }
}

// End of an epoch, part 2 (after part 1 completes): mark divergence (of the loss or of the state) and
// advance the epoch counters. Launch: grid = 1, block = 1.
extern "C" __global__ void advance(EpochState* st) {
    if (!is_finite_d(st->hist[2 * st->epoch_in_fit]) || st->bad_state) st->diverged = 1u;
    st->epoch += 1u;
    st->epoch_in_fit += 1u;
}
