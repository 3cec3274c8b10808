// fused_logreg.cu: a whole training epoch of LOGISTIC REGRESSION (sizes [d, C], no hidden layer) in ONE persistent
// kernel on a thread-block cluster of S CTAs (issue 25; the design and its measurements: ../shared/design/fused-v2.md,
// the probe it is ported from: ../shared/probes/fused_floor/logreg_probe.cu).
//
// What it computes: the same epoch as fused.cu, the graph engine and the NumPy engine (the definition): for each step
// s, the batch of positions [s*batch, s*batch + rows) in the epoch's keyed order (shuffle.cuh), x*scale + shift
// (uint8 x, scalar scale and shift); logits z = W x + b; softmax cross-entropy averaged over the rows (log-sum-exp,
// argmax first-max-wins as loss.cu); dlogits (p - onehot) / rows (zero for the rows a short last batch lacks); the
// weight and bias gradients; the optimizer step (optim.cuh's optim_update: SGD with momentum/Nesterov/weight decay,
// or AdamW) at st->lr[epoch_in_fit * steps + s]. The epoch's loss sum and correct count are added to
// st->hist[2 * epoch_in_fit + {0, 1}]. Parameters and optimizer state come from the engine's flat training state
// (params, s1, s2 at the parameter layout's offsets) at the start and go back at the end, with the fp16 copy w16 in
// "mixed", exactly as fused.cu does it, so evaluation, divergence checks, snapshots and checkpoints are unchanged.
// Precisions: "mixed" (fp32 masters, fp16 operands) and "fp16" (masters rounded to fp16 after every update, params
// stored as fp16); the products are mma.sync m16n8k16 with fp16 operands and fp32 accumulation.
//
// Launch: grid = one cluster of LR_S CTAs (1, 2, 4 or 8), block = 384 threads (8 consumer warps, 4 producer warps),
// dynamic shared memory = LR_SMEM bytes (fused/plan.py's logreg_smem_bytes; a static_assert checks the layout
// needs no more). sm_90 (clusters, mbarriers with transaction counts, bulk copies into peer CTAs).
//
// Partition: the d input features in 16-byte chunks (ceil(d/16) of them), CTA r owns chunks [r*K/S, (r+1)*K/S);
// the widest CTA holds NCH chunks and the narrower ones pad with zero chunks. Consumer warp w owns chunks w, w+8 of
// its CTA in the weight gradient and the update (its lanes hold their fp32 masters in registers), and rows
// 16w..16w+15 of the batch in the forward and the softmax. Producer thread p gathers batch row p.
//
// A step (consumers):                                                     (producers, up to LR_ST steps ahead)
//   wait full[stage]                                                        wait empty[stage]
//   forward: partial logits of the CTA's features, rows 16w.., mma.sync     Feistel index and label of row p,
//     (uint8 pixel x fed as the fp16 subnormal x * 2^-24: one PRMT per      the CTA's slice of every row by
//     two pixels; scale * 2^24 applied to the fp32 accumulators, and          cp.async (16, 8 or 4 bytes) whose
//     shift * colsum(W16) added for a nonzero shift)                          completion arrives on full[stage]
//   partials -> own slot; one bulk copy of the warp's 16 rows to each peer,   (d not a multiple of 4: plain
//     completing on the peer's exchange mbarrier (byte-counted)               loads and a plain arrive)
//   B0 (named barrier, 256 consumer threads); wait exchange[s & 1]          step constants (lr, Adam's bias
//   softmax, loss, argmax, dlogits of all rows in EVERY CTA (fixed-order      corrections, rows) by thread 0,
//     sum over the S slots: identical bits everywhere); dlogits^T fp16;       released by a plain arrive
//     per-warp bias-gradient partials
//   B1; thread 0 re-arms exchange[s & 1] for step s + 2
//   weight gradient (m = class, n = feature, k = row) on tensor cores; the optimizer step applied straight from the
//     accumulators to the register masters; only the fp16 copy W16 rewritten; the bias (replicated: the same
//     arithmetic on the same numbers in every CTA) by warp 7; arrive empty[stage]
//   B2
// No cluster barrier inside the loop (one at the start: every CTA's mbarriers exist; one at the end: no CTA leaves
// while a peer may still copy into it).
//
// Memory plan (per CTA): registers: the fp32 masters of the warp's chunks (8 a lane a chunk, at most 2 chunks) and,
// for SGD with momentum, the momentum buffer beside them (16 more); shared memory: LR_ST stages of staged uint8 rows
// (rows x ROWB bytes, ROWB an odd number of 16-byte chunks: conflict-free fragment loads), the fp16 operand copy W16
// [16 classes][NCH*16], dlogits^T fp16 [16][rows + 8], the partial logits [2 parities][S ranks][rows][CE] fp32, labels,
// sample indices and step constants per stage, the bias with its optimizer state, per-warp bias-gradient partials
// and W16 column sums, per-warp loss sums, AdamW's two moments (each lane's 16 per chunk, beside nothing else: they
// do not fit in registers beside the fragments), the mbarriers. Global memory: the training set (read once a
// step), the lr table, the history, the training state at the start and the end.
//
// Rounds and visibility, per buffer (s = step, B0/B1/B2 the CTA's consumer barriers of a step):
//   staged rows, labels, indices, step constants [stage]: written by producers (cp.async / stores), visible after the
//     full[stage] wait (mbarrier phase completion: cp.async arrivals and thread 0's release arrive); rewritten only
//     after every consumer warp arrived on empty[stage] (after its last read, the weight gradient).
//   partial logits [s & 1][rank]: own slot written before B0 (generic stores, fence.proxy.async before the bulk
//     copy reads it); peer slots land by bulk copy, visible after the exchange[s & 1] wait (acquire.cluster); read
//     between B0 and B1; thread 0 re-arms the barrier after B1. The same buffer is written again at step s + 2: a
//     peer sends step s + 2 only after it received this CTA's step s + 1 partials, which leave after B2 of step s,
//     after the re-arm (causality replaces a WAR barrier); likewise a source slot is overwritten at s + 2 only after
//     every peer acknowledged (by sending s + 1) that its step-s copy landed.
//   W16: read in the forward (before B0), written in the update (between B1 and B2).
//   dlogits^T, bias-gradient partials: written in the softmax (B0..B1), read in the weight gradient (B1..B2).
//   bias: read in the softmax (B0..B1), written by warp 7 in the update (B1..B2).
//   W16 column sums (nonzero shift): written in the update (B1..B2), read in the next forward (before B0).
//
// Code: logreg_epoch is a driver over phase functions, top to bottom: start_cta (shared memory zeroed, mbarriers),
// the consumers' load_masters, write_w16 and load_bias, then per step forward, softmax, the weight gradient with the
// optimizer step and the bias update (these two written in the driver: as functions the compiler orders their
// shuffles and sums differently), write_w16, and at the end store_state; the producers run produce. The split kept
// every plan's SASS byte-identical (benchmarks/sass_compare.py --only logreg); keep it so when editing a phase.
#include "fused_head.cuh"
#include "optim.cuh"
#include "shuffle.cuh"

