// update.cu: the fused optimizer step over every parameter at once, and the epoch-end bookkeeping.
// All parameters live in one flat buffer (each tensor padded to 128 elements), gradients and
// optimizer state in flat buffers of the same layout, so one elementwise launch updates them all.
// The learning rate is read at replay time from lr_table[epoch_in_fit * steps_per_epoch + step],
// so a schedule never forces a graph re-capture. Arithmetic is fastnn/optim.py's (PyTorch's SGD
// with dampening 0 and AdamW), in fp32 whatever the storage type.
// Launch: a grid-stride loop; any grid, block = UPDATE_THREADS.
#include "common.cuh"

template <typename TP, typename TG>
__device__ void update(TP* __restrict__ w, const TG* __restrict__ g, float* __restrict__ s1, float* __restrict__ s2,
                       half_t* __restrict__ w16, u64 n, const float* __restrict__ lr_table,
                       const EpochState* __restrict__ st, int step, int steps_per_epoch, int adamw,
                       float momentum, float wd, int nesterov, float b1, float b2, float eps) {
    const u64 k = (u64)st->epoch_in_fit * steps_per_epoch + step;
    const float lr = lr_table[k];
    float c1 = 1.f, c2 = 1.f;
    if (adamw) {
        const float t = (float)(st->step0 + k + 1);  // Adam counts steps from 1
        c1 = 1.f - powf(b1, t);
        c2 = 1.f - powf(b2, t);
    }
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float wi = to_f(w[i]);
        float gi = to_f(g[i]);
        if (adamw) {
            wi *= 1.f - lr * wd;
            float m = b1 * s1[i] + (1.f - b1) * gi;
            float v = b2 * s2[i] + (1.f - b2) * gi * gi;
            s1[i] = m;
            s2[i] = v;
            wi -= (lr / c1) * m / (sqrtf(v / c2) + eps);
        } else {
            if (wd != 0.f) gi += wd * wi;
            if (momentum != 0.f) {
                float b = momentum * s1[i] + gi;
                s1[i] = b;
                gi = nesterov ? gi + momentum * b : b;
            }
            wi -= lr * gi;
        }
        w[i] = from_f<TP>(wi);
        if (w16) w16[i] = from_f<half_t>(wi);
    }
}

#define UPDATE(name, TP, TG)                                                                                 \
    extern "C" __global__ void name(TP* w, const TG* g, float* s1, float* s2, half_t* w16, u64 n,            \
                                    const float* lr_table, const EpochState* st, int step, int spe, int adamw, \
                                    float momentum, float wd, int nesterov, float b1, float b2, float eps) { \
        update<TP, TG>(w, g, s1, s2, w16, n, lr_table, st, step, spe, adamw, momentum, wd, nesterov, b1, b2, \
                       eps);                                                                                 \
    }

UPDATE(update_f32_f16, float, half_t)   // "mixed": fp32 master, fp16 gradients, fp16 copy written
UPDATE(update_f32_f32, float, float)    // "fp32"
UPDATE(update_f16_f16, half_t, half_t)  // "fp16": fp16 weights, fp32 optimizer state

// fp16 copy of fp32 master weights (after an upload or a restore).
extern "C" __global__ void cast_f32_f16(const float* src, half_t* dst, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = from_f<half_t>(src[i]);
}

// End of an epoch, part 1: while no epoch has diverged and this epoch's loss is finite, copy the
// training state (parameters and optimizer state, 4-byte words) to the snapshot: the weights a
// divergence falls back to. Launch: any grid-stride grid.
extern "C" __global__ void snapshot(const u32* src, u32* dst, u64 words, const double* acc, const EpochState* st) {
    if (st->diverged || !is_finite_d(acc[2 * st->epoch_in_fit])) return;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// End of an epoch, part 2 (after part 1 completes): mark divergence and advance the epoch counters.
// Launch: grid = 1, block = 1.
extern "C" __global__ void advance(EpochState* st, const double* acc) {
    if (!is_finite_d(acc[2 * st->epoch_in_fit])) st->diverged = 1u;
    st->epoch += 1u;
    st->epoch_in_fit += 1u;
}
