// fused.cu: a whole training epoch of a small MLP in ONE persistent kernel, one thread-block cluster.
//
// What it computes: the same epoch as the graph engine (and the NumPy engine, the definition): for each step
// s of the epoch, the batch of positions [s*B, s*B + rows) in the epoch's keyed order (shuffle.cuh), mapped
// x*scale + shift; the forward pass (Linear + ReLU/GELU-tanh per hidden layer, Linear last); softmax
// cross-entropy averaged over the batch (log-sum-exp from the logits, argmax first-max-wins, as loss.cu), or for a
// regression (FUSED_LOSS LOSS_MSE) the squared error averaged over the batch and the outputs (as loss.cu's mse);
// the backward pass; and the optimizer step (optim.cuh, as update.cu: SGD with momentum/Nesterov/weight decay,
// or AdamW) at the lr of st->lr[epoch_in_fit * steps + s]. The epoch's loss sum and correct
// count are added to st->hist[2 * epoch_in_fit + {0, 1}]. Parameters and optimizer state are read from the
// engine's flat training state at the start and written back at the end (with the fp16 copy in "mixed"),
// so evaluation, snapshots and checkpoints are the graph engine's.
//
// Launch: grid = one cluster of FUSED_CL CTAs (16 needs the non-portable cluster size attribute), block =
// FUSED_NT threads, dynamic shared memory = FUSED_SMEM bytes (fastnn/engine/fused/plan.py computes it and
// the kernel checks it at compile time). sm_90 or newer (cluster barriers, distributed shared memory).
//
// Partition over the cluster's CTAs (rank r): every hidden layer is split by output neurons (CTA r owns
// rows [r*P, r*P + P) of W_l, their bias and optimizer state); the last layer is split by its INPUT
// columns (the previous layer's slice r, or input columns [r*KP, r*KP + KP) for logistic regression), so
// its partial logits need no all-gather of the last hidden activation. The last layer's bias is replicated
// in every CTA and updated identically (the same arithmetic on the same numbers keeps the copies equal).
//
// Memory plan (per CTA, all in shared memory, fp32 unless said): owned weights (master), their gradient
// accumulators and optimizer state (1 or 2 arrays); an fp16 operand copy of the owned weights in "mixed"
// (the lean layout, for models the standard one cannot hold, drops the copy and, for SGD with plain
// momentum, the gradient arrays: see FOLD and OPC below); the chunk's input rows X (R x D, or R x KP for
// logistic regression); per hidden layer the pre-activation slice Z (R x P, reused as dZ) and, except for
// the last hidden layer, the full activation H (R x width) gathered from every CTA; the last hidden layer's
// activation slice; the partial logits pushed to the row's reducer CTA (CL x ceil(R/CL) x C); the
// all-gathered dlogits (R x C); two reduce-scatter receive buffers for dH (CL x R x P). Registers: GEMM
// tiles. Global memory: the training set (read once per chunk), the lr table, the history, the training
// state at start and end. Row strides are padded to 4 floats (16-byte vector loads) and every pad is zero,
// so padded neurons and columns stay exactly zero under every optimizer.
//
// Products: tensor cores (mma.sync m16n8k16, fp16 operands, fp32 accumulation; MMA below) in "mixed" and
// "fp16" for chunks of 16 rows or more (fused/plan.py decides); else scalar fp32 FMA from shared memory.
//
// Cluster barriers per chunk of R rows: one per hidden layer but the last (all-gather of H), two for the
// head (partial logits -> reducers; dlogits -> everyone), one per hidden layer but the first in backward
// (reduce-scatter of dH): logistic regression 2, 784-h-h-h-10 6. Every buffer written remotely is read
// before at least one further barrier separates it from its next write (checked in the comments below).
// Rows of a step are processed in chunks of R with gradients accumulated, so any batch size works.
//
// Code: fused_epoch is a driver over phase functions: per chunk prefetch (the next rows' indices, labels and inputs
// by cp.async), stage_rows, fwd_hidden_all, logits_push, head, the last layer's backward and bwd_hidden_all; per
// step opt_step over the owned tensors; move_state at both ends. The split kept every production plan's SASS
// byte-identical (benchmarks/sass_compare.py --only fused; the profile build's counters are ordered differently).
#include "activation.cuh"
#include "common.cuh"
#include "loss.cuh"
#include "optim.cuh"
#include "ptx.cuh"
#include "shuffle.cuh"

// ---- shape, precision and optimizer: compile-time (-D from fused/plan.py); defaults compile a logreg ----
#ifndef FUSED_NL
#define FUSED_NL 1
#define FUSED_SIZES {784, 10}
#define FUSED_OFFS {0, 7936}
#define FUSED_CL 16
#define FUSED_R 128
#define FUSED_NT 256
#define FUSED_XIN 0
#define FUSED_PREC 1
#define FUSED_ACT 0
#define FUSED_OPT 0
#define FUSED_NS 1
#define FUSED_SMEM 232448
#endif
#ifndef FUSED_FOLD
#define FUSED_FOLD 0
#endif
#ifndef FUSED_OPC
#define FUSED_OPC (FUSED_PREC == 1)
#endif
#ifndef FUSED_MMA
#define FUSED_MMA 0
#endif
#ifndef FUSED_LOSS
#define FUSED_LOSS 0
#endif

constexpr int L = FUSED_NL;            // linear layers
constexpr int NH = L - 1;              // hidden layers
constexpr int SZ[L + 1] = FUSED_SIZES;  // sizes[0] inputs ... sizes[L] classes
constexpr int OFF[2 * L] = FUSED_OFFS;  // element offsets of W_l, b_l in the flat parameter layout
constexpr int CL = FUSED_CL;
constexpr int R = FUSED_R;
constexpr int NT = FUSED_NT;
constexpr int NW = NT / 32;
constexpr int C = SZ[L];
constexpr int PREC = FUSED_PREC;  // 0 fp32, 1 mixed (fp16 operands, fp32 master), 2 fp16 (fp16 master)
constexpr int OPT = FUSED_OPT;  // the optimizer's kind (optim.cuh's OPTIM_*); the kernel's argument must agree
constexpr int NS = FUSED_NS;    // optimizer state arrays (fastnn/_optim.py's state_names)
// The lean layout (fused/plan.py picks it when the standard one does not fit):
// FOLD: SGD with (non-Nesterov) momentum accumulates each step's gradient straight into the momentum buffer,
// which the previous step left holding momentum * buffer + weight_decay * w: no gradient array.
// OPC: "mixed" keeps an fp16 copy of the owned weights for the products (without it, each product rounds the
// fp32 master on the fly; "fp16" needs none: its masters are fp16 values already).
constexpr bool FOLD = FUSED_FOLD != 0;
constexpr bool OPC = FUSED_OPC != 0 && PREC == 1;
// MMA: the products on tensor cores (mma.sync m16n8k16, fp16 operands, fp32 accumulation) in "mixed" and
// "fp16", whose operands are fp16 values already; "fp32" (no TF32) keeps the scalar FMA path.
constexpr bool MMA = FUSED_MMA != 0 && PREC != 0;
// FUSED_LOSS, the loss (loss.cuh's kinds): LOSS_XENT softmax cross-entropy over int32 labels y; LOSS_MSE a
// regression's squared error (loss "mse") on the linear outputs against float32 targets y (n, C), the NumPy engine's
// mse_loss_and_grad. A regression's rows
// carry their sample index where a classifier's carry their label (lab, lab_n): the head reads the C targets from
// global memory. (Tested as the macro itself: a namespace-scope constant would be one more symbol in every cubin.)
static_assert(FUSED_LOSS == LOSS_XENT || FUSED_LOSS == LOSS_MSE, "fused.cu computes cross-entropy and MSE");
static_assert(NS >= 0 && NS <= 2, "optim.cuh's optimizers keep at most two state arrays");
static_assert(!FOLD || (NS == 1 && OPT == OPTIM_SGD), "folding the gradient into the buffer needs SGD with momentum");