// ---- shape, precision and optimizer: compile-time (-D from fused/plan.py's logreg_plan); defaults: 784 -> 10 ----
#ifndef LR_D
#define LR_D 784
#define LR_C 10
#define LR_S 4
#define LR_BR 128
#define LR_ST 4
#define LR_G 16
#define LR_BOFF 7936
#define LR_PREC 1
#define LR_OPT 0
#define LR_NS 1
#define LR_SHIFT 0
#define LR_SMEM 232448
#endif
#ifndef LR_XF
#define LR_XF 0
#endif

constexpr int D = LR_D;        // input features
constexpr int C = LR_C;        // classes (2..16)
constexpr int S = LR_S;        // CTAs in the cluster
constexpr int BR = LR_BR;      // rows a step: the batch size rounded up to 16
constexpr int ST = LR_ST;      // gather stages
constexpr int G = LR_G;        // bytes per cp.async of a row (16, 8, 4), or 1: plain loads (d not a multiple of 4)
constexpr int BOFF = LR_BOFF;  // element offset of the bias in the flat parameter layout (the weight is at 0)
constexpr int PREC = LR_PREC;  // 1 mixed (fp32 masters, fp16 operands), 2 fp16 (fp16 masters)
constexpr int OPT = LR_OPT;    // optim.cuh's OPTIM_*
constexpr int NS = LR_NS;      // optimizer state arrays
constexpr bool SHIFT = LR_SHIFT != 0;  // a nonzero normalize shift: shift * colsum(W16) joins the logits
// Float32 inputs: the producers stage x * scale + shift rounded to fp16 (the operand fused.cu and the graph engine
// multiply), 2 bytes a feature; uint8 inputs are staged as they are and fed to the tensor cores unconverted.
constexpr bool XF = LR_XF != 0;
constexpr bool ASYNC = !XF && G > 1;  // rows by cp.async (else plain loads and stores, then a plain arrive)
constexpr int NCW = 8, NPW = 4, NT = (NCW + NPW) * 32;
constexpr int NCHUNK = (D + 15) / 16;            // 16-feature chunks of a row
constexpr int NCH = (NCHUNK + S - 1) / S;        // chunks of the widest CTA
// staged row stride: uint8 an odd number of 16-byte chunks, fp16 4 words past a multiple of 8 (fewer conflicts)
constexpr int ROWB = XF ? NCH * 32 + 16 : NCH * 16 + (NCH % 2 == 0 ? 16 : 0);
constexpr int XST = BR * ROWB;                   // bytes of a stage's rows
constexpr int WLD = NCH * 16;                    // W16 row stride (halfs)
constexpr int ZLD = BR + 8;                      // dlogits^T row stride (halfs)
constexpr int CE = C + (C & 1);                  // partial-logit row stride: even, for 8-byte stores
constexpr int NJ = (NCH + NCW - 1) / NCW;        // chunks a consumer warp owns
constexpr int RW = BR / 16;                      // consumer warps with forward/softmax rows
constexpr int CH = (C + 1) / 2;                  // classes a softmax lane takes (two lanes a row)
constexpr int DLD = BR + 20;  // fp32 dlogits [class][row] stride (the bias gradient's columns: 16-byte row loads)
// The upper class tile (classes 8..15): CHI real classes. With 9..15 classes its real weights sit in few lanes (at 10
// classes, 8 lanes of 32 hold them); they are spread over all lanes instead (REDIST), HS slots a lane a chunk, so the
// optimizer step (AdamW's two divisions and a square root a weight) costs 4 + HS weights a lane, not 8.
constexpr int CHI = C > 8 ? C - 8 : 0;
constexpr bool REDIST = CHI > 0 && CHI < 8;
constexpr int HS = REDIST ? (CHI + 1) / 2 : (CHI == 8 ? 4 : 0);
struct HiSlot {
    int g, t, i;  // class 8 + g, feature 4t + i of the chunk: the weight gradient's accumulator 4 + i of lane 4g + t
    bool valid;
};
// Slot q of lane L: element k = 32q + L of the upper tile's CHI * 16 real weights (REDIST), else the lane's own.
__device__ __forceinline__ HiSlot hi_of(int q, int lane) {
    if (!REDIST) return HiSlot{lane >> 2, lane & 3, q, (lane >> 2) + 8 < C};
    const int k = 32 * q + lane, src = k >> 2;
    return HiSlot{src >> 2, src & 3, k & 3, k < CHI * 16};
}
constexpr bool MOM_REG = OPT == OPTIM_SGD && NS == 1;  // SGD's momentum buffer in registers
constexpr bool ADAM = OPT == OPTIM_ADAMW;              // AdamW's moments in shared memory
constexpr u32 XBYTES = (u32)(S - 1) * BR * CE * 4;     // partial logits a CTA receives per step
static_assert(C >= 2 && C <= 16, "one m16n8k16 pair of n-tiles: 2 to 16 classes");
static_assert(BR % 16 == 0 && BR >= 16 && BR <= 128, "one producer thread a row, 16 rows a consumer warp");
static_assert(NJ <= 2 && NCH <= 16, "masters of at most two chunks a lane");
static_assert(S == 1 || S == 2 || S == 4 || S == 8, "a portable cluster");
static_assert(G == 1 || (D % G == 0 && (G == 4 || G == 8 || G == 16)), "cp.async needs aligned rows");
static_assert(!(XF && SHIFT), "float inputs take the shift in the producers' conversion");
static_assert(PREC == 1 || PREC == 2, "fp16 operands: mixed or fp16");
static_assert(ADAM ? NS == 2 : NS <= 1, "SGD keeps 0 or 1 state arrays, AdamW 2");

