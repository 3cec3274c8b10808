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
//   PRIV[p]     CTA p's own logits/dlogits (B x C), the last hidden layer's whole dZ (B x width), its slice of dZ_0
//               (B x NB_0) and the step's inputs as operands (B x D): only CTA p, ordered by __syncthreads.
// Every scratch access goes through L2 (ld/st.global.cg), the CTA's own regions too.
// Products (v1): scalar fp32 FMA from shared-memory tiles (K chunks of 64, the next chunk prefetched into registers),
// each thread a 2x2 block of outputs summed over k in ascending order: deterministic, no float atomics. Operands and
// outputs are described as data (Operand, Emit), so one compiled product per tile shape serves every call site.
#include "activation.cuh"
#include "common.cuh"
#include "optim.cuh"
#include "shuffle.cuh"
#include "sm90.cuh"

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
    long long h[2][NH], z[2][NH], dz[NH], headw[2], priv, logits, dzh, dz0, xs, priv_stride, total;
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
    s.xs = s.dz0 + up32((long long)B * NB0);
    s.priv_stride = s.xs + up32((long long)B * D);
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
__device__ __noinline__ void grid_round(u32* counter, u32& rounds, int step) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 target = (u32)P * (rounds + 1);
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        u32 polls = 0, v;
        u64 t0 = 0;
        while (true) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
            if ((int)(v - target) >= 0) break;
            if (wait_expired(polls, t0)) {
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

// ---- numerics shared with the other engines (activation.cuh) -------------------------------------------------
__device__ __forceinline__ float rnd(float x) { return round_operand<PREC>(x); }
__device__ __forceinline__ float act(float z) { return activation<GRID_ACT>(z); }
__device__ __forceinline__ float act_grad(float z) { return activation_grad<GRID_ACT>(z); }

// ---- the optimizer step of one element of the flat state (optim.cuh's arithmetic, as update.cu and fused.cu) ----
struct Opt {
    OptimParams p;
    OptimStep o;
};
__device__ __noinline__ float update_elem(TParam* params, float* s1g, float* s2g, long long e, float g,
                                          const Opt op) {
    float w = ld_cg(params + e);
    float m = NS >= 1 ? ld_cg(s1g + e) : 0.f, v = NS >= 2 ? ld_cg(s2g + e) : 0.f;
    optim_update<OPT>(op.p, op.o, NS, g, w, m, v);
    if (PREC == 2) w = rnd(w);  // "fp16" stores its weights in fp16
    st_cg(params + e, w);
    if (NS >= 1) st_cg(s1g + e, m);
    if (NS >= 2) st_cg(s2g + e, v);
    return w;
}

// ---- what a step's products read and write, as data: one compiled product serves every layer ----------------------
struct Ctx {
    TParam* params;
    float* s1g;
    float* s2g;
    float* scr;      // global scratch
    float* priv;     // this CTA's region of it
    float* tl;       // product tiles (shared)
    const float* hb;  // the head bias (shared)
    Opt op;
    int cta, m, par, step;
    u32* counter;    // the rounds' counter (sync word 0)
    u32 rounds;      // rounds this CTA has passed in this launch
#ifdef GRID_PROFILE
    long long prof[NPHASE];
    long long prof_t;
#endif
};

// An operand: element (i, k) at base + i * ri + k * rk of fp32 scratch, or of the parameters (param: TParam, which
// is fp16 in "fp16"), rounded as an operand where rnd is set. Always through L2 (ld.global.cg).
struct Operand {
    const void* p;
    long long ri, rk;
    bool param, round;
};
__device__ __forceinline__ float load_op(const Operand& a, int i, int k) {
    const long long e = i * a.ri + k * a.rk;
    const float v = (PREC == 2 && a.param) ? ld_cg(reinterpret_cast<const half_t*>(a.p) + e)
                                           : ld_cg(reinterpret_cast<const float*>(a.p) + e);
    const float r = rnd(v);
    return a.round ? r : v;  // a select, not a branch: the chunk's loads stay one straight run
}

// What becomes of output (i, j) = v:
//   E_FWD     z = v + rnd(bias[j]) (bias: parameter index b2 + j); H[i, j] = rnd(act(z)) at out, Z[i, j] = z (rounded
//             in "mixed"/"fp16") at out2, both at b + i * ri + j;
//   E_LOGITS  out[b + i * ri + j] = v + head bias[j];
//   E_ACTGRAD out[b + i * ri + j] = rnd(v * act'(zin[b2 + i * ri2 + j]));
//   E_UPDATE  the optimizer step of parameter b + i * ri + j * rj with gradient v; where out is set, the new weight
//             rounded as an operand at out[b2 + i * ri + j * rj] (the head's next operand copy).
enum { E_FWD, E_LOGITS, E_ACTGRAD, E_UPDATE };
struct Emit {
    int kind;
    float* out;
    float* out2;
    const float* zin;
    long long b, ri, rj, b2, ri2;
};
__device__ __noinline__ void emit_one(const Ctx& c, const Emit& e, int i, int j, float v) {
    if (e.kind == E_FWD) {
        float z = v + rnd(ld_cg(c.params + e.b2 + j));
        const float h = rnd(act(z));
        z = PREC == 0 ? z : rnd(z);
        st_cg(e.out + e.b + i * e.ri + j, h);
        st_cg(e.out2 + e.b + i * e.ri + j, z);
    } else if (e.kind == E_LOGITS) {
        st_cg(e.out + e.b + i * e.ri + j, v + c.hb[j]);
    } else if (e.kind == E_ACTGRAD) {
        st_cg(e.out + e.b + i * e.ri + j, rnd(v * act_grad(ld_cg(e.zin + e.b2 + i * e.ri2 + j))));
    } else {
        const long long q = i * e.ri + j * e.rj;
        const float w = update_elem(c.params, c.s1g, c.s2g, e.b + q, v, c.op);
        if (e.out != nullptr) st_cg(e.out + e.b2 + q, rnd(w));
    }
}

// ---- products ---------------------------------------------------------------------------------------------------
// out(i, j) = sum_{k < K} A(i, k) * B(j, k) for i < M, j < N, handed to emit_one. A CTA tile is TM x TN outputs
// (TM * TN = 1024: 2x2 per thread); K runs in chunks of KC staged in shared memory k-major (As[k][i], Bs[k][j]), the
// next chunk's operands loaded into registers while this one computes. Outside the shape the operands read as zero;
// every output sums k in ascending order (the same bits on every run and every CTA). Not inlined: one copy per tile
// shape serves every call (code size, grid.md rule 5).
__host__ __device__ constexpr int tn_for(int n) { return n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : 64; }
template <int TN>
__device__ __noinline__ void gemm(const Ctx& c, int M, int N, int K, const Operand A, const Operand B, const Emit e) {
    constexpr int TM = 1024 / TN, TX = TN / 2, AS = TM + 4, BS = TN + 4;
    static_assert(AS + BS <= TILE_W, "tile wider than the shared-memory plan");
    constexpr int EA = TM * KC / NT, EB = TN * KC / NT;
    static_assert(EA * NT == TM * KC && EB * NT == TN * KC, "a chunk's operands split evenly over the threads");
    float* As = c.tl;
    float* Bs = c.tl + KC * AS;
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    for (int i0 = 0; i0 < M; i0 += TM) {
        for (int j0 = 0; j0 < N; j0 += TN) {
            float ra[EA], rb[EB];
            float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
            // One call site each for the loads and the arithmetic: iteration ch loads chunk ch into registers while
            // it computes chunk ch - 1 from shared memory, then stores chunk ch.
            const int chunks = cdiv(K, KC);
            for (int ch = 0; ch <= chunks; ++ch) {
                if (ch < chunks) {
                    const int k0 = ch * KC;
#pragma unroll
                    for (int q = 0; q < EA; ++q) {
                        const int t = tid + q * NT, k = t % KC, i = t / KC;
                        ra[q] = (i0 + i < M && k0 + k < K) ? load_op(A, i0 + i, k0 + k) : 0.f;
                    }
#pragma unroll
                    for (int q = 0; q < EB; ++q) {
                        const int t = tid + q * NT, k = t % KC, j = t / KC;
                        rb[q] = (j0 + j < N && k0 + k < K) ? load_op(B, j0 + j, k0 + k) : 0.f;
                    }
                }
                if (ch > 0) {
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
                if (ch == chunks) break;
                __syncthreads();  // the previous chunk's (or product's) readers are done with the tiles
#pragma unroll
                for (int q = 0; q < EA; ++q) {
                    const int t = tid + q * NT;
                    As[(t % KC) * AS + t / KC] = ra[q];
                }
#pragma unroll
                for (int q = 0; q < EB; ++q) {
                    const int t = tid + q * NT;
                    Bs[(t % KC) * BS + t / KC] = rb[q];
                }
                __syncthreads();
            }
            for (int r = 0; r < 2; ++r)
                for (int q = 0; q < 2; ++q) {
                    const int i = i0 + 2 * ty + r, j = j0 + 2 * tx + q;
                    if (i < M && j < N) emit_one(c, e, i, j, acc[r][q]);
                }
        }
    }
    __syncthreads();  // every emit done (they may write what the next phase reads)
}
template <int NMAX>
__device__ __forceinline__ void product(const Ctx& c, int M, int N, int K, const Operand& A, const Operand& B,
                                        const Emit& e) {
    gemm<tn_for(NMAX)>(c, M, N, K, A, B, e);
}

// ---- the step's phases --------------------------------------------------------------------------------------------
__device__ __forceinline__ Operand op_f32(const float* p, long long ri, long long rk, bool round = false) {
    return Operand{p, ri, rk, false, round};
}
__device__ __forceinline__ Operand op_param(const TParam* p, long long ri, long long rk) {
    return Operand{p, ri, rk, true, true};
}

// The exchange buffers of step parity par (compile-time layer: the layout's offsets stay constants).
template <int l> __device__ __forceinline__ float* h_buf(float* scr, int par) {
    return scr + (par ? SC.h[1][l] : SC.h[0][l]);
}
template <int l> __device__ __forceinline__ float* z_buf(float* scr, int par) {
    return scr + (par ? SC.z[1][l] : SC.z[0][l]);
}
__device__ __forceinline__ float* headw_buf(float* scr, int par) { return scr + (par ? SC.headw[1] : SC.headw[0]); }

// Forward of hidden layer l for this CTA's units: Z, H = act(Z) into the exchange buffers of the step's parity.
template <int l>
__device__ __forceinline__ void forward(const Ctx& c) {
    constexpr int K = SZ[l], W = SZ[l + 1], NB = nb_of(l);
    const int u0 = c.cta * NB, cnt = max(0, min(NB, W - u0));
    if (cnt == 0) return;
    const Operand A = l == 0 ? op_f32(c.priv + SC.xs, D, 1) : op_f32(h_buf<(l > 0 ? l - 1 : 0)>(c.scr, c.par), K, 1);
    const Operand B = op_param(c.params + OFF[2 * l] + (long long)u0 * K, K, 1);
    const Emit e{E_FWD, h_buf<l>(c.scr, c.par), z_buf<l>(c.scr, c.par), nullptr, u0, W, 0, OFF[2 * l + 1] + u0, 0};
    product<NB>(c, c.m, cnt, K, A, B, e);
}

// The bias step of this CTA's units [u0, u0 + cnt) of a hidden layer whose bias starts at parameter `bias`, from
// dZ (m rows of stride ldz; the CTA's first unit at column col0): the gradient is the column sum in row order.
__device__ __noinline__ void bias_step(const Ctx& c, long long bias, int cnt, const float* dz, int ldz, int col0) {
    for (int j = threadIdx.x; j < cnt; j += NT) {
        float g = 0.f;
        for (int i = 0; i < c.m; ++i) g += ld_cg(dz + i * ldz + col0 + j);
        update_elem(c.params, c.s1g, c.s2g, bias + j, g, c.op);
    }
}

// Backward through layer l >= 1 (hidden, not the head) from its whole dZ (dzl, rows of stride SZ[l+1]): this CTA's
// bias units of layer l; dZ_{l-1} of its units of layer l-1 (into the exchange buffer, or its own dZ_0 slice); the
// step of its column block W_l[:, U_p(l-1)].
template <int l>
__device__ __forceinline__ void backward(const Ctx& c, const float* dzl) {
    constexpr int K = SZ[l], W = SZ[l + 1], NB = nb_of(l - 1), NBL = nb_of(l);
    {
        const int v0 = c.cta * NBL;
        bias_step(c, OFF[2 * l + 1] + v0, max(0, min(NBL, W - v0)), dzl, W, v0);
    }
    const int u0 = c.cta * NB, cnt = max(0, min(NB, K - u0));
    if (cnt == 0) return;
    const float* Zp = z_buf<l - 1>(c.scr, c.par);
    const float* Hp = h_buf<l - 1>(c.scr, c.par);
    // dgrad: dH_{l-1}[i, u] = sum_k dZ_l[i, k] W_l[k, u], then dZ_{l-1} = rnd(dH act'(Z)), before the update below
    const Emit dg = l - 1 >= 1 ? Emit{E_ACTGRAD, c.scr + SC.dz[l - 1], nullptr, Zp, u0, K, 0, u0, K}
                               : Emit{E_ACTGRAD, c.priv + SC.dz0, nullptr, Zp, 0, NB0, 0, u0, K};
    product<NB>(c, c.m, cnt, W, op_f32(dzl, W, 1), op_param(c.params + OFF[2 * l] + u0, 1, K), dg);
    // weight gradient dW_l[k, u] = sum_i dZ_l[i, k] H_{l-1}[i, u], straight into the optimizer step
    const Emit up{E_UPDATE, nullptr, nullptr, nullptr, OFF[2 * l] + u0, K, 1, 0, 0};
    product<NB>(c, W, cnt, c.m, op_f32(dzl, 1, W), op_f32(Hp + u0, 1, K), up);
}

// Forward of hidden layers l .. NH-1, a round after each.
template <int l>
__device__ __forceinline__ void forward_from(Ctx& c) {
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
template <int l>
__device__ __forceinline__ void backward_from(Ctx& c) {
    if constexpr (l >= 1) {
        backward<l>(c, l == NH - 1 ? c.priv + SC.dzh : c.scr + SC.dz[l]);
        PROF(6);
        if constexpr (l >= 2) {
            grid_round(c.counter, c.rounds, c.step);
            PROF(7);
        }
        backward_from<l - 1>(c);
    }
}

// Epoch end, "mixed": the fp16 copy (what evaluation's GEMMs read) of everything this CTA owns, layers l .. L-1.
template <int l>
__device__ __forceinline__ void half_copy_from(const Ctx& c, half_t* w16) {
    if constexpr (l < L) {
        constexpr int K = SZ[l], W = SZ[l + 1];
        const int tid = threadIdx.x;
        if constexpr (l == 0) {  // rows
            const int u0 = c.cta * NB0, cnt = max(0, min(NB0, W - u0));
            for (int e = tid; e < cnt * K; e += NT) {
                const long long g = OFF[0] + (long long)u0 * K + e;
                w16[g] = from_f<half_t>(ld_cg(c.params + g));
            }
        } else {  // columns
            constexpr int NB = nb_of(l - 1);
            const int u0 = c.cta * NB, cnt = max(0, min(NB, K - u0));
            for (int e = tid; e < W * cnt; e += NT) {
                const long long g = OFF[2 * l] + (long long)(e / cnt) * K + u0 + e % cnt;
                w16[g] = from_f<half_t>(ld_cg(c.params + g));
            }
        }
        if constexpr (l < NH) {  // hidden biases by unit
            constexpr int NB = nb_of(l);
            const int u0 = c.cta * NB, cnt = max(0, min(NB, W - u0));
            for (int j = tid; j < cnt; j += NT)
                w16[OFF[2 * l + 1] + u0 + j] = from_f<half_t>(ld_cg(c.params + OFF[2 * l + 1] + u0 + j));
        }
        half_copy_from<l + 1>(c, w16);
    }
}

__device__ void grid_epoch(TParam* params, float* s1g, float* s2g, half_t* w16, const TX* __restrict__ x,
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
    Ctx c{};
    c.params = params;
    c.s1g = s1g;
    c.s2g = s2g;
    c.scr = scr;
    c.priv = scr + SC.priv + (long long)cta * SC.priv_stride;
    c.tl = sm + SL.tiles;
    c.hb = hb;
    c.op.p = prm;
    c.cta = cta;
    c.counter = sync;
    c.rounds = 0;
    constexpr int NBH = nb_of(NH - 1);  // this CTA's columns of the head: its units of the last hidden layer
    const int hu0 = cta * NBH, hcnt = max(0, min(NBH, HW - hu0));
    const TParam* Wh = params + OFF[2 * L - 2];

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
    float* lg = c.priv + SC.logits;  // the logits, then dlogits (m x C)
    float* dzh = c.priv + SC.dzh;    // the last hidden layer's whole dZ (m x HW)
    float* xs = c.priv + SC.xs;      // the step's inputs as operands (m x D)

    for (int s = 0; s < steps; ++s) {
        const int m = min(batch, (int)n - s * batch);
        const int par = s & 1;
        c.m = m;
        c.par = par;
        c.step = s;
        const u64 k = (u64)epoch_in_fit * steps + s;
        c.op.o = optim_step<OPT>(prm, st->lr[k], step0 + k + 1);  // Adam counts steps from 1
        // -- the step's samples: keyed order, labels (a regression's rows carry their sample index), the inputs mapped
        // and rounded once into this CTA's operand rows
        for (int i = tid; i < m; i += NT) {
            const int src = (int)permuted_index(keys, half_bits, n, (u32)(s * batch + i));
            idx[i] = src;
            lab[i] = GRID_LOSS == 1 ? src : y[src];
        }
        __syncthreads();
        for (int e = tid; e < m * D; e += NT) {
            const int i = e / D, kk = e % D;
            st_cg(xs + e, rnd(to_f(x[(u64)idx[i] * D + kk]) * scale + shift));
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
        const float* Hl = h_buf<NH - 1>(scr, par);
        const float* Zl = z_buf<NH - 1>(scr, par);
        const float* Wc = headw_buf(scr, par);
        product<C>(c, m, C, HW, op_f32(Hl, HW, 1), op_f32(Wc, HW, 1),
                   Emit{E_LOGITS, lg, nullptr, nullptr, 0, C, 0, 0, 0});
        const float inv_rows = 1.f / (float)m;
        const float mse_scale = (float)(2.0 / ((double)m * C));  // rounded once, as the NumPy engine's
        for (int i = warp; i < m; i += NW) {
            float* z = lg + i * C;
            if constexpr (GRID_LOSS == 1) {  // the mean over the outputs of (z - t)^2; dz = 2 (z - t) / (rows * C)
                const float* t = reinterpret_cast<const float*>(y) + (u64)lab[i] * C;
                float sq = 0.f;
                for (int j = lane; j < C; j += 32) {
                    const float d = ld_cg(z + j) - t[j];
                    sq += d * d;
                }
                sq = warp_sum(sq);
                if (lane == 0) loss_acc += (double)(sq / (float)C);
                for (int j = lane; j < C; j += 32) st_cg(z + j, (ld_cg(z + j) - t[j]) * mse_scale);
            } else {
                float zmax = __int_as_float(0xff800000);  // -inf
                int best = 0x7fffffff;
                for (int j = lane; j < C; j += 32) {
                    const float zj = ld_cg(z + j);
                    if (argmax_takes(zj, zmax)) { zmax = zj; best = j; }
                }
                warp_argmax(zmax, best);  // first maximum (and first NaN) wins, as numpy.argmax
                float sum = 0.f;
                for (int j = lane; j < C; j += 32) sum += expf(ld_cg(z + j) - zmax);
                sum = warp_sum(sum);
                const int label = lab[i];
                const float zl = ld_cg(z + label);
                if (lane == 0) {
                    loss_acc += (double)(logf(sum) - (zl - zmax));
                    ok_acc += best == label ? 1.0 : 0.0;
                }
                __syncwarp();  // every lane has read z[label] before any lane overwrites it
                for (int j = lane; j < C; j += 32)
                    st_cg(z + j, (expf(ld_cg(z + j) - zmax) / sum - (j == label ? 1.f : 0.f)) * inv_rows);
            }
        }
        __syncthreads();
        PROF(4);

        // -- head backward: bias (replicated, same order everywhere), the last hidden layer's whole dZ (from the
        // operand copy, before any update), then this CTA's columns of the head: gradient into the optimizer step,
        // and the next step's operand copy.
        for (int j = tid; j < C; j += NT) {
            float g = 0.f;
            for (int i = 0; i < m; ++i) g += ld_cg(lg + i * C + j);
            hg[j] = g;
        }
        __syncthreads();
        for (int j = tid; j < C; j += NT) {
            float w = hb[j], m1 = NS >= 1 ? hs1[j] : 0.f, m2 = NS >= 2 ? hs2[j] : 0.f;
            optim_update<OPT>(c.op.p, c.op.o, NS, hg[j], w, m1, m2);
            if (PREC == 2) w = rnd(w);
            hb[j] = w;
            if (NS >= 1) hs1[j] = m1;
            if (NS >= 2) hs2[j] = m2;
        }
        product<HW>(c, m, HW, C, op_f32(lg, C, 1, true), op_f32(Wc, 1, HW),
                    Emit{E_ACTGRAD, dzh, nullptr, Zl, 0, HW, 0, 0, HW});
        if (hcnt > 0)
            product<NBH>(c, C, hcnt, m, op_f32(lg, 1, C, true), op_f32(Hl + hu0, 1, HW),
                         Emit{E_UPDATE, headw_buf(scr, par ^ 1), nullptr, nullptr, OFF[2 * L - 2] + hu0, HW, 1,
                              hu0, 0});
        PROF(5);

        // -- backward through hidden layers NH-1 .. 1 (column-owned), a round after each but the last
        backward_from<NH - 1>(c);

        // -- layer 0 (row-owned): its bias and weight steps from this CTA's dZ_0 slice
        {
            const int u0 = cta * NB0, cnt = max(0, min(NB0, SZ[1] - u0));
            const float* dz0 = NH == 1 ? dzh + u0 : c.priv + SC.dz0;  // column u of this CTA's slice
            const int ld0 = NH == 1 ? HW : NB0;
            bias_step(c, OFF[1] + u0, cnt, dz0, ld0, 0);
            if (cnt > 0)
                product<D>(c, cnt, D, m, op_f32(dz0, 1, ld0), op_f32(xs, 1, D),
                           Emit{E_UPDATE, nullptr, nullptr, nullptr, OFF[0] + (long long)u0 * D, D, 1, 0, 0});
        }
        PROF(8);
    }

    // -- epoch end: the fp16 copy of what this CTA owns ("mixed"), the head bias (CTA 0), the loss and correct count
    if (w16 != nullptr) half_copy_from<0>(c, w16);
    if (cta == 0) {
        for (int j = tid; j < C; j += NT) {
            const int g = OFF[2 * L - 1] + j;
            params[g] = from_f<TParam>(hb[j]);
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
    grid_epoch(params, s1, s2, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, shift, opt, scratch,
               sync);
#else
    __trap();  // grid/plan.py refuses GPUs older than sm_90
#endif
}