#if FUSED_XIN == 0
typedef u8 TX;
#else
typedef float TX;
#endif

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int up4(int a) { return (a + 3) / 4 * 4; }
// Neurons of hidden layer l (its output) per CTA, and the last layer's input columns per CTA.
__host__ __device__ constexpr int per_of(int l) { return up4(cdiv(SZ[l + 1], CL)); }
constexpr int KP = L == 1 ? up4(cdiv(SZ[0], CL)) : per_of(L - 2);
constexpr int XLD = L == 1 ? KP : up4(SZ[0]);  // row stride of the staged inputs
constexpr int XW = L == 1 ? KP : SZ[0];         // input columns each CTA reads per row
// cp.async moves 4-byte words: rows (and the K-split's column offsets) must start on 4-byte boundaries.
constexpr bool XASYNC = (SZ[0] * (int)sizeof(TX)) % 4 == 0 && (XW * (int)sizeof(TX)) % 4 == 0;
constexpr int RR = cdiv(R, CL);                 // rows each CTA reduces in the head
__host__ __device__ constexpr int rows_of(int l) { return l < NH ? per_of(l) : C; }   // weight rows held of layer l
__host__ __device__ constexpr int ld_of(int l) { return l < NH ? up4(SZ[l]) : KP; }   // weight row stride of layer l
static_assert(R % 4 == 0, "rows per chunk must be a multiple of 4");

// A compile-time loop: f(I<0>{}), f(I<1>{}), ..., f(I<N-1>{}), so each layer's shapes are constants.
template <int v> struct I { static constexpr int value = v; };
template <int N, typename F> __device__ __forceinline__ void static_for(F&& f) {
    if constexpr (N > 0) {
        static_for<N - 1>(f);
        f(I<N - 1>{});
    }
}

struct Layout {  // offsets in floats into dynamic shared memory
    int w[L], b[L], g[L], gb[L], s1[L], s1b[L], s2[L], s2b[L], op[L];
    int z[L], hf[L], hs, xs, xr, lrecv, dzl, rs[2], rs_slot, lab, idx_n, lab_n, acc, mscr, total;
};

__host__ __device__ constexpr int rs_width() {  // widest slice a reduce-scatter lands in: layer l-1's neurons for l >= 1
    int m = 4;
    for (int l = 1; l < NH; ++l) m = per_of(l - 1) > m ? per_of(l - 1) : m;
    return m;
}

__host__ __device__ constexpr Layout make_layout() {
    Layout y{};
    int o = 0;
    for (int l = 0; l < L; ++l) {
        const int n = rows_of(l) * ld_of(l), nb = l < NH ? per_of(l) : up4(C);
        y.w[l] = o; o += n;
        y.b[l] = o; o += nb;
        y.g[l] = o; o += FOLD ? 0 : n;
        y.gb[l] = o; o += FOLD ? 0 : nb;
        y.s1[l] = o; o += NS >= 1 ? n : 0;
        y.s1b[l] = o; o += NS >= 1 ? nb : 0;
        y.s2[l] = o; o += NS >= 2 ? n : 0;
        y.s2b[l] = o; o += NS >= 2 ? nb : 0;
        y.op[l] = o; o += OPC ? up4(n / 2 + 1) : 0;  // fp16 copy: two per float
    }
    y.xs = o; o += R * XLD;
    y.xr = o; o += up4(cdiv(R * XW * (int)sizeof(TX), 4));  // the next chunk's raw rows (cp.async)
    for (int l = 0; l < NH; ++l) {
        y.z[l] = o; o += R * per_of(l);
        y.hf[l] = o; o += l < NH - 1 ? R * up4(SZ[l + 1]) : 0;
    }
    y.hs = o; o += NH >= 1 ? R * KP : 0;
    y.lrecv = o; o += CL * RR * up4(C);
    y.dzl = o; o += R * up4(C);
    y.rs_slot = R * rs_width();
    y.rs[0] = o; o += NH >= 2 ? CL * y.rs_slot : 0;
    y.rs[1] = o; o += NH >= 2 ? CL * y.rs_slot : 0;
    y.lab = o; o += R;
    y.idx_n = o; o += R;
    y.lab_n = o; o += R;
    y.acc = o; o += 2 * NW * 2;  // per warp: loss sum and correct count as doubles
    y.mscr = o; o += MMA ? NW * 128 : 0;  // MMA: per-warp 16x8 partial sums of a K split across warps
    y.total = o;
    return y;
}
constexpr Layout LY = make_layout();
// Where a step's gradients accumulate: the gradient arrays, or (FOLD) the momentum buffers.
__host__ __device__ constexpr int gacc_w(int l) { return FOLD ? LY.s1[l] : LY.g[l]; }
__host__ __device__ constexpr int gacc_b(int l) { return FOLD ? LY.s1b[l] : LY.gb[l]; }
static_assert(LY.total * 4 <= FUSED_SMEM, "fused/plan.py's shared-memory size is smaller than the kernel's layout");
static_assert(NT % 32 == 0 && NT <= 1024, "block must be whole warps");

// Inline PTX (cluster rank and barrier, peer addresses, remote stores, cp.async, mma.sync): ptx.cuh.

// Benchmark-only phase timing, compiled in with -DFUSED_PROFILE (the host plan adds it for
// Tuning(fused_profile=True), as benchmarks/bench_fused.py --phases asks): CTA 0's thread 0 sums
// clock64() cycles per phase over the epoch and prints them at the end.
#ifdef FUSED_PROFILE
#define PROF_MARK(ph)                          \
    do {                                       \
        __syncthreads();                       \
        const long long t_ = clock64();        \
        prof[ph] += t_ - prof_t;               \
        prof_t = t_;                           \
    } while (0)
#else
#define PROF_MARK(ph) do {} while (0)
#endif

// ---- numerics shared with the other engines (activation.cuh) -------------------------------------------------
__device__ __forceinline__ float rnd(float x) { return round_operand<PREC>(x); }
__device__ __forceinline__ float act(float z) { return activation<FUSED_ACT>(z); }
__device__ __forceinline__ float act_grad(float z) { return activation_grad<FUSED_ACT>(z); }

// The operand weight of layer l at flat index e: the fp16 copy, the master rounded on the fly ("mixed" without
// the copy), or the master itself ("fp32", and "fp16" whose masters are fp16 values).
template <int l>
__device__ __forceinline__ float wop(const float* sm, int e) {
    if (OPC) return to_f(reinterpret_cast<const half_t*>(sm + LY.op[l])[e]);
    if (PREC == 1) return rnd(sm[LY.w[l] + e]);
    return sm[LY.w[l] + e];
}