__host__ __device__ constexpr int up16(int a) { return (a + 15) / 16 * 16; }

struct Lay {  // byte offsets into dynamic shared memory; fused/plan.py's logreg_smem_bytes adds the same parts
    int x, w16, zt, recv, lab, idx, info, bias, gbp, dz, wcs, hist, adam, bar, total;
};
__host__ __device__ constexpr Lay make_lay() {
    Lay y{};
    int o = 0;
    y.x = o; o += up16(ST * XST);
    y.w16 = o; o += up16(16 * WLD * 2);
    y.zt = o; o += up16(16 * ZLD * 2);
    y.recv = o; o += up16((S > 1 ? 2 * S : 1) * BR * CE * 4);
    y.lab = o; o += up16(ST * BR * 4);
    y.idx = o; o += up16(ST * BR * 4);
    y.info = o; o += up16(ST * 16);
    y.bias = o; o += up16(3 * 16 * 4);
    y.gbp = o; o += up16(SHIFT ? NCW * 16 * 4 : 0);  // SHIFT: every lane needs the bias gradient in its update
    y.dz = o; o += up16(SHIFT ? 0 : 16 * DLD * 4);    // else warp 7 sums the fp32 dlogits off the critical path
    y.wcs = o; o += up16(NCW * 16 * 4);
    y.hist = o; o += up16(NCW * 2 * 8);
    y.adam = o; o += up16(ADAM ? 2 * NCW * NJ * 8 * 32 * 4 : 0);
    y.bar = o; o += up16((2 * ST + 2) * 8);
    y.total = o;
    return y;
}
constexpr Lay LY = make_lay();
static_assert(LY.total <= LR_SMEM, "fused/plan.py's shared-memory size is smaller than the kernel's layout");

// What a producer hands the consumers with each stage besides the rows: the step's rate, AdamW's bias corrections
// (powf twice: off the consumers' path) and the batch's row count.
struct StepInfo {
    float lr, c1, c2;
    int rows;
};

// The cluster, mbarrier, copy and tensor-core helpers, and the watchdog'd waits: ptx.cuh.


#if LR_PREC == 2
typedef half_t TParam;
#else
typedef float TParam;
#endif

// ---- the CTA: its views of shared memory (LY's offsets), its place in the cluster, its thread ---------------------
struct Cta {
    u8* X;           // staged rows [stage][BR][ROWB]
    half_t* W16;     // fp16 operand copy [16 classes][WLD]
    half_t* dZT;     // dlogits^T fp16 [16][ZLD]
    float* recv;     // partial logits [parity][rank][row][CE]
    int* lab;        // labels [stage][BR]
    int* idxs;       // sample indices [stage][BR]
    StepInfo* info;  // step constants [stage]
    float* bias;     // [16] bias, [16] its s1, [16] its s2
    float* gbp;      // SHIFT: [warp][16] bias-gradient partials
    float* dz32;     // else: fp32 dlogits [class][DLD]
    float* wcs;      // [warp][16] column sums of W16 (SHIFT)
    double* hsum;    // per-warp loss sums
    float* adam;     // AdamW's moments, each lane's beside its masters
    u32 bar0;        // mbarriers: full[ST], empty[ST], exchange[2]
    u32 rank;
    int c0, nch;     // this CTA's chunks [c0, c0 + nch)
    int tid, warp, lane;
    __device__ __forceinline__ u32 full(int i) const { return bar0 + 8u * (u32)i; }
    __device__ __forceinline__ u32 empty(int i) const { return bar0 + 8u * (u32)(ST + i); }
    __device__ __forceinline__ u32 xbar(int i) const { return bar0 + 8u * (u32)(2 * ST + i); }
};
__device__ __forceinline__ Cta make_cta(u8* sm) {
    Cta k;
    k.tid = threadIdx.x, k.warp = k.tid >> 5, k.lane = k.tid & 31;
    k.rank = S > 1 ? cluster_rank() : 0u;
    k.c0 = (int)(k.rank * NCHUNK) / S, k.nch = (int)((k.rank + 1) * NCHUNK) / S - k.c0;
    k.X = sm + LY.x;
    k.W16 = reinterpret_cast<half_t*>(sm + LY.w16);
    k.dZT = reinterpret_cast<half_t*>(sm + LY.zt);
    k.recv = reinterpret_cast<float*>(sm + LY.recv);
    k.lab = reinterpret_cast<int*>(sm + LY.lab);
    k.idxs = reinterpret_cast<int*>(sm + LY.idx);
    k.info = reinterpret_cast<StepInfo*>(sm + LY.info);
    k.bias = reinterpret_cast<float*>(sm + LY.bias);
    k.gbp = reinterpret_cast<float*>(sm + LY.gbp);
    k.dz32 = reinterpret_cast<float*>(sm + LY.dz);
    k.wcs = reinterpret_cast<float*>(sm + LY.wcs);
    k.hsum = reinterpret_cast<double*>(sm + LY.hist);
    k.adam = reinterpret_cast<float*>(sm + LY.adam);
    k.bar0 = smem_u32(sm + LY.bar);
    return k;
}

