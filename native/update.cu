// update.cu: the fused optimizer step over every parameter at once, and the epoch-end bookkeeping.
// All parameters live in one flat buffer (each tensor padded to 128 elements), gradients and
// optimizer state in flat buffers of the same layout, so one elementwise launch updates them all.
// The learning rate is read at replay time from st->lr[epoch_in_fit * steps_per_epoch + step],
// so a schedule never forces a graph re-capture. The arithmetic is optim.cuh's, in fp32 whatever the
// storage type.
// Launch: a grid-stride loop over groups of 4 elements; any grid, block = UPDATE_THREADS.
#include "common.cuh"
#include "gather.cuh"
#include "optim.cuh"

// 4 elements per access: 16-byte fp32 / 8-byte fp16 loads (the flat layout pads every tensor to
// 128 elements, so n is a multiple of 4 and every pointer 256-byte aligned).
__device__ __forceinline__ void load4(const float* p, float v[4]) {
    float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void load4(const half_t* p, float v[4]) {
    uint2 t = *reinterpret_cast<const uint2*>(p);
    v[0] = to_f((half_t)(t.x & 0xffffu)); v[1] = to_f((half_t)(t.x >> 16));
    v[2] = to_f((half_t)(t.y & 0xffffu)); v[3] = to_f((half_t)(t.y >> 16));
}
__device__ __forceinline__ void store4(float* p, const float v[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(half_t* p, const float v[4]) {
    uint2 t;
    t.x = (u32)from_f<half_t>(v[0]) | ((u32)from_f<half_t>(v[1]) << 16);
    t.y = (u32)from_f<half_t>(v[2]) | ((u32)from_f<half_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(p) = t;
}

// Optimizer K on block `block` of `blocks`' share of the n elements, a grid-stride loop over groups of 4, at step
// t (counted from 1) and rate lr.
template <typename TP, typename TG> struct UpdateElements {
    template <int K>
    static __device__ __forceinline__ void run(TP* __restrict__ w, const TG* __restrict__ g, float* __restrict__ s1,
                                               float* __restrict__ s2, half_t* __restrict__ w16, u64 n, OptimParams p,
                                               float lr, u64 t, u32 block, u32 blocks) {
        const OptimStep s = optim_step<K>(p, lr, t);
        const int states = optim_states<K>(p);
        for (u64 i = 4 * (block * (u64)blockDim.x + threadIdx.x); i < n; i += 4 * (u64)blocks * blockDim.x) {
            float wi[4], gi[4], m[4], v[4];
            load4(w + i, wi);
            load4(g + i, gi);
            if (states >= 1) load4(s1 + i, m);
            if (states >= 2) load4(s2 + i, v);
#pragma unroll
            for (int e = 0; e < 4; ++e) optim_update<K>(p, s, states, gi[e], wi[e], m[e], v[e]);
            if (states >= 1) store4(s1 + i, m);
            if (states >= 2) store4(s2 + i, v);
            store4(w + i, wi);
            if (w16) store4(w16 + i, wi);
        }
    }
};

template <typename TP, typename TG>
__device__ void update(TP* __restrict__ w, const TG* __restrict__ g, float* __restrict__ s1, float* __restrict__ s2,
                       half_t* __restrict__ w16, u64 n, const EpochState* __restrict__ st, int step,
                       int steps_per_epoch, OptimParams p, u32 block, u32 blocks) {
    const u64 k = (u64)st->epoch_in_fit * steps_per_epoch + step;
    const u64 t = st->step0 + k + 1;  // Adam counts steps from 1
    optim_dispatch<UpdateElements<TP, TG>>(p.kind, w, g, s1, s2, w16, n, p, st->lr[k], t, block, blocks);
}

#define UPDATE(name, TP, TG)                                                                                  \
    extern "C" __global__ void name(TP* w, const TG* g, float* s1, float* s2, half_t* w16, u64 n,             \
                                    const EpochState* st, int step, int spe, OptimParams opt) {               \
        update<TP, TG>(w, g, s1, s2, w16, n, st, step, spe, opt, blockIdx.x, gridDim.x);                      \
    }

UPDATE(update_f32_f16, float, half_t)   // "mixed": fp32 master, fp16 gradients, fp16 copy written
UPDATE(update_f32_f32, float, float)    // "fp32"
UPDATE(update_f16_f16, half_t, half_t)  // "fp16": fp16 weights, fp32 optimizer state

// The update of step s fused with the gather of step s+1's batch (they touch disjoint memory: the batch
// buffers were last read by step s's GEMMs, which precede this kernel): one node fewer per step, about
// 3 us on an H200. Blocks [0, rows) gather one row each (gather.cuh); the rest run the update.
// Launch: grid = rows + update blocks, block = UPDATE_THREADS (= GATHER_THREADS).
#define UPDATE_GATHER(name, TP, TG, TIn, TOut)                                                                 \
    extern "C" __global__ void name(TP* w, const TG* g, float* s1, float* s2, half_t* w16, u64 n,              \
                                    const EpochState* st, int step, int spe, OptimParams opt, const TIn* x,    \
                                    const u32* y, int yw, int d, u32 n_data, u32 seed_lo, u32 seed_hi,         \
                                    u32 half_bits, int pos0, int rows, float scale, float shift,               \
                                    const float* fscale, const float* fshift, TOut* out, u32* out_y) {         \
        if ((int)blockIdx.x < rows) {                                                                          \
            gather_row<TIn, TOut>(x, y, yw, d, n_data, seed_lo, seed_hi, half_bits, st, pos0, scale, shift,    \
                                  fscale, fshift, out, out_y, blockIdx.x);                                     \
        } else {                                                                                               \
            update<TP, TG>(w, g, s1, s2, w16, n, st, step, spe, opt, blockIdx.x - rows, gridDim.x - rows);     \
        }                                                                                                      \
    }

UPDATE_GATHER(update_f32_f16_gather_u8_f16, float, half_t, u8, half_t)
UPDATE_GATHER(update_f32_f16_gather_f32_f16, float, half_t, float, half_t)
UPDATE_GATHER(update_f32_f32_gather_u8_f32, float, float, u8, float)
UPDATE_GATHER(update_f32_f32_gather_f32_f32, float, float, float, float)
UPDATE_GATHER(update_f16_f16_gather_u8_f16, half_t, half_t, u8, half_t)
UPDATE_GATHER(update_f16_f16_gather_f32_f16, half_t, half_t, float, half_t)

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