// ---- GEMM shapes of a step (scalar FMA, fp32 accumulation) ---------------------------------------------------
// Forward: out(i, j) = sum_k A[i*lda + k] * W_l[j*ld + k] for i < m, j < N, k < K. A warp takes a tile of
// TM rows x TN neurons; its lanes split k (lane, lane+32, ...: conflict-free loads); a transposing butterfly
// leaves output t of the tile in lane t. `emit(i, j, v)` consumes each finished output.
// One step of the transposing butterfly over 32 per-lane values: lanes with bit n set keep the upper half
// and send the lower, so after the steps 16, 8, 4, 2, 1 lane e holds the warp's sum of value e. Compile-time
// n keeps every index constant (a run-time index would put v in local memory).
template <int n>
__device__ __forceinline__ void butterfly(float (&v)[32], int lane) {
    const bool upper = lane & n;
#pragma unroll
    for (int e = 0; e < n; ++e) {
        const float send = upper ? v[e] : v[e + n];
        const float keep = upper ? v[e + n] : v[e];
        v[e] = keep + __shfl_xor_sync(0xffffffffu, send, n);
    }
}

// ---- tensor cores (MMA) --------------------------------------------------------------------------------------
// d(16x8) += a(16x16, row-major) * b(16x8, column-major), fp16 operands, fp32 accumulation. Fragments (g = lane / 4,
// t = lane % 4): a = {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, b = {(2t..2t+1, g), (2t+8.., g)},
// d = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}; the lower half of each 32-bit register holds the lower index.
// out(i, j) = sum_k fa(i, k) * fb(k, j) for i < mo (<= MO), j < NN, k < kl (<= KK), on tensor cores: a warp per
// 16x8 output tile; where there are fewer tiles than warps, the K steps are split across warps and the partial
// tiles summed in a fixed order through LY.mscr. emit(i, j, v0, v1) receives outputs (i, j) and (i, j + 1), j
// even (v1 is to be ignored where j + 1 == NN). Operands outside the shape read as zero.
template <int MO, int NN, int KK, typename FA, typename FB, typename Emit>
__device__ __forceinline__ void mma_gemm(float* sm, int mo, int kl, FA fa, FB fb, Emit emit) {
    constexpr int MT = cdiv(MO, 16), NT8 = cdiv(NN, 8), KS = cdiv(KK, 16), TILES = MT * NT8;
    constexpr int KC = TILES >= NW ? 1 : (KS < NW / TILES ? KS : NW / TILES);
    constexpr int KPER = cdiv(KS, KC);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t2 = 2 * (lane & 3);
    auto A = [&](int i, int k) { return i < mo && k < kl ? fa(i, k) : 0.f; };
    auto B = [&](int k, int j) { return j < NN && k < kl ? fb(k, j) : 0.f; };
    for (int u = warp; u < TILES * KC; u += NW) {
        const int tile = u % TILES, kc = u / TILES;
        const int i0 = (tile / NT8) * 16, j0 = (tile % NT8) * 8;
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        const int kend = min(KS, (kc + 1) * KPER);
        for (int ks = kc * KPER; ks < kend; ++ks) {
            const int k0 = ks * 16 + t2;
            const u32 a[4] = {pack_h2(A(i0 + g, k0), A(i0 + g, k0 + 1)),
                              pack_h2(A(i0 + g + 8, k0), A(i0 + g + 8, k0 + 1)),
                              pack_h2(A(i0 + g, k0 + 8), A(i0 + g, k0 + 9)),
                              pack_h2(A(i0 + g + 8, k0 + 8), A(i0 + g + 8, k0 + 9))};
            const u32 b[2] = {pack_h2(B(k0, j0 + g), B(k0 + 1, j0 + g)),
                              pack_h2(B(k0 + 8, j0 + g), B(k0 + 9, j0 + g))};
            mma16816(d, a, b);
        }
        if constexpr (KC == 1) {
            const int j = j0 + t2;
            if (j < NN) {
                if (i0 + g < mo) emit(i0 + g, j, d[0], d[1]);
                if (i0 + g + 8 < mo) emit(i0 + g + 8, j, d[2], d[3]);
            }
        } else {
            *reinterpret_cast<float4*>(sm + LY.mscr + u * 128 + 4 * lane) = make_float4(d[0], d[1], d[2], d[3]);
        }
    }
    if constexpr (KC > 1) {
        __syncthreads();
        for (int e = threadIdx.x; e < TILES * 64; e += NT) {  // a thread per pair of outputs
            const int tile = e / 64, ln = (e % 64) / 2, half = e % 2;
            float v0 = 0.f, v1 = 0.f;
            for (int kc = 0; kc < KC; ++kc) {
                const float* p = sm + LY.mscr + (kc * TILES + tile) * 128 + 4 * ln + 2 * half;
                v0 += p[0];
                v1 += p[1];
            }
            const int i = (tile / NT8) * 16 + (ln >> 2) + 8 * half, j = (tile % NT8) * 8 + 2 * (ln & 3);
            if (i < mo && j < NN) emit(i, j, v0, v1);
        }
        __syncthreads();  // LY.mscr is free for the next product
    }
}

// Rows per forward tile: as many as fit 32 outputs, fewer where that leaves warps without a tile.
__host__ __device__ constexpr int fwd_tm(int tn, int tiles_n) {
    int tm = 32 / tn;
    while (tm > 1 && cdiv(R, tm) * tiles_n < NW) --tm;
    return tm;
}
// Forward, many rows and few outputs (logistic regression's K-split): a thread per (row, group of up to 8
// outputs) runs the whole K loop 4 columns at a time (16-byte loads of A; the weights are broadcast).
template <int l, int N, int K, int lda, typename Emit>
__device__ __forceinline__ void gemm_fwd_rows(const float* sm, const float* A, int m, Emit emit) {
    constexpr int ld = ld_of(l);
    constexpr int JB = N < 8 ? N : 8;
    constexpr int NB = cdiv(N, JB);
    static_assert(K % 4 == 0 && lda % 4 == 0 && ld % 4 == 0, "row-thread forward needs 4-aligned rows");
    for (int u = threadIdx.x; u < m * NB; u += NT) {
        const int i = u % m, j0 = (u / m) * JB;
        float acc[JB];
#pragma unroll
        for (int jj = 0; jj < JB; ++jj) acc[jj] = 0.f;
        for (int k = 0; k < K; k += 4) {
            const float4 a = *reinterpret_cast<const float4*>(A + i * lda + k);
#pragma unroll
            for (int jj = 0; jj < JB; ++jj) {
                const int e = (j0 + jj < N ? j0 + jj : 0) * ld + k;
                acc[jj] += a.x * wop<l>(sm, e) + a.y * wop<l>(sm, e + 1) + a.z * wop<l>(sm, e + 2) +
                           a.w * wop<l>(sm, e + 3);
            }
        }
#pragma unroll
        for (int jj = 0; jj < JB; ++jj)
            if (j0 + jj < N) emit(i, j0 + jj, acc[jj]);
    }
}