// Shared memory zeroed (every pad stays zero), the mbarriers initialised (the exchange's armed for steps 0 and 1
// before any peer can send; re-armed after each use, after B1), every CTA's barriers in place before anyone sends.
__device__ __forceinline__ void start_cta(const Cta& k, u8* sm) {
    for (int i = k.tid; i < LY.total / 16; i += NT) reinterpret_cast<uint4*>(sm)[i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (k.tid == 0) {
        for (int i = 0; i < ST; ++i) {
            mbar_init(k.full(i), NPW * 32 + 1);  // each producer thread's cp.async arrival, and thread 0's release
            mbar_init(k.empty(i), NCW);          // one arrival per consumer warp
        }
        mbar_init(k.xbar(0), 1);
        mbar_init(k.xbar(1), 1);
        if (S > 1) {
            mbar_arm_tx(k.xbar(0), XBYTES);
            mbar_arm_tx(k.xbar(1), XBYTES);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if constexpr (S > 1) cluster_sync_full();
}

// ---- consumer phases ----------------------------------------------------------------------------------------------
// A consumer lane's place in the fragments: g = lane / 4, t = lane % 4, whether class g is real. Its masters are
// two register arrays (separate arrays, as they were written inline: one struct of both compiles differently):
// element e of chunk j: e < 4 class g, feature 4t + e of the chunk (accumulator e of the weight gradient); e = 4 + q
// the lane's upper-tile slot q (hi_of: class 8 + hg, feature 4 ht + hi). mw the masters, mom SGD's momentum beside
// them; AdamW's moments in shared memory (adam, LR_V apart). ereal bit 8j + e: element e of chunk j is a real weight
// (pads are never written back).
struct Lane {
    int g, t;
    bool cls_lo;
};
typedef float Regs[NJ][8];
#define LR_V (NCW * NJ * 8 * 32)  // AdamW: the second moment's offset (a macro: a constexpr would be a symbol)

__device__ __forceinline__ void load_masters(const Cta& k, const Lane& q, Regs& mw, Regs& mom, u32& ereal,
                                             const TParam* params, const float* s1g,
                                             const float* s2g) {
    const int warp = k.warp, lane = k.lane;
    const int g = q.g, t = q.t;
    const bool cls_lo = q.cls_lo;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int cl = warp + NCW * j;
#pragma unroll
        for (int e = 0; e < 4 + HS; ++e) {
            int cls = g, ff = 4 * t + e;
            bool ok = cls_lo;
            if (e >= 4) {
                const HiSlot h = hi_of(e - 4, lane);
                cls = 8 + h.g, ff = 4 * h.t + h.i, ok = h.valid;
            }
            const int f = (k.c0 + cl) * 16 + ff;
            const bool real = ok && cl < k.nch && f < D;
            ereal |= real ? 1u << (8 * j + e) : 0u;
            const int gi = cls * D + f;
            mw[j][e] = real ? to_f(params[gi]) : 0.f;
            mom[j][e] = MOM_REG && real ? s1g[gi] : 0.f;
            if constexpr (ADAM) {
                float* a = k.adam + (((warp * NJ + j) * 8 + e) * 32 + lane);
                a[0] = real ? s1g[gi] : 0.f;
                a[LR_V] = real ? s2g[gi] : 0.f;
            }
        }
#pragma unroll
        for (int e = 4 + HS; e < 8; ++e) mw[j][e] = mom[j][e] = 0.f;
    }
}

// The fp16 operand copy W16 of the warp's chunks (pads stay zero) and, for a nonzero shift, the warp's column sums.
__device__ __forceinline__ void write_w16(const Cta& k, const Lane& q, const Regs& mw) {
    const int warp = k.warp, lane = k.lane, g = q.g, t = q.t;
    const bool cls_lo = q.cls_lo;
    half_t* W16 = k.W16;
    float* wcs = k.wcs;
    float cs_lo = 0.f, cs_hi[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int cl = warp + NCW * j;
        if (cl < NCH) {
            if (cls_lo)
                *reinterpret_cast<uint2*>(W16 + g * WLD + cl * 16 + 4 * t) =
                    make_uint2(pack_h2(mw[j][0], mw[j][1]), pack_h2(mw[j][2], mw[j][3]));
            if constexpr (HS == 4 && !REDIST) {  // 16 classes: the upper tile as the lower one
                *reinterpret_cast<uint2*>(W16 + (8 + g) * WLD + cl * 16 + 4 * t) =
                    make_uint2(pack_h2(mw[j][4], mw[j][5]), pack_h2(mw[j][6], mw[j][7]));
            } else {
#pragma unroll
                for (int q = 0; q < HS; ++q) {
                    const HiSlot h = hi_of(q, lane);
                    if (h.valid) W16[(8 + h.g) * WLD + cl * 16 + 4 * h.t + h.i] = from_f<half_t>(mw[j][4 + q]);
                }
            }
            if constexpr (SHIFT) {
#pragma unroll
                for (int i = 0; i < 4; ++i) cs_lo += rnd16(mw[j][i]);
#pragma unroll
                for (int q = 0; q < HS; ++q) cs_hi[q] += rnd16(mw[j][4 + q]);
            }
        }
    }
    if constexpr (SHIFT) {
        cs_lo += __shfl_xor_sync(0xffffffffu, cs_lo, 1);
        cs_lo += __shfl_xor_sync(0xffffffffu, cs_lo, 2);
        if (t == 0) wcs[warp * 16 + g] = cs_lo;
        if constexpr (HS == 4 && !REDIST) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {  // own elements: class 8 + g, features 4t + q
                cs_hi[q] += __shfl_xor_sync(0xffffffffu, cs_hi[q], 1);
                cs_hi[q] += __shfl_xor_sync(0xffffffffu, cs_hi[q], 2);
            }
            if (t == 0) wcs[warp * 16 + 8 + g] = (cs_hi[0] + cs_hi[1]) + (cs_hi[2] + cs_hi[3]);
        } else {
#pragma unroll
            for (int q = 0; q < HS; ++q) {  // slot q: lanes 0..15 hold class 8 + 2q, lanes 16..31 class 9 + 2q
#pragma unroll
                for (int o = 1; o < 16; o <<= 1) cs_hi[q] += __shfl_xor_sync(0xffffffffu, cs_hi[q], o);
                if ((lane & 15) == 0) wcs[warp * 16 + 8 + 2 * q + (lane >> 4)] = cs_hi[q];
            }
        }
    }
}

// The bias (replicated) and its optimizer state, by the warp with the fewest chunks.
__device__ __forceinline__ void load_bias(const Cta& k, const TParam* params, const float* s1g, const float* s2g) {
    const int lane = k.lane;
    float* bias = k.bias;
    if (k.warp == NCW - 1 && lane < C) {
        bias[lane] = to_f(params[BOFF + lane]);
        if (NS >= 1) bias[16 + lane] = s1g[BOFF + lane];
        if (NS >= 2) bias[32 + lane] = s2g[BOFF + lane];
    }
}

// Forward: rows 16w..16w+15 x this CTA's chunks; K permuted inside each chunk: logical k (2t, 2t+1) = features (4t,
// 4t+1), (2t+8, 2t+9) = (4t+2, 4t+3), so one 4-byte load gives a0/a2 and one 8-byte load of W16 gives b0/b1. Two
// accumulator sets per n-tile (independent chains). The partial logits go to the own slot of exchange buffer xb and,
// by one bulk copy a warp, to every peer's.
__device__ __forceinline__ void forward(const Cta& k, const Lane& ln, int stg, int xb, float shift, float zs) {
    const int warp = k.warp, lane = k.lane, g = ln.g, t = ln.t;
    const u32 rank = k.rank;
    const u8* xs = k.X + stg * XST;
    const half_t* W16 = k.W16;
    const float* wcs = k.wcs;
    float acc[2][2][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.f;
    const u8* xr0 = xs + (16 * warp + g) * ROWB + (XF ? 8 : 4) * t;
    const half_t* wa = W16 + g * WLD + 4 * t;
    const half_t* wb = W16 + (8 + g) * WLD + 4 * t;
#pragma unroll
    for (int kc = 0; kc < NCH; ++kc) {
        u32 a[4];
        if constexpr (XF) {  // fp16 operands: features 4t..4t+3 in one 8-byte load
            const uint2 x0 = *reinterpret_cast<const uint2*>(xr0 + kc * 32);
            const uint2 x1 = *reinterpret_cast<const uint2*>(xr0 + 8 * ROWB + kc * 32);
            a[0] = x0.x, a[2] = x0.y, a[1] = x1.x, a[3] = x1.y;
        } else {  // uint8: one 4-byte load, a PRMT per two pixels into fp16 subnormals
            u8_a_frags(*reinterpret_cast<const u32*>(xr0 + kc * 16),
                       *reinterpret_cast<const u32*>(xr0 + 8 * ROWB + kc * 16), a);
        }
        const uint2 b0 = *reinterpret_cast<const uint2*>(wa + kc * 16);
        mma16816(acc[kc & 1][0], a[0], a[1], a[2], a[3], b0.x, b0.y);
        if constexpr (C > 8) {
            const uint2 b1 = *reinterpret_cast<const uint2*>(wb + kc * 16);
            mma16816(acc[kc & 1][1], a[0], a[1], a[2], a[3], b1.x, b1.y);
        }
    }
    // partial logits x * scale (+ shift * colsum(W16) of this CTA's features): [row g: class 2t, 2t+1;
    // row g+8: class 2t, 2t+1] of n-tile 0 (classes 0..7) and n-tile 1 (classes 8..15)
    float p0[4], p1[4];
    float sh[4] = {0.f, 0.f, 0.f, 0.f};  // shift * colsum of classes 2t, 2t+1, 8+2t, 9+2t
    if constexpr (SHIFT) {
#pragma unroll
        for (int w = 0; w < NCW; ++w) {  // fixed order
            sh[0] += wcs[w * 16 + 2 * t];
            sh[1] += wcs[w * 16 + 2 * t + 1];
            sh[2] += wcs[w * 16 + 8 + 2 * t];
            sh[3] += wcs[w * 16 + 9 + 2 * t];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) sh[i] *= shift;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p0[i] = fmaf(acc[0][0][i] + acc[1][0][i], zs, sh[i & 1]);
        p1[i] = fmaf(acc[0][1][i] + acc[1][1][i], zs, sh[2 + (i & 1)]);
    }
    float* own = k.recv + ((xb * S + (int)rank) * BR + 16 * warp) * CE;
    if (2 * t < C) {
        *reinterpret_cast<float2*>(own + g * CE + 2 * t) = make_float2(p0[0], p0[1]);
        *reinterpret_cast<float2*>(own + (g + 8) * CE + 2 * t) = make_float2(p0[2], p0[3]);
    }
    if (8 + 2 * t < C) {
        *reinterpret_cast<float2*>(own + g * CE + 8 + 2 * t) = make_float2(p1[0], p1[1]);
        *reinterpret_cast<float2*>(own + (g + 8) * CE + 8 + 2 * t) = make_float2(p1[2], p1[3]);
    }
    if constexpr (S > 1) {
        // this warp's 16 rows to each peer: one bulk copy each, completing on the peer's exchange
        // barrier (generic-proxy writes made visible to the async proxy first)
        fence_proxy_async();
        __syncwarp();
        if (lane < S - 1) {
            const u32 q = (u32)lane < rank ? (u32)lane : (u32)lane + 1u;
            const u32 src = smem_u32(own);
            bulk_s2cluster(mapa(src, q), src, 16 * CE * 4, mapa(k.xbar(xb), q));
        }
    }
}

// Softmax, loss, argmax, dlogits of every row, two lanes a row (classes hh*CH .. hh*CH + CH - 1), from the S slots
// of exchange buffer xb: dlogits^T in fp16 for the weight gradient, the bias gradient's inputs (fp32 dlogits, or
// with SHIFT per-warp partials: a butterfly over the lanes of one hh, a fixed order).
__device__ __forceinline__ void softmax(const Cta& k, int xb, int stg, int rows, float inv_rows, double& loss_acc,
                                        float& ok_acc) {
    const int warp = k.warp, lane = k.lane;
    half_t* dZT = k.dZT;
    float* dz32 = k.dz32;
    float* gbp = k.gbp;
    const int rl = lane >> 1, hh = lane & 1, r = 16 * warp + rl, cb = hh * CH;
    const bool valid = r < rows;
    float d[CH];
    softmax_pair<C, S>(k.recv + (xb * S * BR + r) * CE, BR * CE, k.bias, valid,
                       valid ? k.lab[stg * BR + r] : -1, inv_rows, d, loss_acc, ok_acc);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (cb + c < C) {
            dZT[(cb + c) * ZLD + r] = from_f<half_t>(d[c]);
            if constexpr (!SHIFT) dz32[(cb + c) * DLD + r] = d[c];
        }
    }
    if constexpr (SHIFT) {
        // bias-gradient partial of the warp's 16 rows (fixed order: a butterfly over the lanes of one hh)
#pragma unroll
        for (int o = 2; o <= 16; o <<= 1)
#pragma unroll
            for (int c = 0; c < CH; ++c) d[c] += __shfl_xor_sync(0xffffffffu, d[c], o);
        if (lane < 2)
#pragma unroll
            for (int c = 0; c < CH; ++c)
                if (cb + c < C) gbp[warp * 16 + cb + c] = d[c];
    }
}

// The training state back: each CTA its features from the register masters, CTA 0 the bias.
__device__ __forceinline__ void store_state(const Cta& k, const Lane& ln, const Regs& mw, const Regs& mom, u32 ereal,
                                            TParam* params, float* s1g, float* s2g,
                                            half_t* w16g) {
    const int warp = k.warp, lane = k.lane, g = ln.g, t = ln.t;
    const float* bias = k.bias;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int cl = warp + NCW * j;
#pragma unroll
        for (int e = 0; e < 4 + HS; ++e) {
            if (!(ereal & (1u << (8 * j + e)))) continue;
            int cls = g, ff = 4 * t + e;
            if (e >= 4) {
                const HiSlot h = hi_of(e - 4, lane);
                cls = 8 + h.g, ff = 4 * h.t + h.i;
            }
            const int gi = cls * D + (k.c0 + cl) * 16 + ff;
            params[gi] = from_f<TParam>(mw[j][e]);
            if (w16g) w16g[gi] = from_f<half_t>(mw[j][e]);
            if constexpr (MOM_REG) s1g[gi] = mom[j][e];
            if constexpr (ADAM) {
                const float* am = k.adam + (((warp * NJ + j) * 8 + e) * 32 + lane);
                s1g[gi] = am[0];
                s2g[gi] = am[LR_V];
            }
        }
    }
    if (k.rank == 0 && warp == NCW - 1 && lane < C) {
        params[BOFF + lane] = from_f<TParam>(bias[lane]);
        if (w16g) w16g[BOFF + lane] = from_f<half_t>(bias[lane]);
        if (NS >= 1) s1g[BOFF + lane] = bias[16 + lane];
        if (NS >= 2) s2g[BOFF + lane] = bias[32 + lane];
    }
}

