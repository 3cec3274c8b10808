// activation.cuh: the numerics the persistent-kernel engines (fused.cu, fused_mlp.cu) share with the other engines:
// the operand rounding of each precision, and the hidden layers' activation (ReLU, or GELU in its tanh form, as
// fastnn/engine/numpy_engine.py's activation) with its derivative. Compile-time choices, so each kernel's code
// has no branch on them.
#pragma once
#include "common.cuh"

// Operand rounding: "mixed" and "fp16" (prec 1, 2) multiply fp16 values (with fp32 accumulation); "fp32" (0) none.
template <int prec> __device__ __forceinline__ float round_operand(float x) {
    if (prec == 0) return x;
    return to_f(from_f<half_t>(x));
}

#define GELU_C 0.7978845608028654f
#define GELU_K 0.044715f
// kind 0: ReLU; 1: GELU (tanh form).
template <int kind> __device__ __forceinline__ float activation(float z) {
    if (kind == 0) return z > 0.f ? z : 0.f;
    return 0.5f * z * (1.f + tanhf(GELU_C * (z + GELU_K * z * z * z)));
}
template <int kind> __device__ __forceinline__ float activation_grad(float z) {
    if (kind == 0) return z > 0.f ? 1.f : 0.f;
    const float t = tanhf(GELU_C * (z + GELU_K * z * z * z));
    return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * GELU_C * (1.f + 3.f * GELU_K * z * z);
}