// The last layer's partial logits when a thread can hold a whole row (N <= 16): the row is pushed to its
// reducer CTA (row i goes to CTA i % CL) as 16-byte stores, and rows are dealt so that the lanes of a warp
// push to few CTAs (scattered 4-byte remote stores cost far more than these).
template <int N, int K, int lda>
__device__ __forceinline__ void logits_push_rows(const float* sm, const float* A, int m, u32 r) {
    constexpr int l = L - 1, ld = ld_of(l), NP = up4(N);
    constexpr int K4 = K / 4, KH = cdiv(K4, 2);  // a pair of lanes splits a row's K, then sums by a shuffle
    static_assert(N <= 16 && K % 4 == 0 && lda % 4 == 0, "row push needs a short, 4-aligned row");
    const int half = threadIdx.x & 1;
    for (int u0 = 0; u0 < m; u0 += NT / 2) {
        const int u = u0 + (int)(threadIdx.x >> 1);
        const bool valid = u < m;
        const int i = !valid ? 0 : (m == R && R % CL == 0) ? (u % RR) * CL + u / RR : u;
        float acc[NP];
#pragma unroll
        for (int c = 0; c < NP; ++c) acc[c] = 0.f;
        if (valid) {
            for (int k4 = half * KH; k4 < min(K4, (half + 1) * KH); ++k4) {
                const int k = 4 * k4;
                const float4 a = *reinterpret_cast<const float4*>(A + i * lda + k);
#pragma unroll
                for (int c = 0; c < N; ++c) {
                    const int e = c * ld + k;
                    acc[c] += a.x * wop<l>(sm, e) + a.y * wop<l>(sm, e + 1) + a.z * wop<l>(sm, e + 2) +
                              a.w * wop<l>(sm, e + 3);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < NP; ++c) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], 1);
        if (valid) {
            const u32 q = (u32)(i % CL), ii = (u32)(i / CL);
            const u32 a = mapa(smem_u32(sm + LY.lrecv + ((int)r * RR + (int)ii) * NP), q);
#pragma unroll
            for (int c = 0; c < NP; c += 4)
                if ((c / 4) % 2 == half) st_remote4(a + 4 * c, make_float4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3]));
        }
    }
}

template <int l, int N, int K, int lda, typename Emit>
__device__ __forceinline__ void gemm_fwd(const float* sm, const float* A, int m, Emit emit) {
    if constexpr (MMA) {
        constexpr int ld = ld_of(l);
        mma_gemm<R, N, K>(
            const_cast<float*>(sm), m, K, [&](int i, int k) { return A[i * lda + k]; },
            [&](int k, int j) { return wop<l>(sm, j * ld + k); },
            [&](int i, int j, float v0, float v1) {
                emit(i, j, v0);
                if (j + 1 < N) emit(i, j + 1, v1);
            });
        return;
    }
    if constexpr (K <= 256 && N <= 64 && R * cdiv(N, N < 8 ? N : 8) >= NT / 2 && K % 4 == 0 && lda % 4 == 0) {
        gemm_fwd_rows<l, N, K, lda>(sm, A, m, emit);
        return;
    }
    constexpr int TN = N < 32 ? N : 32;
    constexpr int TM = fwd_tm(TN, cdiv(N, TN));
    constexpr int ld = ld_of(l);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tiles_m = (m + TM - 1) / TM;
    constexpr int tiles_n = cdiv(N, TN);
    for (int t = warp; t < tiles_m * tiles_n; t += NW) {
        const int i0 = (t / tiles_n) * TM, j0 = (t % tiles_n) * TN;
        float v[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) v[e] = 0.f;
        for (int k = lane; k < K; k += 32) {
            float a[TM], w[TN];
#pragma unroll
            for (int ii = 0; ii < TM; ++ii) a[ii] = (i0 + ii < m) ? A[(i0 + ii) * lda + k] : 0.f;
#pragma unroll
            for (int jj = 0; jj < TN; ++jj) w[jj] = (j0 + jj < N) ? wop<l>(sm, (j0 + jj) * ld + k) : 0.f;
#pragma unroll
            for (int ii = 0; ii < TM; ++ii)
#pragma unroll
                for (int jj = 0; jj < TN; ++jj) v[ii * TN + jj] += a[ii] * w[jj];
        }
        // Transposing butterfly: after it, lane e holds the full sum of tile output e.
        butterfly<16>(v, lane);
        butterfly<8>(v, lane);
        butterfly<4>(v, lane);
        butterfly<2>(v, lane);
        butterfly<1>(v, lane);
        if (lane < TM * TN) {
            const int i = i0 + lane / TN, j = j0 + lane % TN;
            if (i < m && j < N) emit(i, j, v[0]);
        }
    }
}

// Weight gradient: G_l[j*ld + k] += sum_i dZ[i*ldz + j] * A[i*lda + k] for j < N, k < K (K, lda multiples of
// 4). A unit is 4 consecutive k (one 16-byte load of A per row) by up to 16 neurons (dZ broadcast); where
// there are fewer units than threads, S adjacent lanes split the rows of a unit and are summed by shuffles
// (a fixed order: the same result on every run).
__host__ __device__ constexpr int wgrad_split(int units) {
    int s = 32;
    while (s > 1 && units * s > NT) s >>= 1;
    return s;
}
template <int l, int N, int K, int ldz, int lda>
__device__ __forceinline__ void gemm_wgrad(float* sm, const float* dZ, const float* A, int m) {
    constexpr int ld = ld_of(l);
    if constexpr (MMA) {  // G (N x K) += dZ^T (N x m) * A (m x K)
        float* G = sm + gacc_w(l);
        mma_gemm<N, K, R>(
            sm, N, m, [&](int j, int i) { return dZ[i * ldz + j]; }, [&](int i, int k) { return A[i * lda + k]; },
            [&](int j, int k, float v0, float v1) {
                G[j * ld + k] += v0;
                if (k + 1 < K) G[j * ld + k + 1] += v1;
            });
        return;
    }
    constexpr int JB = N < 16 ? N : 16;
    constexpr int KG = K / 4;
    constexpr int UNITS = KG * cdiv(N, JB);
    constexpr int S = wgrad_split(UNITS);
    static_assert(K % 4 == 0 && lda % 4 == 0, "wgrad needs 4-aligned rows");
    float* G = sm + gacc_w(l);
    const int g = threadIdx.x % S;
    for (int u0 = 0; u0 < UNITS; u0 += NT / S) {
        const int u = u0 + threadIdx.x / S;
        const bool valid = u < UNITS;
        const int k = (u % KG) * 4, j0 = (u / KG) * JB;
        float acc[JB][4];
#pragma unroll
        for (int jj = 0; jj < JB; ++jj) acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
        if (valid) {
            for (int i = g; i < m; i += S) {
                const float4 a = *reinterpret_cast<const float4*>(A + i * lda + k);
#pragma unroll
                for (int jj = 0; jj < JB; ++jj) {
                    const float d = (j0 + jj < N) ? dZ[i * ldz + j0 + jj] : 0.f;
                    acc[jj][0] += d * a.x; acc[jj][1] += d * a.y; acc[jj][2] += d * a.z; acc[jj][3] += d * a.w;
                }
            }
        }
        if constexpr (S > 1) {
#pragma unroll
            for (int o = S / 2; o >= 1; o >>= 1)
#pragma unroll
                for (int jj = 0; jj < JB; ++jj)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[jj][e] += __shfl_xor_sync(0xffffffffu, acc[jj][e], o);
        }
        if (valid && g == 0) {
#pragma unroll
            for (int jj = 0; jj < JB; ++jj) {
                if (j0 + jj < N) {
                    float* gp = G + (j0 + jj) * ld + k;
                    gp[0] += acc[jj][0]; gp[1] += acc[jj][1]; gp[2] += acc[jj][2]; gp[3] += acc[jj][3];
                }
            }
        }
    }
}

