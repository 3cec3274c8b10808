// activation.cuh: the hidden layers' activations and their derivatives, as the other engines compute them (ReLU; GELU
// with the tanh approximation), for the fused kernels (fused.cu, fused_mlp.cu). ACT: 0 ReLU, 1 GELU.
#pragma once

#define GELU_C 0.7978845608028654f
#define GELU_K 0.044715f
template <int ACT> __device__ __forceinline__ float activation(float z) {
    if (ACT == 0) return z > 0.f ? z : 0.f;
    return 0.5f * z * (1.f + tanhf(GELU_C * (z + GELU_K * z * z * z)));
}
template <int ACT> __device__ __forceinline__ float activation_grad(float z) {
    if (ACT == 0) return z > 0.f ? 1.f : 0.f;
    const float t = tanhf(GELU_C * (z + GELU_K * z * z * z));
    return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * GELU_C * (1.f + 3.f * GELU_K * z * z);
}
