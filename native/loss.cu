// loss.cu: the loss step of a training step, in ONE block: xent, the fused softmax cross-entropy after cuDNN's
// softmax, and mse, a regression's squared error (below).
// xent: for each row r (row-major (rows, c) logits and their softmax probs): the loss
// logsumexp(z) - z[label] (loss.cuh's xent_*, as every engine), computed from the logits as the NumPy engine does (exact for any logit
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
#include "loss.cuh"    // xent_*, mse_*: the per-row loss and gradient every engine computes

// The last layer's bias gradient: out[j] = the sum over the rows of g[r, j], for row-major (rows, c) g written by
// this block (after a __syncthreads). One warp per column, a fixed summation order: the same sums on every run.
template <typename TG>
__device__ __forceinline__ void column_sums(const TG* g, int rows, int c, TG* __restrict__ out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int j = warp; j < c; j += warps) {
        float s = 0.f;
        for (int r = lane; r < rows; r += 32) s += to_f(g[(u64)r * c + j]);
        s = warp_sum(s);
        if (lane == 0) out[j] = from_f<TG>(s);
    }
}

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
            sum = xent_add(sum, xent_exp(to_f(z[j]), zmax));
            if (dlogits) dlogits[(u64)r * c + j] = from_f<TG>(xent_grad_p(to_f(p[j]), j == label, inv_rows));
        }
        loss += xent_row_loss(sum, to_f(z[label]), zmax);
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
    if (dlogits && dbias) column_sums(dlogits, rows, c, dbias);
}

#define XENT(name, TP, TG)                                                                                    \
    extern "C" __global__ void name(const TP* logits, const TP* probs, const int* labels, int rows, int c,   \
                                    float inv_rows, TG* dlogits, TG* dbias, double* acc, const EpochState* st) { \
        xent<TP, TG>(logits, probs, labels, rows, c, inv_rows, dlogits, dbias, acc, st);                      \
    }

// Every kernel below is compiled, or with -DONLY_LISTED only those named -DKERNEL_<name>: an engine compiles the
// ones its precision launches (graph/kernels.py: fewer kernels, a shorter cold NVRTC compile).
#if !defined(ONLY_LISTED) || defined(KERNEL_xent_f32_f16)
XENT(xent_f32_f16, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_xent_f32_f32)
XENT(xent_f32_f32, float, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_xent_f16_f16)
XENT(xent_f16_f16, half_t, half_t)
#endif

// mse: the squared-error step of a regression (loss "mse") on the linear outputs, in ONE block, beside xent (no
// softmax before it). For each row r of row-major (rows, k) outputs and their float32 targets y: the loss, the mean
// over the k outputs of (out - y)^2 (the NumPy engine's mse_loss_and_grad: no factor 1/2), and, when dout is
// given, the gradient of the batch-mean loss, (out - y) * scale with scale = 2 / (batch rows * k), stored as TG,
// and the last layer's bias gradient (column sums of that gradient) in dbias, as xent. The loss sum goes where
// xent's does (st->hist[2 * epoch_in_fit], or acc[0] in evaluation); the second slot, xent's correct count, is
// left as it is (a regression has no accuracy). With sse given (evaluation), each output's sum of squared errors
// over these rows is added to sse[j], for R^2 on the host.
// Launch: grid = 1, block = a multiple of 32 up to 1024 (rows are strided over the block).
template <typename TP, typename TG>
__device__ void mse(const TP* __restrict__ out, const float* __restrict__ y, int rows, int k, float scale,
                    TG* __restrict__ dout, TG* __restrict__ dbias, double* __restrict__ acc,
                    double* __restrict__ sse, const EpochState* __restrict__ st) {
    __shared__ float s_loss[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float loss = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        float sq = 0.f;
        for (int j = 0; j < k; ++j) {
            const float d = mse_diff(to_f(out[(u64)r * k + j]), y[(u64)r * k + j]);
            sq = mse_add_sq(sq, d);
            if (dout) dout[(u64)r * k + j] = from_f<TG>(mse_grad(d, scale));
        }
        loss += mse_row_loss(sq, k);
    }
    loss = warp_sum(loss);
    if (lane == 0) s_loss[warp] = loss;
    __syncthreads();  // also makes this block's dout stores visible to the whole block
    if (threadIdx.x == 0) {
        double l = 0.0;
        for (int w = 0; w < warps; ++w) l += s_loss[w];
        double* sums = st ? st->hist + 2 * st->epoch_in_fit : acc;
        sums[0] += l;
    }
    if (dout && dbias) column_sums(dout, rows, k, dbias);
    if (sse) {
        for (int j = warp; j < k; j += warps) {
            float s = 0.f;
            for (int r = lane; r < rows; r += 32) s = mse_add_sq(s, mse_diff(to_f(out[(u64)r * k + j]), y[(u64)r * k + j]));
            s = warp_sum(s);
            if (lane == 0) sse[j] += (double)s;
        }
    }
}