// Input gradient through layer l: emit(i, k, out(i, k), out(i, k + 1)) with out(i, k) = sum_j dZ[i*ldz + j] *
// W_l[j*ld + k] for i < m, k < K (K a multiple of 4, k even), j < N. Scalar: a thread takes 4 consecutive k of
// one row.
template <int l, int N, int K, int ldz, typename Emit>
__device__ __forceinline__ void gemm_dgrad(const float* sm, const float* dZ, int m, Emit emit) {
    constexpr int ld = ld_of(l);
    static_assert(K % 4 == 0, "dgrad emits pairs of a 4-aligned row");
    if constexpr (MMA) {
        mma_gemm<R, K, N>(
            const_cast<float*>(sm), m, N, [&](int i, int j) { return dZ[i * ldz + j]; },
            [&](int j, int k) { return wop<l>(sm, j * ld + k); }, emit);
        return;
    }
    constexpr int KG = K / 4;
    for (int u = threadIdx.x; u < m * KG; u += NT) {
        const int i = u / KG, k = (u % KG) * 4;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 4
        for (int j = 0; j < N; ++j) {
            const float d = dZ[i * ldz + j];
            a0 += d * wop<l>(sm, j * ld + k);
            a1 += d * wop<l>(sm, j * ld + k + 1);
            a2 += d * wop<l>(sm, j * ld + k + 2);
            a3 += d * wop<l>(sm, j * ld + k + 3);
        }
        emit(i, k, a0, a1);
        emit(i, k + 2, a2, a3);
    }
}

// Bias gradient: gb[j] += sum_i dZ[i*ldz + j] for j < N: a warp per column, lanes over rows, summed by
// shuffles in a fixed order (the replicated last bias gets the same value in every CTA).
template <int N, int ldz>
__device__ __forceinline__ void colsum_add(float* gb, const float* dZ, int m) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = warp; j < N; j += NW) {
        float v = 0.f;
        for (int i = lane; i < m; i += 32) v += dZ[i * ldz + j];
        v = warp_sum(v);
        if (lane == 0) gb[j] += v;
    }
}

// ---- the optimizer step of one owned tensor (optim.cuh's arithmetic, as update.cu) ---------------------------
// `prep` (FOLD only): another step of this epoch follows.
__device__ __forceinline__ void opt_step(const OptimParams& p, const OptimStep& o, bool prep, float* w, float* g,
                                         float* s1, float* s2, half_t* op, int n) {
    for (int e = threadIdx.x; e < n; e += NT) {
        float wi = w[e];
        if (FOLD) {
            // s1 holds momentum * buffer + weight_decay * w + this step's gradient: the new buffer. Leave it
            // ready for the next step (prep), or as the buffer itself after the epoch's last step.
            const float m = s1[e];
            wi = sgd_fold_step(o, m, wi);
            if (PREC == 2) wi = rnd(wi);
            w[e] = wi;
            s1[e] = prep ? sgd_fold_carry(p, m, wi) : m;
            if (op) op[e] = from_f<half_t>(wi);
            continue;
        }
        float m = NS >= 1 ? s1[e] : 0.f, v = NS >= 2 ? s2[e] : 0.f;
        optim_update<OPT>(p, o, NS, g[e], wi, m, v);
        if (NS >= 1) s1[e] = m;
        if (NS >= 2) s2[e] = v;
        if (PREC == 2) wi = rnd(wi);  // "fp16" stores its weights in fp16
        w[e] = wi;
        g[e] = 0.f;
        if (op) op[e] = from_f<half_t>(wi);
    }
}
// FOLD: the epoch's first step starts from momentum * buffer + weight_decay * w.
__device__ __forceinline__ void fold_prep(float* sm, const OptimParams& p) {
    if constexpr (FOLD) {
#pragma unroll
        for (int l = 0; l < L; ++l) {
            const int n = rows_of(l) * ld_of(l), nb = l < NH ? per_of(l) : C;
            for (int e = threadIdx.x; e < n; e += NT)
                sm[LY.s1[l] + e] = sgd_fold_carry(p, sm[LY.s1[l] + e], sm[LY.w[l] + e]);
            for (int e = threadIdx.x; e < nb; e += NT)
                sm[LY.s1b[l] + e] = sgd_fold_carry(optim_bias(p), sm[LY.s1b[l] + e], sm[LY.b[l] + e]);  // bias
        }
    }
}

// ---- load / store of the owned training state ----------------------------------------------------------------
// Hidden layer l: rows [r*P, r*P + cnt) of W_l (torch (out, in) layout at OFF[2l]) and their bias. Last layer:
// columns [k0, k0 + kc) of every row, and the whole bias (replicated). `dir` 0 loads, 1 stores.
template <typename TP>
__device__ void move_state(float* sm, TP* params, float* s1g, float* s2g, half_t* w16, u32 r, int dir) {
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const bool hidden = l < NH;
        const int P = hidden ? per_of(l) : 0;
        const int rows = hidden ? max(0, min(P, SZ[l + 1] - (int)r * P)) : C;
        const int row0 = hidden ? (int)r * P : 0;
        const int kc = hidden ? SZ[l] : max(0, min(KP, SZ[l] - (int)r * KP));
        const int col0 = hidden ? 0 : (int)r * KP;
        const int ld = ld_of(l);
        for (int e = threadIdx.x; e < rows * kc; e += NT) {
            const int i = e / kc, k = e % kc;
            const int gi = OFF[2 * l] + (row0 + i) * SZ[l] + col0 + k;
            const int si = i * ld + k;
            if (dir == 0) {
                sm[LY.w[l] + si] = to_f(params[gi]);
                if (NS >= 1) sm[LY.s1[l] + si] = s1g[gi];
                if (NS >= 2) sm[LY.s2[l] + si] = s2g[gi];
                if (OPC) reinterpret_cast<half_t*>(sm + LY.op[l])[si] = from_f<half_t>(sm[LY.w[l] + si]);
            } else {
                params[gi] = from_f<TP>(sm[LY.w[l] + si]);
                if (NS >= 1) s1g[gi] = sm[LY.s1[l] + si];
                if (NS >= 2) s2g[gi] = sm[LY.s2[l] + si];
                if (w16) w16[gi] = from_f<half_t>(sm[LY.w[l] + si]);
            }
        }
        // Bias: hidden layers their own slice; the last layer's whole bias (stored by CTA 0 only).
        const int nb = hidden ? rows : C;
        const bool store_bias = hidden || r == 0;
        for (int j = threadIdx.x; j < nb; j += NT) {
            const int gi = OFF[2 * l + 1] + row0 + j;
            if (dir == 0) {
                sm[LY.b[l] + j] = to_f(params[gi]);
                if (NS >= 1) sm[LY.s1b[l] + j] = s1g[gi];
                if (NS >= 2) sm[LY.s2b[l] + j] = s2g[gi];
            } else if (store_bias) {
                params[gi] = from_f<TP>(sm[LY.b[l] + j]);
                if (NS >= 1) s1g[gi] = sm[LY.s1b[l] + j];
                if (NS >= 2) s2g[gi] = sm[LY.s2b[l] + j];
                if (w16) w16[gi] = from_f<half_t>(sm[LY.b[l] + j]);
            }
        }
    }
}