// ---- the producers: up to ST steps ahead, batch row pt a thread ---------------------------------------------------
// Per step: wait empty[stage]; the Feistel index and label of row pt; the CTA's slice of every row by cp.async (16,
// 8 or 4 bytes) completing on full[stage] (float32 rows: x * scale + shift as fp16 by plain stores; d not a multiple
// of 4: plain loads; then a plain arrive); the step constants by thread 0, released by a plain arrive.
__device__ __forceinline__ void produce(const Cta& k, const u8* __restrict__ x, const int* __restrict__ y, u32 n,
                                        u32 seed_lo, u32 seed_hi, u32 half_bits, u32 epoch, u32 epoch_in_fit,
                                        const u64& step0, const float* const& lr_table, int steps, int batch,
                                        float scale, float shift, const OptimParams& p) {
    const int c0 = k.c0, nch = k.nch;
    int* lab = k.lab;
    int* idxs = k.idxs;
    const int pt = k.tid - NCW * 32;  // batch row of the index and the label
    u32 keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, epoch, keys);
    constexpr int GF = XF ? 4 : (G > 1 ? G : 1);  // features a copy unit (float: 4, converted to 4 halfs)
    constexpr int UPR = NCH * 16 / GF;             // copy units a staged row (pad chunks included)
    int stg = 0;
    u32 epar = 1u;  // a fresh barrier's previous phase counts as complete: the first ST waits pass
    for (int s = 0; s < steps; ++s) {
        wait_warp<false>(k.empty(stg), epar, s, W_EMPTY);
        const int rows = min(batch, (int)n - s * batch);
        int* ix = idxs + stg * BR;
        if (pt < rows) {
            const u32 id = permuted_index(keys, half_bits, n, (u32)(s * batch + pt));
            ix[pt] = (int)id;
            if constexpr (ASYNC) cp_async4(smem_u32(lab + stg * BR + pt), y + id);
            else lab[stg * BR + pt] = y[id];
        }
        bar_producers();
        u8* xd = k.X + stg * XST;
        const u8* xg = x + (u64)c0 * 16;
        for (int u = pt; u < rows * UPR; u += NPW * 32) {  // consecutive threads: consecutive bytes of a row
            const int r = u / UPR, c = u - r * UPR;
            const int f = c * GF;  // the unit's first feature within this CTA's slice
            if (f >= nch * 16 || c0 * 16 + f >= D) continue;  // pad chunks and pad features stay zero
            if constexpr (XF) {
                const float* src = reinterpret_cast<const float*>(x) + (u64)ix[r] * D + c0 * 16 + f;
                float v[4];
                if constexpr (D % 4 == 0) {
                    const float4 q = *reinterpret_cast<const float4*>(src);
                    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 4; ++i) v[i] = c0 * 16 + f + i < D ? src[i] : 0.f;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = v[i] * scale + shift;  // as fused.cu's and the gather's
                if constexpr (D % 4 != 0) {  // features past d stay zero
#pragma unroll
                    for (int i = 0; i < 4; ++i) v[i] = c0 * 16 + f + i < D ? v[i] : 0.f;
                }
                *reinterpret_cast<uint2*>(xd + r * ROWB + 2 * f) = make_uint2(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]));
                continue;
            }
            copy_unit<G>(xd + r * ROWB + f, xg + (u64)ix[r] * D + f);
        }
        if constexpr (ASYNC) cp_async_arrive_noinc(k.full(stg));
        else mbar_arrive(k.full(stg));  // release: this thread's plain stores
        if (pt == 0) {  // the step constants, after the copies are on their way (a global load), released
            const u64 kk = (u64)epoch_in_fit * steps + s;
            const float lr = lr_table[kk];
            const OptimStep o = optim_step<OPT>(p, lr, step0 + kk + 1);  // Adam counts steps from 1
            k.info[stg] = StepInfo{lr, o.c1, o.c2, rows};
            mbar_arrive(k.full(stg));
        }
        // (the stage's indices are rewritten ST steps later, after the next step's bar_producers)
        if (++stg == ST) {
            stg = 0;
            epar ^= 1u;
        }
    }
}