#define MSE(name, TP, TG)                                                                                     \
    extern "C" __global__ void name(const TP* out, const float* y, int rows, int k, float scale, TG* dout,   \
                                    TG* dbias, double* acc, double* sse, const EpochState* st) {             \
        mse<TP, TG>(out, y, rows, k, scale, dout, dbias, acc, sse, st);                                       \
    }

#if !defined(ONLY_LISTED) || defined(KERNEL_mse_f32_f16)
MSE(mse_f32_f16, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_mse_f32_f32)
MSE(mse_f32_f32, float, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_mse_f16_f16)
MSE(mse_f16_f16, half_t, half_t)
#endif

// ---- weighted (Trainer.fit(sample_weight=...) on the graph engine): LOSS_WXENT, and squared error weighted alike ----
// Separate kernels, launched only by a weighted fit: xent and mse above (every unweighted fit's) are untouched.
// w holds the batch's row weights (gather_weights, gather.cu, in the batch's shuffled order), scaled on the host by
// n / sum(w) over the training set, so the history's sum of w_r * loss_r divided by the epoch's n rows is the NumPy
// engine's weighted mean, sum(w * loss) / sum(w) (numpy_engine.py); the batch's gradient is each row's times
// w_r / (the batch's sum of weights): fastnn/_loss.py's `weighted`, whatever the host's scale. A batch whose
// weights are all zero has a zero gradient (no step), as there. The block first sums the batch's weights (a fixed
// order: the same sum on every run), then proceeds as xent / mse.
__device__ __forceinline__ float batch_weight_sum(const float* __restrict__ w, int rows) {
    __shared__ float s_w[32];
    __shared__ float s_total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float s = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) s += w[r];
    s = warp_sum(s);
    if (lane == 0) s_w[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < warps; ++i) t += s_w[i];
        s_total = t;
    }
    __syncthreads();
    return s_total;
}

template <typename TP, typename TG>
__device__ void wxent(const TP* __restrict__ logits, const TP* __restrict__ probs, const int* __restrict__ labels,
                      const float* __restrict__ w, int rows, int c, TG* __restrict__ dlogits, TG* __restrict__ dbias,
                      double* __restrict__ acc, const EpochState* __restrict__ st) {
    __shared__ float s_loss[32], s_correct[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float total = batch_weight_sum(w, rows);
    const float inv_total = total > 0.f ? 1.f / total : 0.f;
    float loss = 0.f, correct = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const TP* z = logits + (u64)r * c;
        const TP* p = probs + (u64)r * c;
        const int label = labels[r];
        const float wr = w[r], scale = loss_mul(wr, inv_total);
        int best = 0;
        float zmax = to_f(z[0]);
        for (int j = 1; j < c; ++j) {
            float zj = to_f(z[j]);
            if (argmax_takes(zj, zmax)) { zmax = zj; best = j; }
        }
        float sum = 0.f;
        for (int j = 0; j < c; ++j) {
            sum = xent_add(sum, xent_exp(to_f(z[j]), zmax));
            if (dlogits) dlogits[(u64)r * c + j] = from_f<TG>(xent_grad_p(to_f(p[j]), j == label, scale));
        }
        loss += wxent_row_loss(wr, sum, to_f(z[label]), zmax);
        correct += (best == label) ? 1.f : 0.f;
    }
    loss = warp_sum(loss);
    correct = warp_sum(correct);
    if (lane == 0) { s_loss[warp] = loss; s_correct[warp] = correct; }
    __syncthreads();  // also makes this block's dlogits stores visible to the whole block
    if (threadIdx.x == 0) {
        double l = 0.0, k = 0.0;
        for (int i = 0; i < warps; ++i) { l += s_loss[i]; k += s_correct[i]; }
        double* out = st ? st->hist + 2 * st->epoch_in_fit : acc;
        out[0] += l;
        out[1] += k;
    }
    if (dlogits && dbias) column_sums(dlogits, rows, c, dbias);
}