// ---- one hidden layer's forward and backward for a chunk of m rows (l is a compile-time constant) -------------
// Forward: Z (the owned neuron slice), H = act(Z) all-gathered into every CTA (the last hidden layer keeps its
// slice for the last layer's K-split instead).
template <int l>
__device__ __forceinline__ void fwd_hidden(float* sm, int m, u32 r) {
    constexpr int P = per_of(l), Kin = SZ[l], lda = l == 0 ? XLD : up4(SZ[l]);
    const float* A = l == 0 ? sm + LY.xs : sm + LY.hf[l > 0 ? l - 1 : 0];
    const int row0 = (int)r * P;
    const int real = max(0, min(P, SZ[l + 1] - row0));
    gemm_fwd<l, P, Kin, lda>(sm, A, m, [&](int i, int j, float v) {
        float z = 0.f, h = 0.f;
        if (j < real) {
            z = v + rnd(sm[LY.b[l] + j]);
            h = rnd(act(z));
            z = PREC == 0 ? z : rnd(z);
        }
        sm[LY.z[l] + i * P + j] = z;
        if (l == NH - 1) {
            sm[LY.hs + i * KP + j] = h;
        } else if (j < real) {
            sm[LY.hf[l] + i * up4(SZ[l + 1]) + row0 + j] = h;  // own slice in place; pushed below
        }
    });
    if constexpr (l < NH - 1) {
        // All-gather: the slice goes to the same place in every other CTA as 16-byte stores (P and the row
        // stride are multiples of 4: pads are zeros), then one barrier.
        constexpr int HLD = up4(SZ[l + 1]), P4 = P / 4;
        __syncthreads();
        if (row0 < HLD) {
            for (int e = threadIdx.x; e < m * P4 * CL; e += NT) {
                const int q = e % CL, g = (e / CL) % P4, i = e / (CL * P4);
                if (q == (int)r || row0 + 4 * g >= HLD) continue;  // a slice may end past the layer's width
                float* src = sm + LY.hf[l] + i * HLD + row0 + 4 * g;
                st_remote4(mapa(smem_u32(src), (u32)q), *reinterpret_cast<const float4*>(src));
            }
        }
        cluster_sync_full();  // H_l gathered everywhere (read below and in its wgrad)
    }
}
template <int l>
__device__ __forceinline__ void fwd_hidden_all(float* sm, int m, u32 r) {
    if constexpr (l < NH) {
        fwd_hidden<l>(sm, m, r);
        fwd_hidden_all<l + 1>(sm, m, r);
    }
}

// Backward of hidden layer l, its dZ already in Z: dH of the previous layer reduce-scattered through
// distributed shared memory (then dZ of layer l-1 into its Z), bias and weight gradients accumulated.
template <int l>
__device__ __forceinline__ void bwd_hidden(float* sm, int m, u32 r, int& rs_cur) {
    const int tid = threadIdx.x;
    constexpr int P = per_of(l), Kin = SZ[l], lda = l == 0 ? XLD : up4(SZ[l]);
    const float* dZ = sm + LY.z[l];
    if constexpr (l >= 1) {
        // dH_{l-1} partial over this CTA's neurons, pushed to the owner of each column's slice.
        // rs[rs_cur] is read right after the barrier below; the next write into the same
        // buffer comes two reduce-scatters later, after another barrier.
        constexpr int PP = per_of(l - 1);
        float* rsb = sm + LY.rs[rs_cur];
        gemm_dgrad<l, P, up4(Kin), P>(sm, dZ, m, [&](int i, int k, float v0, float v1) {
            const u32 q = (u32)(k / PP), kk = (u32)(k % PP);  // k even, PP a multiple of 4: one owner per pair
            if (q < CL) {
                const u32 a = smem_u32(rsb + (int)r * LY.rs_slot + i * PP + kk);
                st_remote2(mapa(a, q), v0, v1);
            }
        });
    }
    // bias and weight gradients of the owned neurons
    colsum_add<P, P>(sm + gacc_b(l), dZ, m);
    const float* A = l == 0 ? sm + LY.xs : sm + LY.hf[l > 0 ? l - 1 : 0];
    gemm_wgrad<l, P, up4(Kin), P, lda>(sm, dZ, A, m);
    if constexpr (l >= 1) {
        cluster_sync_full();
        constexpr int PP = per_of(l - 1);
        const float* rsb = sm + LY.rs[rs_cur];
        float* zp = sm + LY.z[l - 1];
        for (int e = tid; e < m * PP; e += NT) {
            const int i = e / PP, kk = e % PP;
            float v = 0.f;
            for (int q = 0; q < CL; ++q) v += rsb[q * LY.rs_slot + i * PP + kk];
            zp[i * PP + kk] = rnd(v * act_grad(zp[i * PP + kk]));
        }
        rs_cur ^= 1;
        __syncthreads();
    }
}
template <int l>
__device__ __forceinline__ void bwd_hidden_all(float* sm, int m, u32 r, int& rs_cur) {
    if constexpr (l >= 0) {
        bwd_hidden<l>(sm, m, r, rs_cur);
        bwd_hidden_all<l - 1>(sm, m, r, rs_cur);
    }
}

// ---- the chunk's rows ---------------------------------------------------------------------------------------
// Start fetching the rows at epoch positions [pos0, pos0 + m): sample indices (the keyed order), then their labels
// and this CTA's columns of their inputs, by cp.async into lab_n and the raw buffer.
__device__ __forceinline__ void prefetch(const TX* __restrict__ x, const int* __restrict__ y,
                                         const u32 (&keys)[FEISTEL_ROUNDS], u32 half_bits, u32 n, u32 r, int pos0,
                                         int m) {
    extern __shared__ __align__(16) float sm[];  // the kernel's own symbol: a pointer argument compiles differently
    const int tid = threadIdx.x;
    int* idx_n = reinterpret_cast<int*>(sm + LY.idx_n);
    int* lab_n = reinterpret_cast<int*>(sm + LY.lab_n);
    for (int i = tid; i < m; i += NT) idx_n[i] = (int)permuted_index(keys, half_bits, n, (u32)(pos0 + i));
    __syncthreads();
    const int col0 = L == 1 ? (int)r * KP : 0;
    for (int i = tid; i < m; i += NT) {
        if constexpr (FUSED_LOSS == LOSS_MSE) lab_n[i] = idx_n[i];  // the sample index: the head reads its targets
        else cp_async4(smem_u32(lab_n + i), y + idx_n[i]);
    }
    if constexpr (XASYNC) {
        constexpr int WORDS = XW * (int)sizeof(TX) / 4;  // 4-byte words per row
        const int valid = min(XW, SZ[0] - col0) * (int)sizeof(TX) / 4;
        u8* raw = reinterpret_cast<u8*>(sm + LY.xr);
        for (int e = tid; e < m * WORDS; e += NT) {
            const int i = e / WORDS, w = e % WORDS;
            if (w < valid)
                cp_async4(smem_u32(raw + (i * WORDS + w) * 4),
                          reinterpret_cast<const u8*>(x + (u64)idx_n[i] * SZ[0] + col0) + 4 * w);
        }
    } else {
        TX* raw = reinterpret_cast<TX*>(sm + LY.xr);
        for (int e = tid; e < m * XW; e += NT) {
            const int i = e / XW, k = e % XW;
            if (col0 + k < SZ[0]) raw[i * XW + k] = x[(u64)idx_n[i] * SZ[0] + col0 + k];
        }
    }
    cp_async_commit();
}