// ---- the kernel: the epoch as its phases (the step's barriers B0, B1, B2 are the consumers' named barrier) --------
__device__ void logreg_epoch(TParam* params, float* s1g, float* s2g, half_t* w16g, const u8* __restrict__ x,
                             const int* __restrict__ y, u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits,
                             EpochState* est, int steps, int batch, float scale, float shift, OptimParams p) {
    extern __shared__ __align__(128) u8 sm[];
    const Cta k = make_cta(sm);
    start_cta(k, sm);
    // fused/plan.py compiled this kernel for the optimizer passed
    if (p.kind != OPT) __trap();
    const u32 epoch = est->epoch, epoch_in_fit = est->epoch_in_fit;
    const u64 step0 = est->step0;
    const float* lr_table = est->lr;
    if (k.warp < NCW) {  // the consumers
        const Lane ln{k.lane >> 2, k.lane & 3, (k.lane >> 2) < C};
        float mw[NJ][8], mom[NJ][8];
        u32 ereal = 0;
        load_masters(k, ln, mw, mom, ereal, params, s1g, s2g);
        write_w16(k, ln, mw);
        load_bias(k, params, s1g, s2g);
        bar_consumers();

        const float zs = XF ? 1.f : scale * 16777216.f;  // uint8: 2^24 * scale turns subnormal pixels into x * scale
        double loss_acc = 0.0;
        float ok_acc = 0.f;
#ifdef FUSED_PROFILE
        long long prof[7] = {0, 0, 0, 0, 0, 0, 0};
        const bool prof_on = k.rank == 0 && k.warp == 0;
        long long prof_t = clock64();
#endif
        int stg = 0;
        u32 fpar = 0;
        for (int s = 0; s < steps; ++s) {
            const u8* xs = k.X + stg * XST;
            wait_warp<false>(k.full(stg), fpar, s, W_FULL);
            const StepInfo si = k.info[stg];
            const int rows = si.rows;
            const float inv_rows = 1.f / (float)rows;
            FUSED_PROF(0);  // rows wait (and the loop top)
            const int xb = S > 1 ? (s & 1) : 0;
            if (RW == NCW || k.warp < RW) forward(k, ln, stg, xb, shift, zs);  // (at 128 rows every warp)
            FUSED_PROF(1);  // forward
            bar_consumers();  // B0: the CTA's own partials are staged
            if (S > 1 && (RW == NCW || k.warp < RW)) wait_warp<true>(k.xbar(xb), (u32)((s >> 1) & 1), s, W_XCHG);
            FUSED_PROF(2);  // exchange
            if (RW == NCW || k.warp < RW) softmax(k, xb, stg, rows, inv_rows, loss_acc, ok_acc);
            FUSED_PROF(3);  // softmax
            bar_consumers();  // B1: dlogits^T and the bias-gradient partials complete; the exchange slot read
            if (S > 1 && k.tid == 0 && s + 2 < steps) mbar_arm_tx(k.xbar(s & 1), XBYTES);
            FUSED_PROF(4);  // B1
            {
                const OptimStep o{si.lr, si.c1, si.c2};
                // (kept inline, not a function: as a function the compiler orders the shuffles and addresses
                // differently and the SASS changes)
                const int warp = k.warp, lane = k.lane, g = ln.g, t = ln.t;
                const half_t* dZT = k.dZT;
                const float* gbp = k.gbp;
                float* adam = k.adam;
                u32 af[RW][4];
#pragma unroll
                for (int ks = 0; ks < RW; ++ks) {
                    const half_t* zr = dZT + g * ZLD + ks * 16 + 2 * t;
                    af[ks][0] = *reinterpret_cast<const u32*>(zr);
                    af[ks][2] = *reinterpret_cast<const u32*>(zr + 8);
                    af[ks][1] = *reinterpret_cast<const u32*>(zr + 8 * ZLD);  // classes 8..15 (zero past C)
                    af[ks][3] = *reinterpret_cast<const u32*>(zr + 8 * ZLD + 8);
                }
                float gb_lo = 0.f, gb_hi[4] = {0.f, 0.f, 0.f, 0.f};  // SHIFT: shift * the bias gradient of class g
                // and of the upper-tile slots' classes
                if constexpr (SHIFT) {
#pragma unroll
                    for (int w = 0; w < RW; ++w) {
                        gb_lo += gbp[w * 16 + g];
#pragma unroll
                        for (int q = 0; q < HS; ++q) gb_hi[q] += gbp[w * 16 + 8 + hi_of(q, lane).g];
                    }
                    gb_lo *= shift;
#pragma unroll
                    for (int q = 0; q < HS; ++q) gb_hi[q] *= shift;
                }
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const int cl = warp + NCW * j;
                    if (__all_sync(0xffffffffu, cl < NCH)) {  // a vote: warp-uniform to the compiler (no collective code)
                        float a0[4] = {0.f, 0.f, 0.f, 0.f}, a1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                        for (int ks = 0; ks < RW; ++ks) {
                            // B = rows ks*16 + {2t, 2t+1, 2t+8, 2t+9}, features 2g (n-tile 0) and 2g + 1 (n-tile 1)
                            wgrad_kstep<XF>(xs + (XF ? cl * 32 + 4 * g : cl * 16 + 2 * g) + (ks * 16 + 2 * t) * ROWB,
                                            ROWB, af[ks], a0, a1);
                        }
                        float ac[8];
                        chunk_grads(a0, a1, ac);
                        // Branch-free (no divergence between lanes): a pad (features past d or this CTA's chunks: zero
                        // pixels; classes past C: zero dlogits) has a zero gradient, weight and state, which every
                        // optimizer leaves zero. The upper tile's real elements are spread over all lanes (hi_of):
                        // slot q of lane L takes the gradient from lane 8q + L / 4's accumulator 4 + L % 4.
                        float gh[4] = {ac[4], ac[5], ac[6], ac[7]};
                        if constexpr (REDIST) {
#pragma unroll
                            for (int q = 0; q < HS; ++q) {
                                const int src = 8 * q + (lane >> 2);
                                const float v0 = __shfl_sync(0xffffffffu, ac[4], src);
                                const float v1 = __shfl_sync(0xffffffffu, ac[5], src);
                                const float v2 = __shfl_sync(0xffffffffu, ac[6], src);
                                const float v3 = __shfl_sync(0xffffffffu, ac[7], src);
                                const int i = lane & 3;
                                gh[q] = i == 0 ? v0 : (i == 1 ? v1 : (i == 2 ? v2 : v3));
                            }
                        }
#pragma unroll
                        for (int e = 0; e < 4 + HS; ++e) {
                            float gr = (e < 4 ? ac[e] : gh[e - 4]) * zs;
                            if constexpr (SHIFT)  // shift * the bias gradient, real weights only
                                gr += ereal & (1u << (8 * j + e)) ? (e < 4 ? gb_lo : gb_hi[e - 4]) : 0.f;
                            float w = mw[j][e], m1 = 0.f, m2 = 0.f;
                            float* am = adam + (((warp * NJ + j) * 8 + e) * 32 + lane);
                            if constexpr (MOM_REG) m1 = mom[j][e];
                            if constexpr (ADAM) {
                                m1 = am[0];
                                m2 = am[LR_V];
                            }
                            optim_update<OPT>(p, o, NS, gr, w, m1, m2);
                            if constexpr (PREC == 2) w = rnd16(w);  // "fp16" keeps fp16 weights
                            mw[j][e] = w;
                            if constexpr (MOM_REG) mom[j][e] = m1;
                            if constexpr (ADAM) {
                                am[0] = m1;
                                am[LR_V] = m2;
                            }
                        }
                    }
                }
                write_w16(k, ln, mw);  // only the fp16 copy is rewritten
                // the bias, by the warp with the fewest chunks: the same arithmetic on the same numbers everywhere
                float* bias = k.bias;
                const float* dz32 = k.dz32;
                float gsum = 0.f;
                if constexpr (SHIFT) {
                    if (warp == NCW - 1 && lane < C)
#pragma unroll
                        for (int w = 0; w < RW; ++w) gsum += gbp[w * 16 + lane];
                } else if (warp == NCW - 1 && lane < C) {  // class `lane`'s column of the fp32 dlogits, 4 rows a
                    // load in 4 fixed-order chains: no shuffles (in a warp-indexed branch they compile to collective code)
                    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int r = 0; r < BR; r += 4) {
                        const float4 q = *reinterpret_cast<const float4*>(dz32 + lane * DLD + r);
                        v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
                    }
                    gsum = (v[0] + v[1]) + (v[2] + v[3]);
                }
                if (warp == NCW - 1 && lane < C) {
                    float b = bias[lane], m1 = NS >= 1 ? bias[16 + lane] : 0.f, m2 = NS >= 2 ? bias[32 + lane] : 0.f;
                    // a bias: its decay is bias_decay (optim.cuh)
                    optim_update<OPT>(optim_bias(p), o, NS, gsum, b, m1, m2);
                    if constexpr (PREC == 2) b = rnd16(b);
                    bias[lane] = b;
                    if (NS >= 1) bias[16 + lane] = m1;
                    if (NS >= 2) bias[32 + lane] = m2;
                }
            }
            __syncwarp();
            if (k.lane == 0) mbar_arrive(k.empty(stg));  // this warp is done with the stage
            FUSED_PROF(5);  // weight gradient and update
            bar_consumers();  // B2: W16 (and its column sums) complete for the next forward; the bias updated
            FUSED_PROF(6);  // B2
            if (++stg == ST) {
                stg = 0;
                fpar ^= 1u;
            }
        }
