// update.cu: the fused optimizer step over every parameter at once, alone or with the next batch's gather (the graph
// engine's step; the epoch-end kernels every engine runs are in epoch.cu).
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

// Every kernel below is compiled, or with -DONLY_LISTED only those named -DKERNEL_<name>: an engine compiles the
// ones its precision launches (graph/kernels.py: fewer kernels, a shorter cold NVRTC compile).
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f16)
UPDATE(update_f32_f16, float, half_t)   // "mixed": fp32 master, fp16 gradients, fp16 copy written
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f32)
UPDATE(update_f32_f32, float, float)    // "fp32"
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f16_f16)
UPDATE(update_f16_f16, half_t, half_t)  // "fp16": fp16 weights, fp32 optimizer state
#endif

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

#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f16_gather_u8_f16)
UPDATE_GATHER(update_f32_f16_gather_u8_f16, float, half_t, u8, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f16_gather_f32_f16)
UPDATE_GATHER(update_f32_f16_gather_f32_f16, float, half_t, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f32_gather_u8_f32)
UPDATE_GATHER(update_f32_f32_gather_u8_f32, float, float, u8, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f32_f32_gather_f32_f32)
UPDATE_GATHER(update_f32_f32_gather_f32_f32, float, float, float, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f16_f16_gather_u8_f16)
UPDATE_GATHER(update_f16_f16_gather_u8_f16, half_t, half_t, u8, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_update_f16_f16_gather_f32_f16)
UPDATE_GATHER(update_f16_f16_gather_f32_f16, half_t, half_t, float, half_t)
#endif