// The chunk's rows arrived: this CTA's columns converted to operands (x * scale + shift, rounded as the products
// take them; pads zero) into xs, their labels into lab.
__device__ __forceinline__ void stage_rows(float* sm, u32 r, int m, float scale, float shift) {
    const int tid = threadIdx.x;
    int* lab = reinterpret_cast<int*>(sm + LY.lab);
    const int* lab_n = reinterpret_cast<const int*>(sm + LY.lab_n);
    constexpr int D = SZ[0];
    const int col0 = L == 1 ? (int)r * KP : 0;
    const TX* raw = reinterpret_cast<const TX*>(sm + LY.xr);
    float* xs = sm + LY.xs;
    if constexpr (XW % 4 == 0) {  // 4 elements per thread and access
        constexpr int XW4 = XW / 4;
        for (int e = tid; e < m * XW4; e += NT) {
            const int i = e / XW4, k = (e % XW4) * 4;
            float4 v;
            v.x = col0 + k < D ? rnd(to_f(raw[i * XW + k]) * scale + shift) : 0.f;
            v.y = col0 + k + 1 < D ? rnd(to_f(raw[i * XW + k + 1]) * scale + shift) : 0.f;
            v.z = col0 + k + 2 < D ? rnd(to_f(raw[i * XW + k + 2]) * scale + shift) : 0.f;
            v.w = col0 + k + 3 < D ? rnd(to_f(raw[i * XW + k + 3]) * scale + shift) : 0.f;
            *reinterpret_cast<float4*>(xs + i * XLD + k) = v;
        }
    } else {
        for (int e = tid; e < m * XW; e += NT) {
            const int i = e / XW, k = e % XW;
            xs[i * XLD + k] = col0 + k < D ? rnd(to_f(raw[i * XW + k]) * scale + shift) : 0.f;
        }
    }
    for (int i = tid; i < m; i += NT) lab[i] = lab_n[i];
}

// The last layer's partial logits over this CTA's input columns, pushed to each row's reducer CTA (row i to CTA
// i % CL). lrecv is read only between the next cluster barrier and the one after it, and written again only after
// a further barrier of the next chunk: no overlap.
__device__ __forceinline__ void logits_push(float* sm, int m, u32 r) {
    const int tid = threadIdx.x;
    const float* A = NH >= 1 ? sm + LY.hs : sm + LY.xs;
    constexpr int lda = NH >= 1 ? KP : XLD;
    if constexpr (!MMA && C <= 16 && R >= NT / 2) {
        logits_push_rows<C, KP, lda>(sm, A, m, r);
    } else if constexpr (MMA) {
        // Staged in this CTA's dlogits rows (free until the head, which other CTAs write only after
        // the barrier below; pads stay zero), then each row pushed to its reducer as 16-byte stores.
        constexpr int V = up4(C) / 4;
        float* stage = sm + LY.dzl;
        gemm_fwd<L - 1, C, KP, lda>(sm, A, m, [&](int i, int c, float v) { stage[i * up4(C) + c] = v; });
        __syncthreads();
        for (int e = tid; e < m * V; e += NT) {
            const int i = e / V, v = e % V;
            const u32 a = smem_u32(sm + LY.lrecv + ((int)r * RR + i / CL) * up4(C) + 4 * v);
            const float4 val = *reinterpret_cast<const float4*>(stage + i * up4(C) + 4 * v);
            st_remote4(mapa(a, (u32)(i % CL)), val);
        }
    } else {
        gemm_fwd<L - 1, C, KP, lda>(sm, A, m, [&](int i, int c, float v) {
            const u32 q = (u32)(i % CL), ii = (u32)(i / CL);
            const u32 a = smem_u32(sm + LY.lrecv + ((int)r * RR + (int)ii) * up4(C) + c);
            st_remote(mapa(a, q), v);
        });
    }
}

// The head: each warp reduces one of this CTA's rows (i = r + CL*ii): the logits (the CL partial rows summed in a
// fixed order, plus the bias), the loss (softmax cross-entropy, or MSE against the targets of the row's sample), the
// argmax and the dlogits, pushed to every CTA's dlogits rows. Returns loss_acc and ok_acc with these rows added (lane
// 0's are the warp's sums): returned, not updated through references, they keep the registers of the code in place.
struct HeadSums {
    double loss, ok;
};
__device__ __forceinline__ HeadSums head(float* sm, const int* __restrict__ y, const int* lab, int m, u32 r, int warp,
                                         int lane, float inv_rows, float mse_scale, double loss_acc, double ok_acc) {
    for (int ii = warp; ii < RR; ii += NW) {
        const int i = (int)r + CL * ii;
        if (i >= m) continue;
        int best = 0x7fffffff;
        float zmax = __int_as_float(0xff800000);  // -inf
        for (int c = lane; c < C; c += 32) {
            float z = sm[LY.b[L - 1] + c];
            for (int q = 0; q < CL; ++q) z += sm[LY.lrecv + (q * RR + ii) * up4(C) + c];
            sm[LY.dzl + i * up4(C) + c] = z;  // the logits, until dlogits replace them below
        }
        __syncwarp();
        if constexpr (FUSED_LOSS == LOSS_MSE) {  // the mean over the outputs of (z - t)^2; dz = 2 (z - t) / (rows * C)
            const float* t = reinterpret_cast<const float*>(y) + (u64)lab[i] * C;
            float sq = 0.f;
            for (int c = lane; c < C; c += 32) sq = mse_add_sq(sq, mse_diff(sm[LY.dzl + i * up4(C) + c], t[c]));
            sq = warp_sum(sq);
            if (lane == 0) loss_acc += (double)mse_row_loss(sq, C);
            __syncwarp();
            for (int c = lane; c < C; c += 32) {
                const float d = mse_grad(mse_diff(sm[LY.dzl + i * up4(C) + c], t[c]), mse_scale);
                const u32 a = smem_u32(sm + LY.dzl + i * up4(C) + c);
                for (u32 q = 0; q < CL; ++q) st_remote(mapa(a, q), d);
            }
            continue;
        }
        for (int c = lane; c < C; c += 32) {
            const float z = sm[LY.dzl + i * up4(C) + c];
            if (argmax_takes(z, zmax)) { zmax = z; best = c; }
        }
        warp_argmax(zmax, best);  // first maximum (and first NaN) wins, as numpy.argmax
        float sum = 0.f;
        for (int c = lane; c < C; c += 32) sum = xent_add(sum, xent_exp(sm[LY.dzl + i * up4(C) + c], zmax));
        sum = warp_sum(sum);
        const int label = lab[i];
        const float zl = sm[LY.dzl + i * up4(C) + label];
        if (lane == 0) {
            loss_acc += (double)xent_row_loss(sum, zl, zmax);
            ok_acc += best == label ? 1.0 : 0.0;
        }
        __syncwarp();
        const float inv = xent_inv(sum);
        for (int c = lane; c < C; c += 32) {
            const float d = xent_grad(xent_exp(sm[LY.dzl + i * up4(C) + c], zmax), inv, c == label ? 1.f : 0.f,
                                            inv_rows);
            const u32 a = smem_u32(sm + LY.dzl + i * up4(C) + c);
            for (u32 q = 0; q < CL; ++q) st_remote(mapa(a, q), d);
        }
    }
    return HeadSums{loss_acc, ok_acc};
}

