// grid.cu: a whole training epoch of an MLP with at least one hidden layer in ONE cooperative persistent kernel,
// one CTA per SM at most, every CTA resident for the whole epoch.
//
// What it computes: the same epoch as the graph and fused engines (and the NumPy engine, the definition): for each
// step s, the batch of positions [s*B, s*B + rows) in the epoch's keyed order (shuffle.cuh), mapped x*scale + shift;
// the forward pass (Linear + ReLU/GELU-tanh per hidden layer, Linear last); softmax cross-entropy averaged over the
// batch (or, GRID_LOSS 1, a regression's squared error averaged over the batch and the outputs); the backward pass;
// and the optimizer step (optim.cuh: SGD with momentum/Nesterov/weight decay, or AdamW) at the rate
// st->lr[epoch_in_fit * steps + s]. The epoch's loss sum and correct count are added to st->hist[2 * epoch_in_fit +
// {0, 1}]. Numerics as fused.cu: operands rounded by rnd() ("mixed": fp16 operands, fp32 accumulation and masters;
// "fp16": fp16 masters too; "fp32": no rounding), pre-activations and dZ stored rounded, dlogits fp32 (rounded where
// they are a product's operand), biases' gradients summed from the stored values.
//
// Launch: grid = GRID_P CTAs (<= the SM count; cooperative, so all are resident), block = GRID_NT threads, dynamic
// shared memory GRID_SMEM bytes; `scratch` = GRID_SCRATCH bytes of global memory (fastnn/engine/grid/plan.py computes
// both; static_asserts below check the kernel needs no more); `sync` = 256 bytes whose first word, the round
// counter, the engine zeroes (a memset node) before every launch, and whose bytes 128.. receive the phase profile.
//
// Partition ("column-master", the probe's grid.md 2.1): CTA p owns the units U_p = [p*NB_l, p*NB_l + NB_l) of every
// hidden layer l (NB_l = ceil(width_l / P); the last CTAs may own fewer or none).
//   forward of hidden layer l: Z_l[:, U_p] from the whole previous activation and W_l's rows U_p; Z and H = act(Z)
//     of its units published in the exchange buffers;
//   head (the last layer): every CTA computes logits, loss, dlogits and the last hidden layer's dZ for all units
//     (redundant, saves a round); the head's bias is replicated in shared memory and updated identically everywhere
//     (CTA 0 writes it back); CTA 0 alone accumulates loss and correct count;
//   backward of layer l >= 1 and of the head: CTA p owns the COLUMN block W_l[:, U_p(l-1)]: input gradient
//     dZ_{l-1}[:, U_p], weight gradient and optimizer step all local (the gradient of an element goes straight into
//     its optimizer step; no gradient array, no partial sums across CTAs); layer 0 is row-owned (W_0[U_p, :]);
//     hidden biases belong to their unit's owner.
// Rounds a step (a monotone counter barrier, grid_round): after each hidden layer's forward (NH), and after the
// backward of layers NH-1 .. 2 (dZ of layers NH-2 .. 1 exchanged): NH + max(0, NH - 2).
//
// Memory plan. Shared memory: the product tiles (K chunks of both operands), the step's sample indices and labels,
// the head bias with its optimizer state and gradient, per-warp loss sums. Global memory: masters and optimizer state
// in the engine's flat training state (read and written with ld/st.global.cg: other CTAs write them, so never from
// L1); the global scratch (fp32, values rounded per precision):
//   HZ[par][l]  H_l and Z_l (B x width_l, row-major) of step parity par. Written by the unit owner in step s's
//               forward, read by everyone after the round that follows. The next write to the same parity (step s+2)
//               comes after the writer waited step s+1's first round, which every CTA reaches only after all of its
//               step s reads (the head reads H and Z of the last hidden layer after the step's last forward round:
//               this is why they alternate by parity).
//   DZ[l]       dZ_l for 1 <= l <= NH-2, written by the unit owner in the backward of layer l+1, read by everyone
//               after the round that follows; the next write (step s+1) comes after the writer waited step s+1's
//               first round, i.e. after every CTA finished step s.
//   HEADW[par]  the head's weights rounded as operands, parity by step: step s reads HEADW[s % 2] (logits and the
//               dgrad, both before any update); the column owners write HEADW[(s + 1) % 2] after their step s update.
//               Those writes precede the writer's arrival at step s+1's first round, which every reader waits before
//               its step s+1 head; the previous readers of HEADW[(s+1) % 2] (step s-1) all arrived at step s's first
//               round, which the writer waited before its step s head. At the epoch's start each CTA fills HEADW[0]
//               for its columns before its first arrival.
//   masters     W_l (1 <= l < NH) is read by rows in step s+1's forward (after step s+1's round H_{l-1}, which the
//               column owner reached after its step s update) and written by columns in step s's backward (after the
//               round H_{NH-1} of step s, which every row reader reached after its step s forward read). W_0, the
//               hidden biases and the head's columns are read and written only by their owner.
//   PRIV[p]     CTA p's own logits/dlogits (B x C), the last hidden layer's whole dZ (B x width) and its slice of dZ_0
//               (B x NB_0): only CTA p, ordered by __syncthreads.
// Products (v1): scalar fp32 FMA from shared-memory tiles (K chunks of 64, the next chunk prefetched into registers),
// each thread a 2x2 block of outputs summed over k in ascending order: deterministic, no float atomics.
#include "common.cuh"
#include "optim.cuh"
#include "shuffle.cuh"