// A regression's weighted squared error: row r's loss w_r * mean_j d_j^2, its gradient d * 2 w_r / (sum w * k).
template <typename TP, typename TG>
__device__ void wmse(const TP* __restrict__ out, const float* __restrict__ y, const float* __restrict__ w, int rows,
                     int k, TG* __restrict__ dout, TG* __restrict__ dbias, double* __restrict__ acc,
                     const EpochState* __restrict__ st) {
    __shared__ float s_loss[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float total = batch_weight_sum(w, rows);
    const float unit = total > 0.f ? 2.f / (total * (float)k) : 0.f;
    float loss = 0.f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const float wr = w[r], scale = loss_mul(wr, unit);
        float sq = 0.f;
        for (int j = 0; j < k; ++j) {
            const float d = mse_diff(to_f(out[(u64)r * k + j]), y[(u64)r * k + j]);
            sq = mse_add_sq(sq, d);
            if (dout) dout[(u64)r * k + j] = from_f<TG>(mse_grad(d, scale));
        }
        loss += loss_mul(wr, mse_row_loss(sq, k));
    }
    loss = warp_sum(loss);
    if (lane == 0) s_loss[warp] = loss;
    __syncthreads();  // also makes this block's dout stores visible to the whole block
    if (threadIdx.x == 0) {
        double l = 0.0;
        for (int i = 0; i < warps; ++i) l += s_loss[i];
        double* sums = st ? st->hist + 2 * st->epoch_in_fit : acc;
        sums[0] += l;
    }
    if (dout && dbias) column_sums(dout, rows, k, dbias);
}

#define WXENT(name, TP, TG)                                                                                   \
    extern "C" __global__ void name(const TP* logits, const TP* probs, const int* labels, const float* w,   \
                                    int rows, int c, TG* dlogits, TG* dbias, double* acc, const EpochState* st) { \
        wxent<TP, TG>(logits, probs, labels, w, rows, c, dlogits, dbias, acc, st);                            \
    }
#define WMSE(name, TP, TG)                                                                                    \
    extern "C" __global__ void name(const TP* out, const float* y, const float* w, int rows, int k, TG* dout, \
                                    TG* dbias, double* acc, const EpochState* st) {                          \
        wmse<TP, TG>(out, y, w, rows, k, dout, dbias, acc, st);                                               \
    }

#if !defined(ONLY_LISTED) || defined(KERNEL_wxent_f32_f16)
WXENT(wxent_f32_f16, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_wxent_f32_f32)
WXENT(wxent_f32_f32, float, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_wxent_f16_f16)
WXENT(wxent_f16_f16, half_t, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_wmse_f32_f16)
WMSE(wmse_f32_f16, float, half_t)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_wmse_f32_f32)
WMSE(wmse_f32_f32, float, float)
#endif
#if !defined(ONLY_LISTED) || defined(KERNEL_wmse_f16_f16)
WMSE(wmse_f16_f16, half_t, half_t)
#endif