#ifdef FUSED_PROFILE
        if (prof_on && k.lane == 0 && steps > 0)
            printf("fused_logreg phases (cycles/step, CTA 0 warp 0): rows-wait %lld forward %lld exchange %lld "
                   "softmax %lld B1 %lld wgrad+update %lld B2 %lld\n",
                   prof[0] / steps, prof[1] / steps, prof[2] / steps, prof[3] / steps, prof[4] / steps,
                   prof[5] / steps, prof[6] / steps);
#endif
        store_state(k, ln, mw, mom, ereal, params, s1g, s2g, w16g);
        epoch_history<NCW>(loss_acc, ok_acc, k.hsum, est, epoch_in_fit, k.rank);
    } else {
        produce(k, x, y, n, seed_lo, seed_hi, half_bits, epoch, epoch_in_fit, step0, lr_table, steps, batch, scale,
                shift, p);
    }
    __syncthreads();
    if constexpr (S > 1) cluster_sync_full();  // no CTA leaves while a peer may still address it
}

extern "C" __global__ void __launch_bounds__(NT, 1)
fused_logreg_kernel(TParam* params, float* s1, float* s2, half_t* w16, const u8* x, const int* y, u32 n, u32 seed_lo,
                    u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch, float scale, float shift,
                    OptimParams opt) {
#if __CUDA_ARCH__ >= 900
    logreg_epoch(params, s1, s2, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, shift, opt);
#else
    __trap();  // clusters need sm_90: fused/plan.py refuses older GPUs
#endif
}