// ---- shape, precision and optimizer: compile-time (-D from grid/plan.py); defaults compile 784-256x3-10 mixed ----
#ifndef GRID_NL
#define GRID_NL 4
#define GRID_SIZES {784, 256, 256, 256, 10}
#define GRID_OFFS {0, 200704, 200960, 266496, 266752, 332288, 332544, 335104}
#define GRID_P 32
#define GRID_B 32
#define GRID_NT 256
#define GRID_XIN 0
#define GRID_PREC 1
#define GRID_ACT 0
#define GRID_OPT 0
#define GRID_NS 1
#define GRID_SMEM 232448
#define GRID_SCRATCH (1 << 30)
#define GRID_LOSS 0
#endif

constexpr int L = GRID_NL;              // linear layers
constexpr int NH = L - 1;               // hidden layers
constexpr int SZ[L + 1] = GRID_SIZES;   // sizes[0] inputs ... sizes[L] classes
constexpr int OFF[2 * L] = GRID_OFFS;   // element offsets of W_l, b_l in the flat parameter layout
constexpr int P = GRID_P;               // CTAs
constexpr int B = GRID_B;               // most rows a step
constexpr int NT = GRID_NT;
constexpr int NW = NT / 32;
constexpr int D = SZ[0];                // inputs
constexpr int C = SZ[L];                // classes (outputs)
constexpr int HW = SZ[NH];              // the last hidden layer's width (the head's inputs)
constexpr int PREC = GRID_PREC;         // 0 fp32, 1 mixed, 2 fp16
constexpr int OPT = GRID_OPT;           // optim.cuh's OPTIM_*; the kernel's argument must agree
constexpr int NS = GRID_NS;             // optimizer state arrays
static_assert(NH >= 1, "the grid kernel spreads hidden layers: logistic regression is the fused engine's");
static_assert(NS >= 0 && NS <= 2, "optim.cuh's optimizers keep at most two state arrays");
static_assert(NT == 256, "the product tiles assume 256 threads (2x2 outputs each, 1024 a tile)");

#if GRID_XIN == 0
typedef u8 TX;
#else
typedef float TX;
#endif
#if GRID_PREC == 2
typedef half_t TParam;
#else
typedef float TParam;
#endif

__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int up4(int a) { return (a + 3) / 4 * 4; }
__host__ __device__ constexpr long long up32(long long a) { return (a + 31) / 32 * 32; }
// Units of hidden layer l (its outputs) a CTA owns.
__host__ __device__ constexpr int nb_of(int l) { return cdiv(SZ[l + 1], P); }
constexpr int NB0 = nb_of(0);

// ---- layouts: global scratch (floats) and shared memory (floats); plan.py mirrors both ----------------------------
struct Scratch {
    long long h[2][NH], z[2][NH], dz[NH], headw[2], priv, logits, dzh, dz0, priv_stride, total;
};
__host__ __device__ constexpr Scratch make_scratch() {
    Scratch s{};
    long long o = 0;
    for (int par = 0; par < 2; ++par)
        for (int l = 0; l < NH; ++l) {
            s.h[par][l] = o; o += up32((long long)B * SZ[l + 1]);
            s.z[par][l] = o; o += up32((long long)B * SZ[l + 1]);
        }
    for (int l = 0; l < NH; ++l) {
        s.dz[l] = o; o += (l >= 1 && l <= NH - 2) ? up32((long long)B * SZ[l + 1]) : 0;
    }
    for (int par = 0; par < 2; ++par) { s.headw[par] = o; o += up32((long long)C * HW); }
    s.priv = o;
    s.logits = 0;
    s.dzh = up32((long long)B * C);
    s.dz0 = s.dzh + up32((long long)B * HW);
    s.priv_stride = s.dz0 + up32((long long)B * NB0);
    s.total = o + P * s.priv_stride;
    return s;
}
constexpr Scratch SC = make_scratch();
static_assert(SC.total * 4 <= (long long)GRID_SCRATCH, "grid/plan.py's global scratch is smaller than the kernel's");

