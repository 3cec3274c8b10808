// common.cuh: types and helpers shared by every fastnn kernel: fp16 as raw bits, the device-resident epoch
// state, warp reductions and the NaN-aware argmax.
// NVRTC compiles these without the CUDA toolkit's headers, so fp16 is carried as its raw bits
// (unsigned short) and converted with the PTX cvt instructions: no cuda_fp16.h needed.
#pragma once

typedef unsigned char u8;
typedef unsigned short half_t;  // IEEE fp16 bits
typedef unsigned int u32;
typedef unsigned long long u64;

// Device-resident training state, written by the host before a fit and advanced by the
// advance kernel at the end of every replayed epoch graph. The lr table and the history live behind
// pointers held here, so a longer fit can grow them without re-capturing the graph.
struct EpochState {
    u32 epoch;         // absolute epoch index: keys the sample order
    u32 epoch_in_fit;  // epoch index within this fit call: indexes the lr table and history slots
    u64 step0;         // global step count at the start of this fit (AdamW bias correction)
    u32 diverged;      // sticky: set once an epoch's loss or the state it left is not finite; stops snapshots
    u32 bad_state;     // sticky: set by check_state when an epoch left a non-finite training state
    const float* lr;   // lr[epoch_in_fit * steps_per_epoch + step]: this fit's rate of every step
    double* hist;      // hist[2 * epoch_in_fit + {0, 1}]: the epoch's loss sum and correct count
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float to_f(u8 x) { return (float)x; }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ half_t from_f<half_t>(float x) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ bool is_finite_d(double x) { return x - x == 0.0; }

// ---- warp reductions (all 32 lanes take part) ---------------------------------------------------------------
// A butterfly: every lane ends with the same bits, those of a shfl_down tree's lane 0 (at each step, lane j < o
// adds lane j + o either way).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- argmax as numpy.argmax: the first maximum wins, and the first NaN wins over any number -----------------
// Scanning in index order: does z, at a later index, replace the running maximum zmax?
__device__ __forceinline__ bool argmax_takes(float z, float zmax) { return z > zmax || (z != z && zmax == zmax); }

// Across a warp: each lane holds the (max, index) of its own indices; every lane ends with the warp's, ties and
// NaNs going to the lowest index. A lane with no indices holds (-inf, INT_MAX).
__device__ __forceinline__ void warp_argmax(float& zmax, int& best) {
    for (int o = 16; o > 0; o >>= 1) {
        const float oz = __shfl_xor_sync(0xffffffffu, zmax, o);
        const int ob = __shfl_xor_sync(0xffffffffu, best, o);
        const bool take = argmax_takes(oz, zmax) || ((oz == zmax || (oz != oz && zmax != zmax)) && ob < best);
        if (take) {
            zmax = oz;
            best = ob;
        }
    }
}
