// loss.cu: the fused softmax cross-entropy step after cuDNN's softmax.
// For each row r (row-major (rows, c) logits and their softmax probs): the loss
// logsumexp(z) - z[label], computed from the logits as the NumPy engine does (exact for any logit
// size, and non-finite exactly when the logits are), a correct-prediction count (argmax of the
// logits, first maximum wins, as numpy.argmax), and, when dlogits is given, the gradient of the
// batch-mean loss with respect to the logits, (p - onehot) / rows, stored as TG.
// Sums accumulate on the device into acc[2*slot] (loss) and acc[2*slot+1] (correct), slot being the
// epoch within the fit read from EpochState (0 without one): no read-back per step.
// Launch: grid = ceil(rows / LOSS_THREADS), block = LOSS_THREADS (a multiple of 32).
#include "common.cuh"

template <typename TP, typename TG>
__device__ void xent(const TP* __restrict__ logits, const TP* __restrict__ probs, const int* __restrict__ labels,
                     int rows, int c,
                     float inv_rows, TG* __restrict__ dlogits, double* __restrict__ acc,
                     const EpochState* __restrict__ st) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    float loss = 0.f, correct = 0.f;
    if (r < rows) {
        const TP* z = logits + (u64)r * c;
        const TP* p = probs + (u64)r * c;
        int label = labels[r];
        int best = 0;
        float zmax = to_f(z[0]);
        for (int j = 1; j < c; ++j) {
            float zj = to_f(z[j]);
            if (zj > zmax) { zmax = zj; best = j; }
        }
        float sum = 0.f;
        for (int j = 0; j < c; ++j) {
            sum += expf(to_f(z[j]) - zmax);
            if (dlogits) dlogits[(u64)r * c + j] = from_f<TG>((to_f(p[j]) - (j == label ? 1.f : 0.f)) * inv_rows);
        }
        loss = logf(sum) - (to_f(z[label]) - zmax);
        correct = (best == label) ? 1.f : 0.f;
    }
    // Warp sums, then one double atomic per warp: few atomics, and exact counts.
    for (int o = 16; o > 0; o >>= 1) {
        loss += __shfl_down_sync(0xffffffffu, loss, o);
        correct += __shfl_down_sync(0xffffffffu, correct, o);
    }
    if ((threadIdx.x & 31) == 0 && (blockIdx.x * blockDim.x + threadIdx.x) < rows) {
        u32 slot = st ? st->epoch_in_fit : 0u;
        atomicAdd(acc + 2 * slot, (double)loss);
        atomicAdd(acc + 2 * slot + 1, (double)correct);
    }
}

#define XENT(name, TP, TG)                                                                          \
    extern "C" __global__ void name(const TP* logits, const TP* probs, const int* labels, int rows, int c, \
                                    float inv_rows, TG* dlogits, double* acc, const EpochState* st) {     \
        xent<TP, TG>(logits, probs, labels, rows, c, inv_rows, dlogits, acc, st);                         \
    }

XENT(xent_f32_f16, float, half_t)
XENT(xent_f32_f32, float, float)
XENT(xent_f16_f16, half_t, half_t)

// Column sums of a row-major (rows, cols) matrix: the bias gradient where no cuBLASLt epilogue
// gives it. Launch: grid = ceil(cols / 128), block = 128.
template <typename T>
__device__ void colsum(const T* __restrict__ m, int rows, int cols, T* __restrict__ out) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.f;
    for (int r = 0; r < rows; ++r) s += to_f(m[(u64)r * cols + j]);
    out[j] = from_f<T>(s);
}
extern "C" __global__ void colsum_f16(const half_t* m, int rows, int cols, half_t* out) { colsum(m, rows, cols, out); }
extern "C" __global__ void colsum_f32(const float* m, int rows, int cols, float* out) { colsum(m, rows, cols, out); }
