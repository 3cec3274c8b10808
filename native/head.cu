// head.cu: the last layer of a training step in one kernel, for few classes: logits = H @ W^T + b,
// softmax, the cross-entropy loss and correct count, the logits gradient (p - onehot) / rows and the
// bias gradient. It replaces four nodes (the logits GEMM, cuDNN's softmax, the loss kernel and a
// bias-gradient reduction) where they cost more than the arithmetic: on logistic regression's
// 128x784 by 784x10 the logits GEMM alone took 5.7 us on an H200. Same math as loss.cu (the loss
// from the logits, argmax of the logits with the first maximum winning).
//
// Layout: h is row-major (rows, k) in TO, w is torch's (c, k) in TO, b has c elements in TL (the
// logits' type), labels are int32. dlogits is row-major (rows, c) in TO, dbias has c elements in TO.
// Launch: grid = ceil(rows / HEAD_ROWS), block = HEAD_WARPS * 32, dynamic shared memory =
// c * k * sizeof(TO) (the whole W, loaded once per block) + HEAD_WARPS * (c + 2) * 4 bytes.
// Requires c <= HEAD_CMAX. Cross-block sums are made deterministic by the last-block pattern: every
// block writes its partial sums, and the last block to finish (counted with an atomic ticket) adds
// them in block order, then resets the ticket for the next launch.
#include "common.cuh"

#define HEAD_CMAX 32
#define HEAD_WARPS 8
#define HEAD_ROWS 16

__device__ __forceinline__ float warp_all_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename TO, typename TL>
__device__ void head(const TO* __restrict__ h, const TO* __restrict__ w, const TL* __restrict__ b,
                     const int* __restrict__ labels, int rows, int k, int c, float inv_rows, TO* __restrict__ dlogits,
                     TO* __restrict__ dbias, float* __restrict__ partials, u32* __restrict__ ticket,
                     double* __restrict__ acc, const EpochState* __restrict__ st) {
    extern __shared__ unsigned char smem[];
    TO* sw = reinterpret_cast<TO*>(smem);
    float* wpart = reinterpret_cast<float*>(smem + (((u64)c * k * sizeof(TO) + 15) & ~(u64)15));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < c * k; i += blockDim.x) sw[i] = w[i];
    __syncthreads();

    // Per warp: lane j < c accumulates column j of the bias gradient; every lane the loss and count.
    float gb = 0.f, loss = 0.f, correct = 0.f;
    const float bias_j = lane < c ? to_f(b[lane]) : 0.f;
    for (int r = blockIdx.x * HEAD_ROWS + warp; r < min(rows, (int)(blockIdx.x + 1) * HEAD_ROWS); r += HEAD_WARPS) {
        float z[HEAD_CMAX];
#pragma unroll
        for (int j = 0; j < HEAD_CMAX; ++j) z[j] = 0.f;
        const TO* hr = h + (u64)r * k;
        for (int kk = lane; kk < k; kk += 32) {
            const float hv = to_f(hr[kk]);
#pragma unroll
            for (int j = 0; j < HEAD_CMAX; ++j)
                if (j < c) z[j] += hv * to_f(sw[j * k + kk]);
        }
        // Every lane ends with every logit (butterfly sums), rounded to the logits' type.
        float zmax = -__int_as_float(0x7f800000), mine = 0.f;  // -inf
        int best = 0;
#pragma unroll
        for (int j = 0; j < HEAD_CMAX; ++j) {
            if (j < c) {
                float bj = __shfl_sync(0xffffffffu, bias_j, j);
                z[j] = to_f(from_f<TL>(warp_all_sum(z[j]) + bj));
                if (z[j] > zmax) { zmax = z[j]; best = j; }
                if (lane == j) mine = z[j];
            }
        }
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < HEAD_CMAX; ++j)
            if (j < c) sum += expf(z[j] - zmax);
        const int label = labels[r];
        float z_label = 0.f;
#pragma unroll
        for (int j = 0; j < HEAD_CMAX; ++j)
            if (j == label) z_label = z[j];
        loss += logf(sum) - (z_label - zmax);
        correct += (best == label) ? 1.f : 0.f;
        if (lane < c) {
            float g = (expf(mine - zmax) / sum - (lane == label ? 1.f : 0.f)) * inv_rows;
            dlogits[(u64)r * c + lane] = from_f<TO>(g);
            gb += g;
        }
    }
    // Block partials in warp order, then block order in the last block: the same sums every run.
    if (lane < c) wpart[warp * (c + 2) + lane] = gb;
    if (lane == 0) {
        wpart[warp * (c + 2) + c] = loss;
        wpart[warp * (c + 2) + c + 1] = correct;
    }
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x < c + 2) {
        float s = 0.f;
        for (int v = 0; v < HEAD_WARPS; ++v) s += wpart[v * (c + 2) + threadIdx.x];
        partials[(u64)blockIdx.x * (c + 2) + threadIdx.x] = s;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < c + 2) {
        double s = 0.0;
        for (u32 blk = 0; blk < gridDim.x; ++blk) s += ((volatile float*)partials)[(u64)blk * (c + 2) + threadIdx.x];
        if (threadIdx.x < c) {
            dbias[threadIdx.x] = from_f<TO>((float)s);
        } else {
            double* out = st ? st->hist + 2 * st->epoch_in_fit : acc;
            out[threadIdx.x - c] += s;
        }
    }
    if (threadIdx.x == 0) *ticket = 0u;
}

#define HEAD(name, TO, TL)                                                                                   \
    extern "C" __global__ void name(const TO* h, const TO* w, const TL* b, const int* labels, int rows, int k,  \
                                    int c, float inv_rows, TO* dlogits, TO* dbias, float* partials, u32* ticket, \
                                    double* acc, const EpochState* st) {                                     \
        head<TO, TL>(h, w, b, labels, rows, k, c, inv_rows, dlogits, dbias, partials, ticket, acc, st);      \
    }

HEAD(head_f16_f32, half_t, float)  // "mixed": fp16 operands, fp32 logits and bias
HEAD(head_f32_f32, float, float)   // "fp32"
HEAD(head_f16_f16, half_t, half_t) // "fp16"