constexpr int KC = 64;       // K chunk of the product tiles
constexpr int TILE_W = 144;  // the widest (TM + 4) + (TN + 4) of the tile shapes below
struct Smem { int tiles, idx, lab, hb, hs1, hs2, hg, acc, total; };
__host__ __device__ constexpr Smem make_smem() {
    Smem y{};
    int o = 0;
    y.tiles = o; o += KC * TILE_W;
    y.idx = o; o += up4(B);
    y.lab = o; o += up4(B);
    y.hb = o; o += up4(C);
    y.hg = o; o += up4(C);
    y.hs1 = o; o += NS >= 1 ? up4(C) : 0;
    y.hs2 = o; o += NS >= 2 ? up4(C) : 0;
    y.acc = o; o += 4 * NW;  // per warp: loss sum and correct count as doubles
    y.total = o;
    return y;
}
constexpr Smem SL = make_smem();
static_assert(SL.total * 4 <= GRID_SMEM, "grid/plan.py's shared-memory size is smaller than the kernel's layout");

// ---- global memory that other CTAs write: never through L1 (PTX: NVRTC needs no toolkit headers) ----------------
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float ld_cg(const half_t* p) {
    half_t v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return to_f(v);
}
__device__ __forceinline__ void st_cg(float* p, float v) {
    asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ void st_cg(half_t* p, float v) {
    asm volatile("st.global.cg.u16 [%0], %1;" ::"l"(p), "h"(from_f<half_t>(v)) : "memory");
}

// ---- a round: every CTA arrives, then waits until all P have (monotone counter, grid.md rule 3) --------------------
// Thread 0's gpu-scope acq_rel fence makes the CTA's writes before __syncthreads visible before its arrival; its
// acquire load, then __syncthreads, orders the CTA's later reads after every CTA's arrival. The watchdog turns a
// hang (a CTA not resident, a round miscounted) into a trap within seconds instead of a stuck GPU.
#define GRID_WATCHDOG (1u << 26)
__device__ __forceinline__ void grid_round(u32* counter, u32& rounds, int step) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 target = (u32)P * (rounds + 1);
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        u32 polls = 0, v;
        while (true) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
            if ((int)(v - target) >= 0) break;
            if (++polls == GRID_WATCHDOG) {
                printf("grid.cu watchdog: step %d block %d round %u: counter %u of %u after %u polls\n", step,
                       (int)blockIdx.x, rounds, v, target, polls);
                __trap();
            }
        }
    }
    ++rounds;
    __syncthreads();
}

// Benchmark-only phase timing (-DGRID_PROFILE, Tuning.grid_profile): thread 0 of CTA 0 sums clock64() cycles per
// phase over the epoch into sync's profile words (the marks add a CTA barrier each).
#ifdef GRID_PROFILE
#define PROF(ph)                                        \
    do {                                                \
        __syncthreads();                                \
        const long long t_ = clock64();                 \
        c.prof[ph] += t_ - c.prof_t;                    \
        c.prof_t = t_;                                  \
    } while (0)
#else
#define PROF(ph) do {} while (0)
#endif
#define NPHASE 10  // gather, F0, forward rounds, forward l >= 1, head + loss, head backward, backward l >= 1,
                   // backward rounds, layer 0 update, epilogue

// ---- numerics shared with the other engines -------------------------------------------------------------------
__device__ __forceinline__ float rnd(float x) {
    if (PREC == 0) return x;
    return to_f(from_f<half_t>(x));
}
#define GELU_C 0.7978845608028654f
#define GELU_K 0.044715f
__device__ __forceinline__ float act(float z) {
#if GRID_ACT == 0
    return z > 0.f ? z : 0.f;
#else
    return 0.5f * z * (1.f + tanhf(GELU_C * (z + GELU_K * z * z * z)));
#endif
}
__device__ __forceinline__ float act_grad(float z) {
#if GRID_ACT == 0
    return z > 0.f ? 1.f : 0.f;
#else
    const float t = tanhf(GELU_C * (z + GELU_K * z * z * z));
    return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * GELU_C * (1.f + 3.f * GELU_K * z * z);
#endif
}

