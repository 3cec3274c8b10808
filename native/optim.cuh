// optim.cuh: the one description of each optimizer on the GPU: its parameters as every kernel takes them
// (OptimParams, one kernel argument) and its update of one element in fp32. update.cu (the graph engine's update
// over the flat buffers) and fused.cu (the fused engine's update on chip) both call optim_update. The arithmetic
// is fastnn/_optim.py's (PyTorch's SGD with dampening 0, and AdamW) in the same order, so every engine agrees with
// the NumPy engine to rounding, and the graph and fused engines round an update of the same numbers alike. A bias is
// updated with optim_bias(p): its own decay, bias_decay.
//
// Adding an optimizer touches three places, and no kernel or engine:
//   - fastnn/_optim.py: the class (its checks, state_names, NumPy step and kernel_params) and its KIND_ number;
//   - this header: the same OPTIM_ number, any new OptimParams field (also in _optim.py's KernelParams, same
//     order and type), its cases in optim_dispatch, optim_step and optim_update;
//   - the NumPy engine's step (fastnn/engine/numpy_engine.py), which calls the class's NumPy step.
#pragma once
#include "common.cuh"

// Optimizer kinds: fastnn/_optim.py's KIND_SGD, KIND_ADAMW (tests/test_optim_kernel.py checks they agree).
#define OPTIM_SGD 0
#define OPTIM_ADAMW 1

// Everything a kernel knows of the optimizer but the step's learning rate, passed by value as one kernel argument.
// fastnn/_optim.py's KernelParams has the same fields in the same order and C types (int, float); a CPU test compiles
// this header with static_asserts of the size and of every field's position and type against the ctypes struct the
// host passes (tests/test_optim_kernel.py). Fields an optimizer does not use are zero.
struct OptimParams {
    int kind;            // OPTIM_*
    float momentum;      // SGD
    float weight_decay;  // SGD: added to the gradient (L2); AdamW: decoupled, applied to the weight
    int nesterov;        // SGD: 0 or 1
    float beta1;         // AdamW
    float beta2;         // AdamW
    float eps;           // AdamW
    float bias_decay;    // the weight_decay of the biases (= weight_decay unless the optimizer says otherwise)
};

// The optimizer as it updates a bias: weight_decay replaced by bias_decay (fastnn/_optim.py's bias_decay; fastnn.sklearn
// sets it to 0, as scikit-learn penalises weights only). Every kernel's update of a bias passes optim_bias(p) where it
// passes p for a weight: the one place where a bias differs from a weight.
__device__ __forceinline__ OptimParams optim_bias(OptimParams p) {
    p.weight_decay = p.bias_decay;
    return p;
}

// What changes from step to step: the learning rate, and AdamW's bias corrections 1 - beta^t.
struct OptimStep {
    float lr, c1, c2;
};

// F::run<kind>(a...) for the kind given at run time: the caller's loop (a static member template of F) compiled once
// per optimizer, so its per-element code has no branch on the kind. An unknown kind traps (the host packs only the
// kinds above).
template <typename F, typename... A> __device__ __forceinline__ void optim_dispatch(int kind, A... a) {
    if (kind == OPTIM_ADAMW) F::template run<OPTIM_ADAMW>(a...);
    else if (kind == OPTIM_SGD) F::template run<OPTIM_SGD>(a...);
    else __trap();
}

// The optimizer state arrays read and written (fastnn/_optim.py's state_names): s1 = SGD's momentum buffer when
// momentum is nonzero, or AdamW's exp_avg; s2 = AdamW's exp_avg_sq.
template <int K> __device__ __forceinline__ int optim_states(const OptimParams& p) {
    if (K == OPTIM_ADAMW) return 2;
    return p.momentum != 0.f ? 1 : 0;
}

// Step t's constants (t counts every step of the training from 1, as Adam's bias correction does), at rate lr.
template <int K> __device__ __forceinline__ OptimStep optim_step(const OptimParams& p, float lr, u64 t) {
    OptimStep s;
    s.lr = lr;
    s.c1 = 1.f;
    s.c2 = 1.f;
    if (K == OPTIM_ADAMW) {
        const float tf = (float)t;
        s.c1 = __fsub_rn(1.f, powf(p.beta1, tf));
        s.c2 = __fsub_rn(1.f, powf(p.beta2, tf));
    }
    return s;
}

// One element: weight w and its gradient g; s1, s2 are read and written only where `states` (optim_states, or the
// caller's compile-time count) says the optimizer keeps them.
// Every rounding is spelled out (__fmaf_rn, __fmul_rn: never contracted or split): whether the compiler fuses
// a * b + c into one fma, and which product of a * b + c * d, depends on the code around it (ptxas fuses a
// multiply and an add only within one basic block, and a division's slow path splits blocks). These are the
// roundings update.cu's compiled code had before this header: products fused where they fed an add, AdamW's
// b1 m and b2 v fused with (1 - b) g and (1 - b) g g rounded first.
template <int K>
__device__ __forceinline__ void optim_update(const OptimParams& p, const OptimStep& s, int states, float g, float& w,
                                             float& s1, float& s2) {
    if (K == OPTIM_ADAMW) {
        const float decay = __fmaf_rn(-s.lr, p.weight_decay, 1.f);                   // 1 - lr wd
        s1 = __fmaf_rn(p.beta1, s1, __fmul_rn(1.f - p.beta1, g));                   // b1 m + (1 - b1) g
        s2 = __fmaf_rn(p.beta2, s2, __fmul_rn(__fmul_rn(1.f - p.beta2, g), g));    // b2 v + (1 - b2) g g
        const float step = __fmul_rn(s.lr / s.c1, s1) / (sqrtf(s2 / s.c2) + p.eps);  // lr m^ / (sqrt(v^) + eps)
        w = __fmaf_rn(w, decay, -step);                                              // w (1 - lr wd) - step
    } else {
        if (p.weight_decay != 0.f) g = __fmaf_rn(p.weight_decay, w, g);  // g + wd w
        if (states >= 1) {
            s1 = __fmaf_rn(p.momentum, s1, g);                          // momentum buf + g
            g = p.nesterov ? __fmaf_rn(p.momentum, s1, g) : s1;         // g + momentum buf
        }
        w = __fmaf_rn(-s.lr, g, w);                                     // w - lr g
    }
}

// SGD with plain momentum, folded (fused.cu's lean layout): the step's gradient is summed straight into a buffer m
// that already holds momentum * buffer + weight_decay * w, so m is the new buffer and sgd_fold_step the update;
// sgd_fold_carry is what m must hold before the next step's gradient arrives. (Not Nesterov: its update needs g.)
__device__ __forceinline__ float sgd_fold_step(const OptimStep& s, float m, float w) {
    return __fmaf_rn(-s.lr, m, w);  // w - lr m
}
__device__ __forceinline__ float sgd_fold_carry(const OptimParams& p, float m, float w) {
    return __fmaf_rn(p.momentum, m, __fmul_rn(p.weight_decay, w));  // momentum m + wd w
}
