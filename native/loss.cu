// loss.cu: the fused softmax cross-entropy step after cuDNN's softmax, in ONE block.
// For each row r (row-major (rows, c) logits and their softmax probs): the loss
// logsumexp(z) - z[label], computed from the logits as the NumPy engine does (exact for any logit
// size, and non-finite exactly when the logits are), a correct-prediction count (argmax of the
// logits, first maximum wins, as numpy.argmax), and, when dlogits is given, the gradient of the
// batch-mean loss with respect to the logits, (p - onehot) / rows, stored as TG, and the last
// layer's bias gradient (column sums of that gradient) in dbias: this spares the weight-gradient
// GEMM a bias-gradient epilogue, which costs more than this whole kernel on skinny shapes.
// Sums are added by thread 0 to the epoch's history slot, st->hist[2 * epoch_in_fit + {0, 1}], or
// with no EpochState (evaluation) to acc[0], acc[1]: no read-back per step, no atomics, and the
// same sums on every run.
// Launch: grid = 1, block = a multiple of 32 up to 1024 (rows are strided over the block).
#include "common.cuh"  // warp_sum, argmax_takes

template <typename TP, typename TG>
__device__ void xent(const TP* __restrict__ logits, const TP* __restrict__ probs, const int* __restrict__ labels,
                     int rows, int c, float inv_rows, TG* __restrict__ dlogits, TG* __restrict__ dbias,
                     double* __restrict__ acc, const EpochState* __restrict__ st) {
    __shared__ float s_loss[32], s_correct[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float loss = 0.f, correct = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const TP* z = logits + (u64)r * c;
        const TP* p = probs + (u64)r * c;
        int label = labels[r];
        int best = 0;
        float zmax = to_f(z[0]);
        for (int j = 1; j < c; ++j) {
            float zj = to_f(z[j]);
            if (argmax_takes(zj, zmax)) { zmax = zj; best = j; }
        }
        float sum = 0.f;
        for (int j = 0; j < c; ++j) {
            sum += expf(to_f(z[j]) - zmax);
            if (dlogits) dlogits[(u64)r * c + j] = from_f<TG>((to_f(p[j]) - (j == label ? 1.f : 0.f)) * inv_rows);
        }
        loss += logf(sum) - (to_f(z[label]) - zmax);
        correct += (best == label) ? 1.f : 0.f;
    }
    loss = warp_sum(loss);
    correct = warp_sum(correct);
    if (lane == 0) { s_loss[warp] = loss; s_correct[warp] = correct; }
    __syncthreads();  // also makes this block's dlogits stores visible to the whole block
    if (threadIdx.x == 0) {
        double l = 0.0, k = 0.0;
        for (int w = 0; w < warps; ++w) { l += s_loss[w]; k += s_correct[w]; }
        double* out = st ? st->hist + 2 * st->epoch_in_fit : acc;
        out[0] += l;
        out[1] += k;
    }
    if (dlogits && dbias) {
        for (int j = warp; j < c; j += warps) {  // one warp per class, a fixed summation order
            float s = 0.f;
            for (int r = lane; r < rows; r += 32) s += to_f(dlogits[(u64)r * c + j]);
            s = warp_sum(s);
            if (lane == 0) dbias[j] = from_f<TG>(s);
        }
    }
}

#define XENT(name, TP, TG)                                                                                    \
    extern "C" __global__ void name(const TP* logits, const TP* probs, const int* labels, int rows, int c,   \
                                    float inv_rows, TG* dlogits, TG* dbias, double* acc, const EpochState* st) { \
        xent<TP, TG>(logits, probs, labels, rows, c, inv_rows, dlogits, dbias, acc, st);                      \
    }

XENT(xent_f32_f16, float, half_t)
XENT(xent_f32_f32, float, float)
XENT(xent_f16_f16, half_t, half_t)