// ---- products ---------------------------------------------------------------------------------------------------
// out(i, j) = sum_{k < K} fa(i, k) * fb(j, k) for i < M, j < N, handed to emit(i, j, out). A CTA tile is TM x TN
// outputs (TM * TN = 1024: 2x2 per thread); K runs in chunks of KC staged in shared memory k-major (As[k][i],
// Bs[k][j]), the next chunk's operands loaded into registers while this one computes. Outside the shape the
// operands read as zero; every output sums k in ascending order (the same bits on every run and every CTA).
__host__ __device__ constexpr int tn_for(int n) { return n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : 64; }
template <int TN, typename FA, typename FB, typename Emit>
__device__ __forceinline__ void gemm(float* tl, int M, int N, int K, FA fa, FB fb, Emit emit) {
    constexpr int TM = 1024 / TN, TX = TN / 2, AS = TM + 4, BS = TN + 4;
    static_assert(AS + BS <= TILE_W, "tile wider than the shared-memory plan");
    constexpr int EA = TM * KC / NT, EB = cdiv(TN * KC, NT);
    float* As = tl;
    float* Bs = tl + KC * AS;
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    for (int i0 = 0; i0 < M; i0 += TM) {
        for (int j0 = 0; j0 < N; j0 += TN) {
            float ra[EA], rb[EB];
            auto fetch = [&](int k0) {
#pragma unroll
                for (int e = 0; e < EA; ++e) {
                    const int q = tid + e * NT, k = q % KC, i = q / KC;
                    ra[e] = (i0 + i < M && k0 + k < K) ? fa(i0 + i, k0 + k) : 0.f;
                }
#pragma unroll
                for (int e = 0; e < EB; ++e) {
                    const int q = tid + e * NT, k = q % KC, j = q / KC;
                    rb[e] = (q < TN * KC && j0 + j < N && k0 + k < K) ? fb(j0 + j, k0 + k) : 0.f;
                }
            };
            float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
            fetch(0);
            for (int k0 = 0; k0 < K; k0 += KC) {
                __syncthreads();  // the previous chunk's (or product's) readers are done with the tiles
#pragma unroll
                for (int e = 0; e < EA; ++e) {
                    const int q = tid + e * NT;
                    As[(q % KC) * AS + q / KC] = ra[e];
                }
#pragma unroll
                for (int e = 0; e < EB; ++e) {
                    const int q = tid + e * NT;
                    if (q < TN * KC) Bs[(q % KC) * BS + q / KC] = rb[e];
                }
                __syncthreads();
                if (k0 + KC < K) fetch(k0 + KC);
#pragma unroll 8
                for (int k = 0; k < KC; ++k) {
                    const float2 a = *reinterpret_cast<const float2*>(As + k * AS + 2 * ty);
                    const float2 b = *reinterpret_cast<const float2*>(Bs + k * BS + 2 * tx);
                    acc[0][0] = __fmaf_rn(a.x, b.x, acc[0][0]);
                    acc[0][1] = __fmaf_rn(a.x, b.y, acc[0][1]);
                    acc[1][0] = __fmaf_rn(a.y, b.x, acc[1][0]);
                    acc[1][1] = __fmaf_rn(a.y, b.y, acc[1][1]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int i = i0 + 2 * ty + r, j = j0 + 2 * tx + c;
                    if (i < M && j < N) emit(i, j, acc[r][c]);
                }
        }
    }
    __syncthreads();  // every emit done (they may write what the next phase reads)
}

// ---- the optimizer step of one element of the flat state (optim.cuh's arithmetic, as update.cu and fused.cu) ----
struct Opt {
    OptimParams p;
    OptimStep o;
};
template <typename TP>
__device__ __forceinline__ float update_elem(TP* params, float* s1g, float* s2g, long long e, float g, const Opt& op) {
    float w = ld_cg(params + e);
    float m = NS >= 1 ? ld_cg(s1g + e) : 0.f, v = NS >= 2 ? ld_cg(s2g + e) : 0.f;
    optim_update<OPT>(op.p, op.o, NS, g, w, m, v);
    if (PREC == 2) w = rnd(w);  // "fp16" stores its weights in fp16
    st_cg(params + e, w);
    if (NS >= 1) st_cg(s1g + e, m);
    if (NS >= 2) st_cg(s2g + e, v);
    return w;
}

// ---- the epoch ---------------------------------------------------------------------------------------------------
template <typename TP>
struct Ctx {
    TP* params;
    float* s1g;
    float* s2g;
    const TX* x;
    float* scr;    // global scratch
    float* priv;   // this CTA's region of it
    float* tl;     // product tiles (shared)
    const int* idx;  // the step's sample indices (shared)
    float scale, shift;
    int cta, m, par, step;
    u32* counter;    // the rounds' counter (sync word 0)
    u32 rounds;      // rounds this CTA has passed in this launch
#ifdef GRID_PROFILE
    long long prof[NPHASE];
    long long prof_t;
#endif
};

// The network's input (i, k) of the step: sample idx[i], mapped and rounded as an operand.
template <typename TP>
__device__ __forceinline__ float xval(const Ctx<TP>& c, int i, int k) {
    return rnd(to_f(c.x[(u64)c.idx[i] * D + k]) * c.scale + c.shift);
}

// Forward of hidden layer l for this CTA's units: Z, H = act(Z) into the exchange buffers of the step's parity.
template <int l, typename TP>
__device__ __forceinline__ void forward(const Ctx<TP>& c) {
    constexpr int K = SZ[l], W = SZ[l + 1], NB = nb_of(l);
    const int u0 = c.cta * NB, cnt = max(0, min(NB, W - u0));
    if (cnt == 0) return;
    const TP* Wm = c.params + OFF[2 * l];
    const TP* bias = c.params + OFF[2 * l + 1];
    float* Ho = c.scr + SC.h[c.par][l];
    float* Zo = c.scr + SC.z[c.par][l];
    auto fb = [&](int j, int k) { return rnd(ld_cg(Wm + (long long)(u0 + j) * K + k)); };
    auto emit = [&](int i, int j, float v) {
        float z = v + rnd(ld_cg(bias + u0 + j));
        const float h = rnd(act(z));
        z = PREC == 0 ? z : rnd(z);
        st_cg(Ho + i * W + u0 + j, h);
        st_cg(Zo + i * W + u0 + j, z);
    };
    if constexpr (l == 0) {
        gemm<tn_for(NB)>(c.tl, c.m, cnt, K, [&](int i, int k) { return xval(c, i, k); }, fb, emit);
    } else {
        const float* Hi = c.scr + SC.h[c.par][l > 0 ? l - 1 : 0];
        gemm<tn_for(NB)>(c.tl, c.m, cnt, K, [&](int i, int k) { return ld_cg(Hi + i * K + k); }, fb, emit);
    }
}

// The bias step of this CTA's units of hidden layer l, whose dZ (rows of stride ldz, unit u at column col0 + u) is
// given: the gradient is the column sum in row order.
template <int l, typename TP, typename DZ>
__device__ __forceinline__ void bias_step(const Ctx<TP>& c, const Opt& op, DZ dz) {
    constexpr int NB = nb_of(l), W = SZ[l + 1];
    const int u0 = c.cta * NB, cnt = max(0, min(NB, W - u0));
    for (int j = threadIdx.x; j < cnt; j += NT) {
        float g = 0.f;
        for (int i = 0; i < c.m; ++i) g += dz(i, u0 + j);
        update_elem(c.params, c.s1g, c.s2g, OFF[2 * l + 1] + u0 + j, g, op);
    }
}

// Backward through layer l >= 1 (hidden, not the head), the whole dZ_l given by dzl(i, k): this CTA's hidden bias
// units of layer l; dZ_{l-1} of its units of layer l-1 (into the exchange buffer, or its own dZ_0 slice); the step of
// its column block W_l[:, U_p(l-1)].
template <int l, typename TP, typename DZ>
__device__ __forceinline__ void backward(const Ctx<TP>& c, const Opt& op, DZ dzl) {
    constexpr int K = SZ[l], W = SZ[l + 1], NB = nb_of(l - 1);
    bias_step<l>(c, op, dzl);
    const int u0 = c.cta * NB, cnt = max(0, min(NB, K - u0));
    if (cnt == 0) return;
    TP* Wm = c.params + OFF[2 * l];
    const float* Zp = c.scr + SC.z[c.par][l - 1];
    const float* Hp = c.scr + SC.h[c.par][l - 1];
    float* out = l - 1 >= 1 ? c.scr + SC.dz[l - 1] : c.priv + SC.dz0;
    // dgrad: dH_{l-1}[i, u] = sum_k dZ_l[i, k] W_l[k, u], then dZ_{l-1} = rnd(dH act'(Z)), before the update below
    gemm<tn_for(NB)>(
        c.tl, c.m, cnt, W, dzl, [&](int u, int k) { return rnd(ld_cg(Wm + (long long)k * K + u0 + u)); },
        [&](int i, int u, float v) {
            const float dz = rnd(v * act_grad(ld_cg(Zp + i * K + u0 + u)));
            if (l - 1 >= 1) st_cg(out + i * K + u0 + u, dz);
            else out[i * NB0 + u] = dz;
        });
    // weight gradient dW_l[k, u] = sum_i dZ_l[i, k] H_{l-1}[i, u], straight into the optimizer step
    gemm<tn_for(NB)>(
        c.tl, W, cnt, c.m, [&](int k, int i) { return dzl(i, k); },
        [&](int u, int i) { return ld_cg(Hp + i * K + u0 + u); },
        [&](int k, int u, float g) { update_elem(c.params, c.s1g, c.s2g, OFF[2 * l] + (long long)k * K + u0 + u, g, op); });
}

// Forward of hidden layers l .. NH-1, a round after each.
template <int l, typename TP>
__device__ __forceinline__ void forward_from(Ctx<TP>& c) {
    if constexpr (l < NH) {
        forward<l>(c);
        PROF(3);
        grid_round(c.counter, c.rounds, c.step);
        PROF(2);
        forward_from<l + 1>(c);
    }
}

// Backward through hidden layers l .. 1 (column-owned), a round after each but the last; layer NH-1's dZ is this
// CTA's own whole copy (the head's dgrad), the others' the exchange buffer.
template <int l, typename TP>
__device__ __forceinline__ void backward_from(Ctx<TP>& c, const Opt& op) {
    if constexpr (l >= 1) {
        if constexpr (l == NH - 1) {
            const float* dzh = c.priv + SC.dzh;
            backward<l>(c, op, [&](int i, int k) { return dzh[i * HW + k]; });
        } else {
            const float* dzx = c.scr + SC.dz[l];
            backward<l>(c, op, [&](int i, int k) { return ld_cg(dzx + i * SZ[l + 1] + k); });
        }
        PROF(6);
        if constexpr (l >= 2) {
            grid_round(c.counter, c.rounds, c.step);
            PROF(7);
        }
        backward_from<l - 1>(c, op);
    }
}

// Epoch end, "mixed": the fp16 copy (what evaluation's GEMMs read) of everything this CTA owns, layers l .. L-1.
template <int l, typename TP>
__device__ __forceinline__ void half_copy_from(const Ctx<TP>& c, half_t* w16) {
    if constexpr (l < L) {
        constexpr int K = SZ[l], W = SZ[l + 1];
        const int tid = threadIdx.x, cta = c.cta;
        const TP* params = c.params;

        if constexpr (l == 0) {  // rows
            const int u0 = cta * NB0, cnt = max(0, min(NB0, W - u0));
            for (int e = tid; e < cnt * K; e += NT) {
                const long long g = OFF[0] + (long long)u0 * K + e;
                w16[g] = from_f<half_t>(ld_cg(params + g));
            }
        } else {  // columns
            constexpr int NB = nb_of(l - 1);
            const int u0 = cta * NB, cnt = max(0, min(NB, K - u0));
            for (int e = tid; e < W * cnt; e += NT) {
                const long long g = OFF[2 * l] + (long long)(e / cnt) * K + u0 + e % cnt;
                w16[g] = from_f<half_t>(ld_cg(params + g));
            }
        }
        if constexpr (l < NH) {  // hidden biases by unit
            constexpr int NB = nb_of(l);
            const int u0 = cta * NB, cnt = max(0, min(NB, W - u0));
            for (int j = tid; j < cnt; j += NT)
                w16[OFF[2 * l + 1] + u0 + j] = from_f<half_t>(ld_cg(params + OFF[2 * l + 1] + u0 + j));
        }
        half_copy_from<l + 1>(c, w16);
    }
}

template <typename TP>
__device__ void grid_epoch(TP* params, float* s1g, float* s2g, half_t* w16, const TX* __restrict__ x,
                           const int* __restrict__ y, u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits, EpochState* st,
                           int steps, int batch, float scale, float shift, OptimParams prm, float* scr, u32* sync) {
    extern __shared__ __align__(16) float sm[];
    const int cta = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // grid/plan.py compiled this kernel for this optimizer, batch and launch shape
    if (prm.kind != OPT || batch > B || batch < 1 || gridDim.x != P || blockDim.x != NT) __trap();
    int* idx = reinterpret_cast<int*>(sm + SL.idx);
    int* lab = reinterpret_cast<int*>(sm + SL.lab);
    float* hb = sm + SL.hb;
    float* hg = sm + SL.hg;
    float* hs1 = sm + SL.hs1;
    float* hs2 = sm + SL.hs2;
    Ctx<TP> c{params, s1g, s2g, x, scr, scr + SC.priv + (long long)cta * SC.priv_stride, sm + SL.tiles, idx,
              scale, shift, cta, 0, 0, 0, sync, 0};
    constexpr int NBH = nb_of(NH - 1);  // this CTA's columns of the head: its units of the last hidden layer
    const int hu0 = cta * NBH, hcnt = max(0, min(NBH, HW - hu0));
    TP* Wh = params + OFF[2 * L - 2];

    // -- the head's bias and its optimizer state, replicated; this CTA's columns of the head's operand copy 0
    for (int j = tid; j < C; j += NT) {
        hb[j] = to_f(params[OFF[2 * L - 1] + j]);
        if (NS >= 1) hs1[j] = s1g[OFF[2 * L - 1] + j];
        if (NS >= 2) hs2[j] = s2g[OFF[2 * L - 1] + j];
    }
    for (int e = tid; e < C * hcnt; e += NT) {
        const int k = e / hcnt, u = e % hcnt;
        st_cg(scr + SC.headw[0] + k * HW + hu0 + u, rnd(ld_cg(Wh + (long long)k * HW + hu0 + u)));
    }
    __syncthreads();

    u32 keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, st->epoch, keys);
    const u32 epoch_in_fit = st->epoch_in_fit;
    const u64 step0 = st->step0;
    double loss_acc = 0.0, ok_acc = 0.0;  // CTA 0, lane 0 of each warp: the rows this warp took
#ifdef GRID_PROFILE
    for (int q = 0; q < NPHASE; ++q) c.prof[q] = 0;
    c.prof_t = clock64();
#endif

    for (int s = 0; s < steps; ++s) {
        const int m = min(batch, (int)n - s * batch);
        const int par = s & 1;
        c.m = m;
        c.par = par;
        c.step = s;
        const u64 k = (u64)epoch_in_fit * steps + s;
        const Opt op{prm, optim_step<OPT>(prm, st->lr[k], step0 + k + 1)};  // Adam counts steps from 1
        // -- the step's samples: keyed order, labels (a regression's rows carry their sample index)
        for (int i = tid; i < m; i += NT) {
            const int src = (int)permuted_index(keys, half_bits, n, (u32)(s * batch + i));
            idx[i] = src;
            lab[i] = GRID_LOSS == 1 ? src : y[src];
        }
        __syncthreads();
        PROF(0);

        // -- forward: hidden layers, a round after each
        forward<0>(c);
        PROF(1);
        grid_round(c.counter, c.rounds, s);
        PROF(2);
        forward_from<1>(c);

        // -- head (every CTA, all rows): logits, loss, dlogits in place
        float* lg = c.priv + SC.logits;
        const float* Hl = scr + SC.h[par][NH - 1];
        const float* Zl = scr + SC.z[par][NH - 1];
        const float* Wc = scr + SC.headw[par];
        gemm<tn_for(C)>(
            c.tl, m, C, HW, [&](int i, int kk) { return ld_cg(Hl + i * HW + kk); },
            [&](int j, int kk) { return ld_cg(Wc + j * HW + kk); }, [&](int i, int j, float v) { lg[i * C + j] = v + hb[j]; });
        const float inv_rows = 1.f / (float)m;
        const float mse_scale = (float)(2.0 / ((double)m * C));  // rounded once, as the NumPy engine's
        for (int i = warp; i < m; i += NW) {
            float* z = lg + i * C;
            if constexpr (GRID_LOSS == 1) {  // the mean over the outputs of (z - t)^2; dz = 2 (z - t) / (rows * C)
                const float* t = reinterpret_cast<const float*>(y) + (u64)lab[i] * C;
                float sq = 0.f;
                for (int j = lane; j < C; j += 32) {
                    const float d = z[j] - t[j];
                    sq += d * d;
                }
                sq = warp_sum(sq);
                if (lane == 0) loss_acc += (double)(sq / (float)C);
                __syncwarp();
                for (int j = lane; j < C; j += 32) z[j] = (z[j] - t[j]) * mse_scale;
            } else {
                float zmax = __int_as_float(0xff800000);  // -inf
                int best = 0x7fffffff;
                for (int j = lane; j < C; j += 32)
                    if (argmax_takes(z[j], zmax)) { zmax = z[j]; best = j; }
                warp_argmax(zmax, best);  // first maximum (and first NaN) wins, as numpy.argmax
                float sum = 0.f;
                for (int j = lane; j < C; j += 32) sum += expf(z[j] - zmax);
                sum = warp_sum(sum);
                const int label = lab[i];
                const float zl = z[label];
                if (lane == 0) {
                    loss_acc += (double)(logf(sum) - (zl - zmax));
                    ok_acc += best == label ? 1.0 : 0.0;
                }
                __syncwarp();
                for (int j = lane; j < C; j += 32) z[j] = (expf(z[j] - zmax) / sum - (j == label ? 1.f : 0.f)) * inv_rows;
            }
        }
        __syncthreads();
        PROF(4);

        // -- head backward: bias (replicated, same order everywhere), the last hidden layer's whole dZ (from the
        // operand copy, before any update), then this CTA's columns of the head: gradient into the optimizer step,
        // and the next step's operand copy.
        for (int j = tid; j < C; j += NT) {
            float g = 0.f;
            for (int i = 0; i < m; ++i) g += lg[i * C + j];
            hg[j] = g;
        }
        __syncthreads();
        for (int j = tid; j < C; j += NT) {
            float w = hb[j], m1 = NS >= 1 ? hs1[j] : 0.f, m2 = NS >= 2 ? hs2[j] : 0.f;
            optim_update<OPT>(op.p, op.o, NS, hg[j], w, m1, m2);
            if (PREC == 2) w = rnd(w);
            hb[j] = w;
            if (NS >= 1) hs1[j] = m1;
            if (NS >= 2) hs2[j] = m2;
        }
        float* dzh = c.priv + SC.dzh;
        gemm<tn_for(HW)>(
            c.tl, m, HW, C, [&](int i, int j) { return rnd(lg[i * C + j]); },
            [&](int u, int j) { return ld_cg(Wc + j * HW + u); },
            [&](int i, int u, float v) { dzh[i * HW + u] = rnd(v * act_grad(ld_cg(Zl + i * HW + u))); });
        if (hcnt > 0) {
            float* Wn = scr + SC.headw[par ^ 1];
            gemm<tn_for(NBH)>(
                c.tl, C, hcnt, m, [&](int j, int i) { return rnd(lg[i * C + j]); },
                [&](int u, int i) { return ld_cg(Hl + i * HW + hu0 + u); },
                [&](int j, int u, float g) {
                    const long long e = (long long)j * HW + hu0 + u;
                    st_cg(Wn + e, rnd(update_elem(params, s1g, s2g, OFF[2 * L - 2] + e, g, op)));
                });
        }
        PROF(5);

        // -- backward through hidden layers NH-1 .. 1 (column-owned), a round after each but the last
        backward_from<NH - 1>(c, op);

        // -- layer 0 (row-owned): its bias and weight steps from this CTA's dZ_0 slice
        {
            const int u0 = cta * NB0, cnt = max(0, min(NB0, SZ[1] - u0));
            const float* dz0 = c.priv + SC.dz0;
            auto dz = [&](int i, int u) {  // u counts from this CTA's first unit
                return NH == 1 ? dzh[i * HW + u0 + u] : dz0[i * NB0 + u];
            };
            bias_step<0>(c, op, [&](int i, int uu) { return dz(i, uu - u0); });
            if (cnt > 0)
                gemm<tn_for(D)>(
                    c.tl, cnt, D, m, [&](int u, int i) { return dz(i, u); }, [&](int kk, int i) { return xval(c, i, kk); },
                    [&](int u, int kk, float g) {
                        update_elem(params, s1g, s2g, OFF[0] + (long long)(u0 + u) * D + kk, g, op);
                    });
        }
        PROF(8);
    }

    // -- epoch end: the fp16 copy of what this CTA owns ("mixed"), the head bias (CTA 0), the loss and correct count
    if (w16 != nullptr) half_copy_from<0>(c, w16);
    if (cta == 0) {
        for (int j = tid; j < C; j += NT) {
            const int g = OFF[2 * L - 1] + j;
            params[g] = from_f<TP>(hb[j]);
            if (NS >= 1) s1g[g] = hs1[j];
            if (NS >= 2) s2g[g] = hs2[j];
            if (w16 != nullptr) w16[g] = from_f<half_t>(hb[j]);
        }
        double* acc = reinterpret_cast<double*>(sm + SL.acc);
        if (lane == 0) {
            acc[2 * warp] = loss_acc;
            acc[2 * warp + 1] = ok_acc;
        }
        __syncthreads();
        if (tid == 0) {
            double l = 0.0, ok = 0.0;
            for (int w = 0; w < NW; ++w) {
                l += acc[2 * w];
                ok += acc[2 * w + 1];
            }
            st->hist[2 * epoch_in_fit] += l;
            st->hist[2 * epoch_in_fit + 1] += ok;
        }
    }
#ifdef GRID_PROFILE
    PROF(9);
    if (cta == 0 && tid == 0) {
        long long* out = reinterpret_cast<long long*>(sync + 32);  // bytes 128..
        for (int q = 0; q < NPHASE; ++q) out[q] = c.prof[q];
        out[NPHASE] = steps;
        out[NPHASE + 1] = c.rounds;
    }
#endif
}

extern "C" __global__ void __launch_bounds__(GRID_NT, 1)
grid_epoch_kernel(TParam* params, float* s1, float* s2, half_t* w16, const TX* x, const int* y, u32 n, u32 seed_lo,
                  u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch, float scale, float shift,
                  OptimParams opt, float* scratch, u32* sync) {
#if __CUDA_ARCH__ >= 900
    grid_epoch<TParam>(params, s1, s2, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, shift, opt,
                       scratch, sync);
#else
    __trap();  // grid/plan.py refuses GPUs older than sm_90
#endif
}