// ---- the kernel ---------------------------------------------------------------------------------------------
template <typename TP>
__device__ void fused_epoch(TP* params, float* s1g, float* s2g, half_t* w16, const TX* __restrict__ x,
                            const int* __restrict__ y, u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits,
                            EpochState* st, int steps, int batch, float scale, float shift, OptimParams p) {
    extern __shared__ __align__(16) float sm[];
    const u32 r = cluster_rank();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < LY.total; e += NT) sm[e] = 0.f;  // every pad starts (and stays) zero
    __syncthreads();
    move_state<TP>(sm, params, s1g, s2g, w16, r, 0);
    __syncthreads();
    // fused/plan.py compiled this kernel for the optimizer passed, and folds plain momentum only
    if (p.kind != OPT || (FOLD && p.nesterov)) __trap();
    fold_prep(sm, p);
    u32 keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, st->epoch, keys);
    int* lab = reinterpret_cast<int*>(sm + LY.lab);
    double loss_acc = 0.0, ok_acc = 0.0;  // lane 0 of each warp: the rows this warp reduced
    int rs_cur = 0;
    __syncthreads();
    prefetch(x, y, keys, half_bits, n, r, 0, min(R, min(batch, (int)n)));
#ifdef FUSED_PROFILE
    long long prof[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long long prof_t = clock64();
#endif
    const u32 epoch_in_fit = st->epoch_in_fit;
    const u64 step0 = st->step0;

    float lr_next = st->lr[(u64)st->epoch_in_fit * steps];
    for (int s = 0; s < steps; ++s) {
        const int rows = min(batch, (int)n - s * batch);
        const float inv_rows = 1.f / (float)rows;
        const float mse_scale = (float)(2.0 / ((double)rows * C));  // rounded once, as the NumPy engine's
        for (int c0 = 0; c0 < rows; c0 += R) {
            const int m = min(R, rows - c0);
            // -- the chunk's rows arrived (cp.async, issued during the previous chunk): convert them to
            // operands, take their labels, then start fetching the next chunk's rows.
            PROF_MARK(7);
            cp_async_wait_all();
            __syncthreads();
            PROF_MARK(0);  // waiting for the rows
            stage_rows(sm, r, m, scale, shift);
            __syncthreads();
            {
                int ns = s, nc = c0 + R;
                if (nc >= rows) { ns = s + 1; nc = 0; }
                if (ns < steps)
                    prefetch(x, y, keys, half_bits, n, r, ns * batch + nc,
                             min(R, min(batch, (int)n - ns * batch) - nc));
            }

            PROF_MARK(1);  // convert + prefetch issue
            fwd_hidden_all<0>(sm, m, r);
            __syncthreads();

            // -- last layer: partial logits over this CTA's input columns, pushed to each row's reducer CTA
            logits_push(sm, m, r);
            PROF_MARK(2);  // forward
            cluster_sync_full();
            PROF_MARK(3);  // barrier after the partial logits

            // -- head: logits, loss, dlogits of this CTA's rows, pushed to all
            {
                const HeadSums h = head(sm, y, lab, m, r, warp, lane, inv_rows, mse_scale, loss_acc, ok_acc);
                loss_acc = h.loss;
                ok_acc = h.ok;
            }
            cluster_sync_full();  // dlogits of every row everywhere
            PROF_MARK(4);  // head + barrier

            // -- backward. Last layer: bias gradient (replicated, same order everywhere) and weight gradient.
            {
                const float* A = NH >= 1 ? sm + LY.hs : sm + LY.xs;
                constexpr int lda = NH >= 1 ? KP : XLD;
                colsum_add<C, up4(C)>(sm + gacc_b(L - 1), sm + LY.dzl, m);
                gemm_wgrad<L - 1, C, KP, up4(C), lda>(sm, sm + LY.dzl, A, m);
            }
            if constexpr (NH >= 1) {
                // dH of the last hidden layer's slice through the last layer, times act'(Z), into Z (as dZ).
                constexpr int P = per_of(NH - 1);
                gemm_dgrad<L - 1, C, KP, up4(C)>(sm, sm + LY.dzl, m, [&](int i, int k, float v0, float v1) {
                    float* z = sm + LY.z[NH - 1] + i * P + k;
                    z[0] = rnd(v0 * act_grad(z[0]));
                    z[1] = rnd(v1 * act_grad(z[1]));
                });
                __syncthreads();
                bwd_hidden_all<NH - 1>(sm, m, r, rs_cur);
            }
            __syncthreads();
        }
        // -- the optimizer step of every owned tensor, at this step's rate
        PROF_MARK(5);  // backward
        const u64 k = (u64)epoch_in_fit * steps + s;
        const OptimStep o = optim_step<OPT>(p, lr_next, step0 + k + 1);  // Adam counts steps from 1
        if (s + 1 < steps) lr_next = st->lr[k + 1];  // used a step later: the load's latency is hidden
        const bool prep = s + 1 < steps;
#pragma unroll
        for (int l = 0; l < L; ++l) {
            const int n = rows_of(l) * ld_of(l), nb = l < NH ? per_of(l) : C;
            half_t* op = OPC ? reinterpret_cast<half_t*>(sm + LY.op[l]) : nullptr;
            opt_step(p, o, prep, sm + LY.w[l], sm + gacc_w(l), sm + LY.s1[l], sm + LY.s2[l], op, n);
            // a bias: its decay is bias_decay (optim.cuh)
            opt_step(optim_bias(p), o, prep, sm + LY.b[l], sm + gacc_b(l), sm + LY.s1b[l], sm + LY.s2b[l], nullptr,
                     nb);
        }
        __syncthreads();
        PROF_MARK(6);  // update
    }
#ifdef FUSED_PROFILE
    if (r == 0 && tid == 0)
        printf("fused phases (cycles/step): wait %lld convert+issue %lld forward %lld logits-barrier %lld "
               "head+barrier %lld backward %lld update %lld loop %lld\n", prof[0] / steps, prof[1] / steps,
               prof[2] / steps, prof[3] / steps, prof[4] / steps, prof[5] / steps, prof[6] / steps, prof[7] / steps);
#endif

    // -- write the training state back, and the epoch's loss and correct count (deterministic order)
    move_state<TP>(sm, params, s1g, s2g, w16, r, 1);
    double* acc = reinterpret_cast<double*>(sm + LY.acc);
    if (lane == 0) { acc[2 * warp] = loss_acc; acc[2 * warp + 1] = ok_acc; }
    cluster_sync_full();
    if (r == 0 && tid == 0) {
        double l = 0.0, c = 0.0;
        const u32 base = smem_u32(acc);
        for (u32 q = 0; q < CL; ++q)
            for (int w = 0; w < NW; ++w) {
                l += ld_remote_d(mapa(base + 16 * w, q));
                c += ld_remote_d(mapa(base + 16 * w + 8, q));
            }
        st->hist[2 * st->epoch_in_fit] += l;
        st->hist[2 * st->epoch_in_fit + 1] += c;
    }
    cluster_sync_full();  // CTA 0 reads the others' shared memory: they stay until it is done
}

#if FUSED_PREC == 2
typedef half_t TParam;
#else
typedef float TParam;
#endif

extern "C" __global__ void __launch_bounds__(FUSED_NT, 1)
fused_epoch_kernel(TParam* params, float* s1, float* s2, half_t* w16, const TX* x, const int* y, u32 n, u32 seed_lo,
                   u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch, float scale, float shift,
                   OptimParams opt) {
#if __CUDA_ARCH__ >= 900
    fused_epoch<TParam>(params, s1, s2, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, shift,
                        opt);
#else
    __trap();  // clusters need sm_90: fused/plan.py refuses older GPUs
#endif
}
