// grid_stream.cu: the grid engine's streaming path (issue 29): a whole training epoch of an MLP d-h-h-h-C (three
// hidden layers of equal width h, ReLU, softmax cross-entropy) on uint8 inputs in "mixed" precision with SGD (momentum,
// Nesterov, weight decay; momentum at NB <= 32 units a CTA), in ONE cooperative persistent kernel of P = h / NB CTAs
// (NB = 16, 32 or 64; at most one CTA per SM: grid/plan.py's stream_plan; 128 CTAs at h = 2048, 4096, 8192 on an H100),
// where the masters do not fit on chip: every master lives in global memory (HBM) and is read once and written once
// a step, the weight gradient fused with the update. Ported from the measured probe ../shared/probes/grid_floor/
// mlp_grid_probe.cu (its "STREAM" mode, Cfg<4096, 32, false>: 169.5 us/step measured; the design: ../shared/design/
// grid.md 3.4) on grid_fast.cu's scaffolding (prologue, gather, head, history, masks, optimizer); grid/plan.py's
// stream_plan sends here exactly the models it serves. Same kernel signature as grid_fast.cu.
//
// What it computes: the same epoch as grid_fast.cu, the other engines and the NumPy engine (the definition): for each
// step s, the rows of positions [s*batch, s*batch + m) (m = min(batch, n - s*batch), batch <= 32) in the epoch's keyed
// order (shuffle.cuh), x*scale; Linear + ReLU three times, Linear; softmax cross-entropy averaged over the m rows; the
// backward pass; SGD (optim.cuh's optim_update: plain, or with momentum / Nesterov / weight decay) of every parameter
// at the rate st->lr[epoch_in_fit * steps + s]. The epoch's loss sum and correct count are added to
// st->hist[2 * epoch_in_fit + {0, 1}]. Numerics ("mixed", as grid_fast.cu): fp16 operands on the tensor cores
// (mma.sync m16n8k16, fp32 accumulation), fp32 masters; activations H and gradients dZ stored as fp16, dlogits fp32
// (fp16 as an operand); uint8 pixels enter the tensor cores as the fp16 subnormals x * 2^-24 (exact) and
// scale * 2^24 multiplies the fp32 accumulators. A short batch (m < 32 rows) is masked: rows m..31 are gathered as
// copies of row m-1 and their dlogits are zero; the mean divides by m.
//
// Launch: grid = GRID_P = h / NB CTAs (NB = 16, 32 or 64 units a CTA, the fewest whose activation chunk divides h and
// whose CTAs fit the SMs: 128 CTAs of 16 at h = 2048, of 32 at 4096, of 64 at 8192; 18 of 64 at 1152; cooperative,
// all resident), block = 256 threads (8 warps), dynamic shared memory GRID_SMEM bytes; `scratch` = GRID_SCRATCH
// bytes of global memory (plan.py's stream_smem_bytes / stream_scratch_bytes; the static_asserts below check the
// kernel needs no more); `sync` = 256 bytes whose word 0, the round counter, the engine zeroes before every launch,
// and whose bytes 128.. receive the phase profile (-DGRID_PROFILE).
//
// Partition (grid_fast.cu's "column-master", NB units instead of 8): CTA p owns U_p = [NB p, NB p + NB) of every
// hidden layer: the rows W0[U_p, :], the forward outputs Z_l[:, U_p], the column blocks W1[:, U_p], W2[:, U_p] (their
// dgrad, weight gradient and update are local) and W3[:, U_p]; the head (logits, softmax, dlogits, dZ2) is computed by
// every CTA for the whole batch. Rounds a step, as grid_fast.cu: R1 (H0), R2 (H1), R3 (H2), R5 (dZ1): 4, each a
// monotone counter (sync word 0) and the activation brought in by bulk copies; round r of the launch completes when
// the counter reaches P * (r + 1).
// The streaming: every h-wide activation (H0, H1, H2, dZ1) comes in CU-unit chunks (256; 128 at NB = 64, for shared
// memory) through a ring of NST = 3 shared-memory stages, each chunk with what the CTA multiplies it by (F1, F2: its fp16 rows of W1/W2; the head's
// first pass: W3 as logits^T's A operand; its second pass: W3 as dZ2's B operand) on the same mbarrier, one chunk
// issued per chunk consumed. F1/F2: Z[:, U_p] += chunk x rows. Head pass 1: logits += W3[:, chunk] chunk^T. Pass 2
// (B2): per chunk, dZ2 = (dlogits W3[:, chunk]) * [H2 > 0] in place, then per k-step of 16 units n the W2 master
// fragments of W2[n, U_p] (prefetched one chunk ahead from HBM into registers) give the dgrad dZ1[:, U_p] += dZ2 W2
// before their update, the weight gradient dZ2^T H1[:, U_p] lands on the lanes holding them, SGD updates them, and
// they go back to HBM with their fp16 copy in the row owners' forward order (movmatrix). B1: the same over dZ1's chunks
// with W1 (dgrad into dZ0[:, U_p], local). B0: W0's update of step s-1 is fused with the forward F0 of step s (one
// pass over W0's master, streamed from HBM).
//
// Memory plan. Global scratch (plan.py's stream_scratch_bytes mirrors make_scratch()):
//   W0F [P][d/16][NB/8][32] float4, W1F, W2F [P][h/16][NB/8][32] float4: the fp32 masters of CTA p in its fragment
//     order (W0F: the rows U_p; W1F, W2F: the column blocks U_p), converted from the flat training state in the
//     prologue and written back to it (with the fp16 copy w16) in the epilogue: a one-off pass (~0.1 ms at h = 4096).
//     Each fragment is read and written by one lane only (ld/st.global.cg), so program order is all it needs.
//   W16F1, W16F2 [P][h/16][NB/8][32][4] fp16: the rows of W1, W2 in the row owner's B-fragment order, written by the
//     column owners after the update (W2: in pass 2 of step s, after R3(s); W1: in B1, after R5(s)), read by bulk copy
//     in F1/F2 of step s+1 after R1/R2(s+1); the previous readers (step s) copied before arriving at R2/R3(s).
//   W3A [2][h/16][32][8], W3B [2][h/8][32][4]: W3 in fp16 by step parity (grid_fast.cu's); step s reads parity s % 2
//     by bulk copy after R3(s); the owners write parity (s + 1) % 2 after arriving at R5(s) (its readers of step s - 1
//     copied before arriving at R5(s - 1), which this CTA waited in B1(s - 1)).
//   HG0, HG1, HG2, DZG1 [h/8][32][8] fp16: the exchanged activations, as grid_fast.cu.
//   M0F, M1F, M2F (momentum only): SGD's momentum buffers of W0, W1, W2 in the same fragment order, read and written
//     beside their masters by the same lane (from the flat state s1 and back to it); at NB = 16 a chunk ahead with the
//     masters, at NB = 32 (registers) as each k-step begins. The biases', b3's and W3 slice's momentum: shared memory.
// Bytes a parameter a step (W1, W2): fp16 rows 2 + master read 4 + write 4 + fp16 copy 2 = 12 (momentum: 20); W0: 8
// (16).
// Shared memory (plan.py's stream_smem_bytes mirrors make_smem()): the batch [2 stages][32][d] uint8; the ring's
// activation stages [3][CU/8][32][8] fp16 and weight stages [3][NB CU] fp16; the cross-warp reduction buffer; the
// CTA's own H0, H1, H2, dZ0 tiles [NB/8][32][8] fp16; biases, the W3 slice [16][NB], logits and dlogits [32][16]
// (and the momentum of the biases, b3 and the W3 slice);
// labels; the profile; the mbarriers.
//
// Code: grid_stream_epoch is the driver (the CTA's views, the prologue, the steps, the write-back) over the phases of
// StreamCta, a GridCta (grid_cta.cuh: what grid_fast.cu runs alike) with this kernel's own (the ring, the streamed
// masters).
#include "common.cuh"
#include "optim.cuh"
#include "shuffle.cuh"
#define GRID_KERNEL "grid_stream.cu"
#include "grid_tc.cuh"

// ---- shape, optimizer: compile-time (-D from grid/plan.py); defaults compile 784-4096x3-10, SGD --------------------
#ifndef GRID_NL
#define GRID_NL 4
#define GRID_SIZES {784, 4096, 4096, 4096, 10}
#define GRID_OFFS {0, 3211264, 3215360, 19992576, 19996672, 36773888, 36777984, 36818944}
#define GRID_P 128
#define GRID_B 32
#define GRID_NT 256
#define GRID_XIN 0
#define GRID_PREC 1
#define GRID_ACT 0
#define GRID_OPT 0
#define GRID_NS 0
#define GRID_SMEM 204648
#define GRID_SCRATCH 215744512
#define GRID_LOSS 0
#endif

static_assert(GRID_NL == 4, "the streaming path trains three hidden layers");
constexpr int SZ[GRID_NL + 1] = GRID_SIZES;
constexpr long long OFFS[2 * GRID_NL] = GRID_OFFS;
constexpr long long OW0 = OFFS[0], OB0 = OFFS[1], OW1 = OFFS[2], OB1 = OFFS[3], OW2 = OFFS[4], OB2 = OFFS[5],
                    OW3 = OFFS[6], OB3 = OFFS[7];
constexpr int D = SZ[0], H = SZ[1], C = SZ[4];
constexpr int P = GRID_P;      // CTAs
constexpr int NB = H / P;      // units of each hidden layer a CTA owns
constexpr int NBT = NB / 8;    // 8-unit tiles of them
constexpr int MT = NB / 16;    // 16-unit m-tiles of them (the weight gradients' A operand)
constexpr int KS = H / 16;     // k-steps of 16 over a hidden layer
constexpr int CU = NB == 64 ? 128 : 256;  // units of an activation chunk (NB = 64: shared memory)
constexpr int NCH = H / CU;    // chunks of an activation
constexpr int CKS = CU / 16;   // k-steps of a chunk
constexpr int NW = 8, NT = 256;
constexpr int KPW = CKS / NW;  // k-steps of a chunk per warp
constexpr int NST = 3;         // ring stages
constexpr int NKS0 = D / 16;   // k-steps over the inputs
constexpr int K0W = (NKS0 + NW - 1) / NW;  // of them per warp at most
constexpr int BR = 32;         // rows a step (a shorter batch is masked)
constexpr int NBR = NB + 8;    // row stride (floats) of the cross-warp sums (bank spread)
constexpr int OPT = GRID_OPT, NS = GRID_NS;
static_assert(SZ[2] == H && SZ[3] == H && H == NB * P && (NB == 16 || NB == 32 || NB == 64), "NB = 16, 32 or 64");
static_assert(H % CU == 0 && CKS % NW == 0, "whole chunks, whole k-steps per warp");
static_assert(NCH >= NST, "at least NST chunks: every pass issues NST of them before its first wait");
static_assert(D % 16 == 0 && D >= 16 && K0W <= 8, "inputs in k-steps of 16, at most 1024");
static_assert(C >= 2 && C <= 16, "classes: one m16 tile of logits^T");
static_assert(GRID_B >= 1 && GRID_B <= BR, "at most 32 rows a step");
static_assert(GRID_NT == NT && GRID_PREC == 1 && GRID_ACT == 0 && GRID_LOSS == LOSS_XENT && GRID_XIN == 0,
              "the streaming path: uint8 inputs, mixed precision, ReLU, cross-entropy");
static_assert(OPT == OPTIM_SGD && NS <= 1 && (NS == 0 || NB <= 32), "SGD, its momentum up to 32 units a CTA");
constexpr bool MOM = NS == 1;  // SGD's momentum buffer streams beside each master (same fragment order)
constexpr int MSF = 3 * NB + 16 + 16 * NB;  // the momentum of the biases, b3 and the W3 slice (floats)
// B0 + F0: k-steps of W0 whose master (and momentum) loads are hoisted together (registers: 16 or 32 floats each)
constexpr int B0U = NBT == 8 ? (MOM ? 1 : 2) : MOM ? (NBT <= 2 ? 3 : 2) : K0W;
// the momentum of the next chunk prefetched with its masters where the registers allow (NB = 16); at NB = 32 (255
// registers otherwise spill) a k-step's momentum is loaded as the k-step begins, its latency under its dgrad
constexpr bool MPRE = MOM && NBT <= 2;

// ---- global scratch (bytes) ----------------------------------------------------------------------------------------
struct Scratch { long long w0f, w1f, w2f, w16f1, w16f2, w3a, w3b, hg0, hg1, hg2, dzg1, m0f, m1f, m2f, total; };
__host__ __device__ constexpr Scratch make_scratch() {
    Scratch s{};
    long long o = 0;
    s.w0f = o; o += up128(4LL * H * D);
    s.w1f = o; o += up128(4LL * H * H);
    s.w2f = o; o += up128(4LL * H * H);
    o = shared_scratch(s, o, H, KS, BR);
    s.m0f = o; o += MOM ? up128(4LL * H * D) : 0;  // the momentum of W0, W1, W2 beside their masters
    s.m1f = o; o += MOM ? up128(4LL * H * H) : 0;
    s.m2f = o; o += MOM ? up128(4LL * H * H) : 0;
    s.total = o;
    return s;
}
constexpr Scratch SC = make_scratch();
static_assert(SC.total <= (long long)GRID_SCRATCH, "grid/plan.py's global scratch is smaller than the kernel's");

// ---- shared memory (bytes) -----------------------------------------------------------------------------------------
constexpr int XB = BR * D;         // a staged batch
constexpr int ACTB = CU * BR * 2;  // an activation stage
constexpr int WB = NB * CU * 2;    // a weight stage: the CTA's fp16 rows of a chunk (or a W3 chunk: CKS * 512)
static_assert(CKS * 512 <= WB, "a W3 chunk fits a weight stage");
constexpr int REDF = (8 * 16 * 40 > NW * BR * NBR) ? 8 * 16 * 40 : NW * BR * NBR;  // head [w][16][40]; [w][32][NBR]
constexpr int NSF = 3 * NB + 16 + 16 * NB + 2 * BR * 16;  // biases, b3, W3 slice [16][NB], logits, dlogits
struct Smem { int x, act, wr, red, hp, sf, msf, lab, prof, bar, total; };
__host__ __device__ constexpr Smem make_smem() {
    Smem y{};
    int o = 0;
    y.x = o; o += 2 * XB;
    y.act = o; o += NST * ACTB;
    y.wr = o; o += NST * WB;
    y.red = o; o += REDF * 4;
    y.hp = o; o += 4 * BR * NB * 2;
    y.sf = o; o += NSF * 4;
    y.msf = o; o += NS * MSF * 4;
    y.lab = o; o += 2 * BR * 4;
    y.prof = o; o += 16 * 8;
    y.bar = o; o += (2 + NST) * 8;
    y.total = o;
    return y;
}
constexpr Smem SL = make_smem();
static_assert(SL.act % 128 == 0 && SL.wr % 128 == 0 && SL.red % 16 == 0 && SL.hp % 16 == 0 && SL.bar % 8 == 0,
              "alignment of the bulk-copy targets and 16-byte accesses");
static_assert(SL.total <= GRID_SMEM, "grid/plan.py's shared-memory size is smaller than the kernel's layout");

// ---- PTX helpers of this kernel (the rest: grid_tc.cuh) -------------------------------------------------------------
// a master fragment in global memory: one lane's 16 bytes, cached in L2 only (each is read and written once a step)
__device__ __forceinline__ void ldcg_f(const float4* p, float (&w)[4]) {
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(w[0]), "=f"(w[1]), "=f"(w[2]), "=f"(w[3]) : "l"(p));
}
__device__ __forceinline__ void stcg_f(float4* p, const float (&w)[4]) {
    asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(w[0]), "f"(w[1]), "f"(w[2]), "f"(w[3])
                 : "memory");
}

// ---- the optimizer step of one element (optim.cuh's arithmetic: SGD, its momentum or none) --------------------------
// (m: the element's momentum buffer, unused without momentum)
__device__ __forceinline__ void upd(const OptimParams& p, const OptimStep& o, float g, float& w, float& m) {
    float v = 0.f;
    optim_update<OPT>(p, o, NS, g, w, m, v);
}
// (with the second state array the shared-memory elements' step passes: none for SGD)
__device__ __forceinline__ void upd(const OptimParams& p, const OptimStep& o, float g, float& w, float& m, float& v) {
    optim_update<OPT>(p, o, NS, g, w, m, v);
}

// ---- building blocks (each a warp's share) --------------------------------------------------------------------------
// A fragments (16 units x 16 rows) of Hp^T [unit][row] of m-tile mt from a CTA-local [NB/8][32][8] fp16 tile: ah[kb]
__device__ __forceinline__ void load_hpT(u32 (&ah)[2][4], u32 hp, int mt, int lane) {
    const int j4 = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
        ldsm_x4_t(hp + (u32)((((2 * mt + (j4 & 1)) * BR) + 16 * kb + (j4 >> 1) * 8 + r) << 4), ah[kb]);
}
// A weight gradient's A operand (the CTA's own activations or dZ0, transposed): held in registers for the whole
// pass at NB <= 32, reloaded from shared memory at each use at NB = 64 (its 32 registers a lane would spill)
constexpr bool AHR = NBT <= 4;
constexpr int AMT = AHR ? MT : 1;  // the m-tiles held
typedef u32 AFrag[2][4];
// m-tile mt of the operand: the held one (AHR), else `al`, loaded by the caller
__device__ __forceinline__ const AFrag& pick_ah(const u32 (&ahr)[AMT][2][4], const AFrag& al, int mt) {
    if constexpr (AHR) return ahr[mt];
    else return al;
}
__device__ __forceinline__ void aop_load(u32 (&ah)[AMT][2][4], u32 hp, int lane) {
    if constexpr (AHR) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_hpT(ah[mt], hp, mt, lane);
    }
}
// weight gradient of chunk k-step kl (16 rows n of W) x the CTA's NB units, straight into the SGD step of the master
// fragments w[j][q] = W[n = 16kk + 2t + (q & 1) + 8 (q >> 1)][unit 8j + g]; B = dZ [row][n] from the stage
__device__ __forceinline__ void wgrad_ks(u32 act, int kl, const u32 (&ahr)[AMT][2][4], u32 hp, float (&w)[NBT][4],
                                         float (&m)[NBT][4], const OptimParams& p, const OptimStep& o, int lane) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
        u32 b[4];
        ldsm_x4_t(act + (u32)(((2 * kl + h2) * BR + lane) << 4), b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            u32 al[2][4];
            if constexpr (!AHR) load_hpT(al, hp, mt, lane);
            const AFrag& ah = pick_ah(ahr, al, mt);
            float cc[4] = {0.f, 0.f, 0.f, 0.f};
            mma16816(cc, ah[0][0], ah[0][1], ah[0][2], ah[0][3], b[0], b[1]);
            mma16816(cc, ah[1][0], ah[1][1], ah[1][2], ah[1][3], b[2], b[3]);
            upd(p, o, cc[0], w[2 * mt][2 * h2], m[2 * mt][2 * h2]);
            upd(p, o, cc[1], w[2 * mt][2 * h2 + 1], m[2 * mt][2 * h2 + 1]);
            upd(p, o, cc[2], w[2 * mt + 1][2 * h2], m[2 * mt + 1][2 * h2]);
            upd(p, o, cc[3], w[2 * mt + 1][2 * h2 + 1], m[2 * mt + 1][2 * h2 + 1]);
        }
    }
}
// the fp16 copy of the master fragments of k-step kk, transposed (movmatrix) into the forward's B-fragment order of
// the row owners: W16F[p'][kk'][j'][lane][4]
__device__ __forceinline__ void store_w16(half_t* w16, int cta, int kk, const float (&w)[NBT][4], int lane) {
#pragma unroll
    for (int j = 0; j < NBT; ++j) {
        const int k0 = cta * NB + 8 * j, kk2 = k0 >> 4, slot = (k0 & 8) ? 2 : 0;
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const u32 v = movtrans(pack_h2(w[j][2 * h2], w[j][2 * h2 + 1]));
            const int n0 = 16 * kk + 8 * h2, pp = n0 / NB, jj = (n0 % NB) >> 3;
            *reinterpret_cast<u32*>(w16 + ((((long long)pp * KS + kk2) * NBT + jj) * 32 + lane) * 4 + slot) = v;
        }
    }
}
__device__ __forceinline__ void dgrad_ks(const u32 (&a)[2][4], const float (&w)[NBT][4], float (&acc)[2][NBT][4]) {
#pragma unroll
    for (int j = 0; j < NBT; ++j) {
        const u32 b0 = pack_h2(w[j][0], w[j][1]), b1 = pack_h2(w[j][2], w[j][3]);
        mma16816(acc[0][j], a[0][0], a[0][1], a[0][2], a[0][3], b0, b1);
        mma16816(acc[1][j], a[1][0], a[1][1], a[1][2], a[1][3], b0, b1);
    }
}
__device__ __forceinline__ void store_red(float* red, int warp, int lane, const float (&acc)[2][NBT][4]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < NBT; ++j) {
            const int row = 16 * mt + g, col = 8 * j + 2 * t;
            *reinterpret_cast<float2*>(red + (warp * BR + row) * NBR + col) = make_float2(acc[mt][j][0], acc[mt][j][1]);
            *reinterpret_cast<float2*>(red + (warp * BR + row + 8) * NBR + col) =
                make_float2(acc[mt][j][2], acc[mt][j][3]);
        }
}
__device__ __forceinline__ float sum_red(const float* red, int row, int col) {
    float z = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) z += red[(w * BR + row) * NBR + col];
    return z;
}
__device__ __forceinline__ void zero_acc(float (&acc)[2][NBT][4]) {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int j = 0; j < NBT; ++j) acc[a][j][0] = acc[a][j][1] = acc[a][j][2] = acc[a][j][3] = 0.f;
}

#define NPHASE 12  // batch wait, B0+F0, R1, F1, R2, F2, R3, head, dZ2+B2, W3 update, R5 wait, B1 (MARK: grid_tc.cuh)

// ---- the CTA: grid_cta.cuh's views and phases, and this kernel's (the ring of stages, the streamed masters) ----------
#include "grid_cta.cuh"
struct StreamCta : GridCta<u8> {
    const half_t*& wrp0;
    const u32& bar0;
    float4 *&W0F, *&M0F;
    half_t*& HG2;
    u32 &r_iss, &r_use, &arrived;  // the loop-carried counters, in this order (another order changes the SASS)
    // by value: views no phase changes
    float4 *W1F, *W2F, *M1F, *M2F;
    half_t *actp0, *Hp0, *Hp1, *DZG1, *W16F1, *W16F2;
    int own_chunk, own_off;

    // this CTA's arrival at the next round (grid_tc.cuh's counter barrier)
    __device__ void arrive() {
        round_arrive(counter);
        ++arrived;
    }
    // the mbarrier of ring stage i
    __device__ u32 full(u32 i) { return bar0 + 16u + 8u * i; }
    // the fragment (kk, tile j) of this lane in the flat training state: element q at base + 8j (*stride2) + kofs
    // (W0: rows u0 + 8j + g, stride 1 along k; W1, W2: columns u0 + 8j + g, stride H along n; src: the parameters,
    // or the momentum buffer s1g); put, put_m: back (a master with its fp16 copy, a momentum)
    __device__ void get(float (&w)[4], const float* src, long long base, int stride, int kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = src[base + (long long)kofs(kk, q) * stride];
    }
    __device__ void put(const float (&w)[4], long long base, int stride, int kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const long long e = base + (long long)kofs(kk, q) * stride;
            params[e] = w[q];
            if (w16 != nullptr) w16[e] = from_f<half_t>(w[q]);
        }
    }
    __device__ void put_m(const float (&m)[4], long long base, int stride, int kk) {
#pragma unroll
        for (int q = 0; q < 4; ++q) s1g[base + (long long)kofs(kk, q) * stride] = m[q];
    }
    // the batch of step s into stage s & 1: warp 1, one row a lane (keyed index, label, one d-byte bulk copy);
    // rows past the batch's m copy row m-1 and carry label -1 (their dlogits are zero)
    __device__ void issue_x(int s) {
        const u32 idx = row_index(s);
        bulk_row(s & 1, idx);
    }
    // the ring: every thread counts the issues and the uses alike; thread 0 issues (an activation chunk, and with it
    // `wbytes` of weights into the same stage's weight slot)
    __device__ void issue_act(const half_t* src, const half_t* wsrc, u32 wbytes) {
        if (tid == 0) {
            const u32 sg = r_iss % NST;
            fence_proxy_async();
            mbar_arm_tx(full(sg), (u32)ACTB + (wsrc ? wbytes : 0u));
            bulk_g2s(act0 + sg * ACTB, src, (u32)ACTB, full(sg));
            if (wsrc) bulk_g2s(wr0 + sg * WB, wsrc, wbytes, full(sg));
        }
        ++r_iss;
    }
    __device__ u32 wait_act(int s) {
        const u32 sg = r_use % NST;
        mbar_wait(full(sg), (r_use / NST) & 1u, s);
        ++r_use;
        return sg;
    }
    // one k-step's fragments (all NBT tiles) of a master or its momentum
    __device__ void load_ks(const float4* base, int kk, float (&w)[NBT][4]) {
#pragma unroll
        for (int j = 0; j < NBT; ++j) ldcg_f(base + (kk * NBT + j) * 32 + lane, w[j]);
    }
    // and back: one k-step of a master and (with momentum) its buffer, in the same order
    __device__ void store_ks(float4* wb, float4* mb, int kk, const float (&w)[NBT][4], const float (&m)[NBT][4]) {
#pragma unroll
        for (int j = 0; j < NBT; ++j) {
            stcg_f(wb + (kk * NBT + j) * 32 + lane, w[j]);
            if constexpr (MOM) stcg_f(mb + (kk * NBT + j) * 32 + lane, m[j]);
        }
    }
    // B0 of step s-1 (weight gradient of W0, SGD in the master fragments, streamed) fused with F0 of step s
    __device__ void b0f0(int s, bool do_b0, bool do_f0, float (&acc)[2][NBT][4], const OptimStep& ob) {
        const u8* xc = Xs + (s & 1) * XB;        // X(s)
        const u8* xp = Xs + ((s & 1) ^ 1) * XB;  // X(s-1)
        u32 ahz[AMT][2][4];
        if (do_b0) aop_load(ahz, smem_u32(dZ0p), lane);
#pragma unroll B0U
        for (int i = 0; i < K0W; ++i) {  // unrolled: the master loads of B0U k-steps in flight at once
            const int kk = warp + NW * i;
            if (kk < NKS0) {
                float w[NBT][4], mo[NBT][4];
#pragma unroll
                for (int j = 0; j < NBT; ++j) {
                    ldcg_f(W0F + (kk * NBT + j) * 32 + lane, w[j]);
                    if (MOM && do_b0) ldcg_f(M0F + (kk * NBT + j) * 32 + lane, mo[j]);
                }
                if (do_b0) {
#pragma unroll
                    for (int h2 = 0; h2 < 2; ++h2) {
                        const int pix = 16 * kk + 8 * h2 + g;
                        u32 bx[2][2];
                        rows_b_frags<D>(xp, pix, t, bx);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            u32 al[2][4];
                            if constexpr (!AHR) load_hpT(al, smem_u32(dZ0p), mt, lane);
                            const AFrag& ah = pick_ah(ahz, al, mt);
                            float cc[4] = {0.f, 0.f, 0.f, 0.f};
                            mma16816(cc, ah[0][0], ah[0][1], ah[0][2], ah[0][3], bx[0][0], bx[0][1]);
                            mma16816(cc, ah[1][0], ah[1][1], ah[1][2], ah[1][3], bx[1][0], bx[1][1]);
                            upd(prm, ob, cc[0] * zs, w[2 * mt][2 * h2], mo[2 * mt][2 * h2]);
                            upd(prm, ob, cc[1] * zs, w[2 * mt][2 * h2 + 1], mo[2 * mt][2 * h2 + 1]);
                            upd(prm, ob, cc[2] * zs, w[2 * mt + 1][2 * h2], mo[2 * mt + 1][2 * h2]);
                            upd(prm, ob, cc[3] * zs, w[2 * mt + 1][2 * h2 + 1], mo[2 * mt + 1][2 * h2 + 1]);
                        }
                    }
                    store_ks(W0F, M0F, kk, w, mo);
                }
                if (do_f0) {
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        const int r0 = 16 * mt + g, c0 = 16 * kk + 2 * t;
                        const uint4 a = rows_a_frags<D>(xc + c0, r0);
#pragma unroll
                        for (int j = 0; j < NBT; ++j)
                            mma16816(acc[mt][j], a.x, a.y, a.z, a.w, pack_h2(w[j][0], w[j][1]),
                                     pack_h2(w[j][2], w[j][3]));
                    }
                }
            }
        }
    }
    // b0 of the owned units from dZ0 (fp16, this CTA's tile), fixed order
    __device__ void bias0(const OptimStep& ob) {
        if (tid < NB) {
            const float sd = tile_col_sum(dZ0p, tid);
            upd1(optim_bias(prm), ob, sd, b0s[tid], mb0 + tid);
        }
    }
    // forward epilogue: cross-warp sum, bias, ReLU, fp16 to the own tile and the exchange buffer
    __device__ void fwd_out(float (&acc)[2][NBT][4], float sc, const float* bs, half_t* hp, half_t* hg) {
        store_red(red, warp, lane, acc);
        __syncthreads();
        for (int e = tid; e < BR * NB; e += NT) {
            const int row = e / NB, col = e % NB;
            const float z = sum_red(red, row, col) * sc + bs[col];
            const half_t hv = from_f<half_t>(z > 0.f ? z : 0.f);
            hp[cg_idx(row, col)] = hv;
            hg[cg_idx(row, u0 + col)] = hv;
        }
    }
    // dgrad epilogue: cross-warp sum, ReLU mask of the owned activations, fp16 (at unit offset col0 of `out`)
    __device__ void bwd_out(float (&acc)[2][NBT][4], const half_t* hp, half_t* out, int col0) {
        store_red(red, warp, lane, acc);
        __syncthreads();
        for (int e = tid; e < BR * NB; e += NT) {
            const int row = e / NB, col = e % NB;
            const float dh = sum_red(red, row, col);
            out[cg_idx(row, col0 + col)] = from_f<half_t>(h_pos(hp[cg_idx(row, col)]) ? dh : 0.f);
        }
    }
    // F1 / F2 over the chunks of one activation; the CTA's fp16 rows of W come with each chunk (same mbarrier)
    __device__ void fwd_layer(int s, const half_t* src, const half_t* w16f, float (&acc)[2][NBT][4], int mk) {
        const half_t* wbase = w16f + (long long)cta * KS * NBT * 128;
        if (tid == 0) round_wait(counter, (u32)P * arrived, s);
#pragma unroll 1
        for (int c = 0; c < NST; ++c)
            issue_act(src + (long long)c * CU * BR, wbase + (long long)c * CKS * NBT * 128, (u32)WB);
#pragma unroll 1
        for (int c = 0; c < NCH; ++c) {
            const u32 sg = wait_act(s);
            if (c == 0) MARK(mk);
            const u32 a_st = act0 + sg * ACTB;
            const half_t* wst = wrp0 + sg * (WB / 2);
#pragma unroll
            for (int i = 0; i < KPW; ++i) {
                const int kl = warp * KPW + i;
                uint2 bf[NBT];
#pragma unroll
                for (int j = 0; j < NBT; ++j)
                    bf[j] = *reinterpret_cast<const uint2*>(wst + ((kl * NBT + j) * 32 + lane) * 4);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    u32 a[4];
                    load_act_a(a_st, kl, mt, lane, a);
#pragma unroll
                    for (int j = 0; j < NBT; ++j) mma16816(acc[mt][j], a[0], a[1], a[2], a[3], bf[j].x, bf[j].y);
                }
            }
            __syncthreads();  // the stage is free
            if (c + NST < NCH)
                issue_act(src + (long long)(c + NST) * CU * BR, wbase + (long long)(c + NST) * CKS * NBT * 128,
                          (u32)WB);
        }
    }
    // the head's sequence of chunks: q < NCH: pass 1 (H2 chunk + W3A chunk), else pass 2 (H2 chunk + W3B chunk)
    __device__ void issue_head(int q, int par) {
        const int c = q % NCH;
        const half_t* w3 = q < NCH ? W3A + ((long long)par * KS + c * CKS) * 256
                                   : W3B + ((long long)par * (H / 8) + c * (CU / 8)) * 128;
        issue_act(HG2 + (long long)c * CU * BR, w3, (u32)(CKS * 512));
    }
    // a warp's master fragments of chunk c (this warp's KPW k-steps) from HBM
    __device__ void load_masters(const float4* base, int c, float (&w)[KPW][NBT][4]) {
#pragma unroll
        for (int i = 0; i < KPW; ++i) load_ks(base, c * CKS + warp * KPW + i, w[i]);
    }
    // the masters and momentum of chunk c into w, m (back a k-step at a time by store_ks; the fp16 copy by store_w16)
    __device__ void load_chunk(const float4* wb, const float4* mb, int c, float (&w)[KPW][NBT][4], float (&m)[KPW][NBT][4]) {
        load_masters(wb, c, w);
        if constexpr (MPRE) load_masters(mb, c, m);
    }
    // the prefetched chunk (masters, and momentum where MPRE) into w, m: the prefetch registers are then free for the
    // next chunk's loads
    __device__ void take_chunk(float (&w)[KPW][NBT][4], float (&m)[KPW][NBT][4], const float (&wn)[KPW][NBT][4],
                          const float (&mn)[KPW][NBT][4]) {
#pragma unroll
        for (int i = 0; i < KPW; ++i)
#pragma unroll
            for (int j = 0; j < NBT; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    w[i][j][q] = wn[i][j][q];
                    if constexpr (MPRE) m[i][j][q] = mn[i][j][q];
                }
    }
    // head, pass 1: the logits of the whole batch in every CTA (H2's chunks with W3A's through the ring), then warp
    // 0's softmax cross-entropy into dlogits; returns the epoch's sums (in and out by value: softmax_row says why).
    // Its arrays are the driver's, declared there in this order (owning them, it compiled to other SASS)
    __device__ double2 head_pass1(int s, int par, double loss_acc, double ok_acc, float (&accL)[4][4], float (&l)[C],
                                  float (&ex)[C]) {
        if (tid == 0) round_wait(counter, (u32)P * arrived, s);
#pragma unroll 1
        for (int q = 0; q < NST; ++q) issue_head(q, par);
#pragma unroll
        for (int a = 0; a < 4; ++a) accL[a][0] = accL[a][1] = accL[a][2] = accL[a][3] = 0.f;
        const int j4 = lane >> 3, r = lane & 7;
#pragma unroll 1
        for (int c = 0; c < NCH; ++c) {
            const u32 sg = wait_act(s);
            if (c == 0) MARK(6);
            const u32 a_st = act0 + sg * ACTB;
            const half_t* wst = wrp0 + sg * (WB / 2);
#pragma unroll
            for (int i = 0; i < KPW; ++i) {
                const int kl = warp * KPW + i;
                const uint4 af = *reinterpret_cast<const uint4*>(wst + (kl * 32 + lane) * 8);
                head_kstep(a_st, kl, af, j4, r, accL);
            }
            __syncthreads();  // the stage is free
            if (c + NST < 2 * NCH) issue_head(c + NST, par);
        }
        return head_end<true>(s, par, 0, loss_acc, ok_acc, accL, l, ex);
    }
    // head, pass 2 (B2): per chunk of H2's units, dZ2 = (dlogits W3[:, chunk]) * [H2 > 0] in place in its stage; the
    // dgrad dZ1[:, U_p] += dZ2 W2 from the chunk's W2 masters (prefetched a chunk ahead into w2m, m2m) before their
    // update, W2's weight gradient and SGD step, their fp16 copies, and b2 in the chunk holding the owned units. Its
    // arrays are the driver's, declared there in this order (owning them, a phase compiled to other SASS)
    __device__ void pass2(int s, int par, const OptimStep& oc, float (&w2m)[KPW][NBT][4], float (&m2m)[KPW][NBT][4],
                          u32 (&adl)[2][4], u32 (&ah1)[AMT][2][4], float (&accD)[2][NBT][4], float (&wk)[KPW][NBT][4],
                          float (&mk)[KPW][NBT][4], u32 (&adz)[2][4]) {
        dlogits_operand(dl, g, t, adl);
        aop_load(ah1, smem_u32(Hp1), lane);
        zero_acc(accD);
#pragma unroll 1
        for (int c = 0; c < NCH; ++c) {
            take_chunk(wk, mk, w2m, m2m);  // this chunk's masters; the next chunk's load meanwhile
            if (c + 1 < NCH) load_chunk(W2F, M2F, c + 1, w2m, m2m);
            const u32 sg = wait_act(s);
            const u32 a_st = act0 + sg * ACTB;
            half_t* ap = actp0 + sg * (ACTB / 2);
            const uint2* w3r = reinterpret_cast<const uint2*>(wrp0 + sg * (WB / 2)) + lane;
#pragma unroll
            for (int i = 0; i < KPW; ++i) {
                const int kl = warp * KPW + i;
                if constexpr (MOM && !MPRE) load_ks(M2F, c * CKS + kl, mk[i]);
                dz2_kstep<false>(adl, w3r, ap + 2 * t, kl, g, adz);
                dgrad_ks(adz, wk[i], accD);  // the master before its update
                __syncwarp();  // the warp's dZ2 columns are in the stage
                wgrad_ks(a_st, kl, ah1, smem_u32(Hp1), wk[i], mk[i], prm, oc, lane);
                const int kk = c * CKS + kl;
                store_w16(W16F2, cta, kk, wk[i], lane);
                store_ks(W2F, M2F, kk, wk[i], mk[i]);
            }
            fence_proxy_async();  // in-place generic writes before a later bulk copy into this stage
            __syncthreads();
            if (c == own_chunk) bias_step(ap, own_off, b2s, mb2, oc);
            __syncthreads();  // the stage is free
            if (NCH + c + NST < 2 * NCH) issue_head(NCH + c + NST, par);
        }
        bwd_out(accD, Hp1, DZG1, u0);
    }
    // B1: dZ1's chunks through the ring after R5; the dgrad dZ0[:, U_p] += dZ1 W1 (local) from the chunk's W1 masters
    // (prefetched a chunk ahead into w1m, m1m) before their update, W1's weight gradient and SGD step, their fp16
    // copies, and b1. Its arrays are the driver's, declared there in this order (as pass2's)
    __device__ void b1(int s, const OptimStep& oc, float (&w1m)[KPW][NBT][4], float (&m1m)[KPW][NBT][4],
                       u32 (&ah0)[AMT][2][4], float (&accD)[2][NBT][4], float (&wk)[KPW][NBT][4],
                       float (&mk)[KPW][NBT][4], u32 (&az)[2][4]) {
        load_chunk(W1F, M1F, 0, w1m, m1m);
        if (tid == 0) round_wait(counter, (u32)P * arrived, s);
#pragma unroll 1
        for (int c = 0; c < NST; ++c) issue_act(DZG1 + (long long)c * CU * BR, nullptr, 0u);
        aop_load(ah0, smem_u32(Hp0), lane);
        zero_acc(accD);
#pragma unroll 1
        for (int c = 0; c < NCH; ++c) {
            take_chunk(wk, mk, w1m, m1m);
            if (c + 1 < NCH) load_chunk(W1F, M1F, c + 1, w1m, m1m);
            const u32 sg = wait_act(s);
            if (c == 0) MARK(10);
            const u32 a_st = act0 + sg * ACTB;
#pragma unroll
            for (int i = 0; i < KPW; ++i) {
                const int kl = warp * KPW + i;
                if constexpr (MOM && !MPRE) load_ks(M1F, c * CKS + kl, mk[i]);
                load_act_a(a_st, kl, 0, lane, az[0]);
                load_act_a(a_st, kl, 1, lane, az[1]);
                dgrad_ks(az, wk[i], accD);
                wgrad_ks(a_st, kl, ah0, smem_u32(Hp0), wk[i], mk[i], prm, oc, lane);
                const int kk = c * CKS + kl;
                store_w16(W16F1, cta, kk, wk[i], lane);
                store_ks(W1F, M1F, kk, wk[i], mk[i]);
            }
            if (c == own_chunk) {
                __syncthreads();
                bias_step(actp0 + sg * (ACTB / 2), own_off, b1s, mb1, oc);
            }
            __syncthreads();  // the stage is free
            if (c + NST < NCH) issue_act(DZG1 + (long long)(c + NST) * CU * BR, nullptr, 0u);
        }
        bwd_out(accD, Hp0, dZ0p, 0);
        __syncthreads();
    }
    // the prologue's pass over what this CTA owns, from the flat training state: the masters W0 (rows U_p), W1 and W2
    // (column blocks U_p) and their momentum into fragment order in the global scratch (the lanes that stream a
    // fragment in the steps convert it here), step 0's fp16 copies of W1 and W2; the biases; the W3 slice and its fp16
    // copies of both parities (the pads stay zero: zeroed before)
    __device__ void get_masters() {
        const long long e_w0 = OW0 + (long long)(u0 + g) * D, e_w1 = OW1 + u0 + g, e_w2 = OW2 + u0 + g;
            for (int kk = warp; kk < NKS0; kk += NW)
#pragma unroll
            for (int j = 0; j < NBT; ++j) {
                float w[4];
                get(w, params, e_w0 + 8LL * j * D, 1, kk);
                stcg_f(W0F + (kk * NBT + j) * 32 + lane, w);
                if constexpr (MOM) {
                    get(w, s1g, e_w0 + 8LL * j * D, 1, kk);
                    stcg_f(M0F + (kk * NBT + j) * 32 + lane, w);
                }
            }
#pragma unroll 1
        for (int c = 0; c < NCH; ++c)
#pragma unroll 1
            for (int i = 0; i < KPW; ++i) {
                const int kk = c * CKS + warp * KPW + i;
                float w1[NBT][4], w2[NBT][4];
#pragma unroll
                for (int j = 0; j < NBT; ++j) {
                    get(w1[j], params, e_w1 + 8 * j, H, kk);
                    get(w2[j], params, e_w2 + 8 * j, H, kk);
                    stcg_f(W1F + (kk * NBT + j) * 32 + lane, w1[j]);
                    stcg_f(W2F + (kk * NBT + j) * 32 + lane, w2[j]);
                    if constexpr (MOM) {
                        float m[4];
                        get(m, s1g, e_w1 + 8 * j, H, kk);
                        stcg_f(M1F + (kk * NBT + j) * 32 + lane, m);
                        get(m, s1g, e_w2 + 8 * j, H, kk);
                        stcg_f(M2F + (kk * NBT + j) * 32 + lane, m);
                    }
                }
                store_w16(W16F1, cta, kk, w1, lane);  // step 0's forward copies
                store_w16(W16F2, cta, kk, w2, lane);
            }
        get_biases();
        for (int e = tid; e < 16 * NB; e += NT) {
            const int c = e / NB, u = e % NB;
            if (c < C) get1(w3s[e], mw3 + e, OW3 + (long long)c * H + u0 + u);  // pads stay zero (zeroed above)
            put_w3(0, c, u, w3s[e]);
            put_w3(1, c, u, 0.f);  // parity 1's pads (its real entries are written by step 0)
        }
    }
    // and back at the end of the epoch (the masters with their fp16 copies, the momentum; the rest: GridCta::finish)
    __device__ void put_masters() {
        const long long e_w0 = OW0 + (long long)(u0 + g) * D, e_w1 = OW1 + u0 + g, e_w2 = OW2 + u0 + g;
        for (int kk = warp; kk < NKS0; kk += NW)
#pragma unroll
            for (int j = 0; j < NBT; ++j) {
                float w[4];
                ldcg_f(W0F + (kk * NBT + j) * 32 + lane, w);
                put(w, e_w0 + 8LL * j * D, 1, kk);
                if constexpr (MOM) {
                    ldcg_f(M0F + (kk * NBT + j) * 32 + lane, w);
                    put_m(w, e_w0 + 8LL * j * D, 1, kk);
                }
            }
#pragma unroll 1
        for (int c = 0; c < NCH; ++c)
#pragma unroll 1
            for (int i = 0; i < KPW; ++i) {
                const int kk = c * CKS + warp * KPW + i;
#pragma unroll
                for (int j = 0; j < NBT; ++j) {
                    float w[4];
                    ldcg_f(W1F + (kk * NBT + j) * 32 + lane, w);
                    put(w, e_w1 + 8 * j, H, kk);
                    ldcg_f(W2F + (kk * NBT + j) * 32 + lane, w);
                    put(w, e_w2 + 8 * j, H, kk);
                    if constexpr (MOM) {
                        ldcg_f(M1F + (kk * NBT + j) * 32 + lane, w);
                        put_m(w, e_w1 + 8 * j, H, kk);
                        ldcg_f(M2F + (kk * NBT + j) * 32 + lane, w);
                        put_m(w, e_w2 + 8 * j, H, kk);
                    }
                }
            }
    }
};
// ---- the persistent kernel -------------------------------------------------------------------------------------------
__device__ void grid_stream_epoch(float* params, float* s1g, half_t* w16, const u8* __restrict__ x,
                                  const int* __restrict__ y,
                                  u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch,
                                  float scale, OptimParams prm, u8* scr, u32* sync) {
    extern __shared__ __align__(128) u8 sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int cta = blockIdx.x;
    // grid/plan.py compiled this kernel for this optimizer, batch and launch shape
    if (prm.kind != OPT || batch > BR || batch < 1 || gridDim.x != P || blockDim.x != NT) __trap();
    u8* Xs = sm + SL.x;
    const u32 act0 = smem_u32(sm + SL.act), wr0 = smem_u32(sm + SL.wr);
    half_t* actp0 = reinterpret_cast<half_t*>(sm + SL.act);
    const half_t* wrp0 = reinterpret_cast<const half_t*>(sm + SL.wr);
    float* red = reinterpret_cast<float*>(sm + SL.red);
    half_t* Hp0 = reinterpret_cast<half_t*>(sm + SL.hp);
    half_t* Hp1 = Hp0 + BR * NB;
    half_t* Hp2 = Hp1 + BR * NB;
    half_t* dZ0p = Hp2 + BR * NB;
    float* b0s = reinterpret_cast<float*>(sm + SL.sf);
    float* b1s = b0s + NB;
    float* b2s = b1s + NB;
    float* b3s = b2s + NB;
    float* w3s = b3s + 16;      // [16 classes][NB units]
    float* lg = w3s + 16 * NB;  // [32][16]
    float* dl = lg + BR * 16;   // [32][16]
    float* mb0 = reinterpret_cast<float*>(sm + SL.msf);  // momentum of b0, b1, b2, b3, the W3 slice (same layout)
    float* mb1 = mb0 + NB;
    float* mb2 = mb1 + NB;
    float* mb3 = mb2 + NB;
    float* mw3 = mb3 + 16;
    int* lab = reinterpret_cast<int*>(sm + SL.lab);
#ifdef GRID_PROFILE
    long long* profs = reinterpret_cast<long long*>(sm + SL.prof);
#endif
    const u32 bar0 = smem_u32(sm + SL.bar);
    const u32 xfull0 = bar0, xfull1 = bar0 + 8u;
    float4* W0F = reinterpret_cast<float4*>(scr + SC.w0f) + (long long)cta * NKS0 * NBT * 32;
    float4* W1F = reinterpret_cast<float4*>(scr + SC.w1f) + (long long)cta * KS * NBT * 32;
    float4* W2F = reinterpret_cast<float4*>(scr + SC.w2f) + (long long)cta * KS * NBT * 32;
    float4* M0F = reinterpret_cast<float4*>(scr + SC.m0f) + (long long)cta * NKS0 * NBT * 32;  // MOM only
    float4* M1F = reinterpret_cast<float4*>(scr + SC.m1f) + (long long)cta * KS * NBT * 32;
    float4* M2F = reinterpret_cast<float4*>(scr + SC.m2f) + (long long)cta * KS * NBT * 32;
    half_t* W16F1 = reinterpret_cast<half_t*>(scr + SC.w16f1);
    half_t* W16F2 = reinterpret_cast<half_t*>(scr + SC.w16f2);
    half_t* W3A = reinterpret_cast<half_t*>(scr + SC.w3a);
    half_t* W3B = reinterpret_cast<half_t*>(scr + SC.w3b);
    half_t* HG0 = reinterpret_cast<half_t*>(scr + SC.hg0);
    half_t* HG1 = reinterpret_cast<half_t*>(scr + SC.hg1);
    half_t* HG2 = reinterpret_cast<half_t*>(scr + SC.hg2);
    half_t* DZG1 = reinterpret_cast<half_t*>(scr + SC.dzg1);
    u32* counter = sync;
    const int u0 = cta * NB;  // this CTA's first unit
    const int own_chunk = u0 / CU, own_off = u0 % CU;  // the chunk holding this CTA's units, and where
    const float zs = scale * 16777216.f;  // 2^24 * scale turns the fp16-subnormal pixels back into x * scale
    u32 keys[FEISTEL_ROUNDS];
    u32 r_iss, r_use, arrived;
#ifdef GRID_PROFILE
    bool prof_on;
#endif
    StreamCta ph{{params, s1g, s1g, w16, x, y, n, half_bits, batch, prm, tid, warp, lane, g, t, cta, Xs, act0, wr0, red, dZ0p,
                  b0s, mb0, lab,
#ifdef GRID_PROFILE
                  profs, prof_on,
#endif
                  xfull0, xfull1, W3A, W3B, counter, u0, zs, keys, Hp2, b3s, w3s, lg, dl, mb3, mw3, b1s, b2s, mb1, mb2},
                 wrp0, bar0, W0F, M0F, HG2, r_iss, r_use, arrived, W1F, W2F, M1F, M2F, actp0, Hp0, Hp1, DZG1, W16F1,
                 W16F2, own_chunk, own_off};

    // ---- prologue: shared memory zeroed, mbarriers, the masters from the flat training state into fragment order
    for (int i = tid; i < SL.bar / 16; i += NT) reinterpret_cast<uint4*>(sm)[i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (tid == 0) {
        mbar_init(xfull0, 1);
        mbar_init(xfull1, 1);
        for (u32 i = 0; i < NST; ++i) mbar_init(ph.full(i), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    ph.get_masters();

    // the keyed order of this epoch; step 0's batch
    round_keys(seed_lo, seed_hi, st->epoch, keys);
    __syncthreads();
    if (warp == 1 && steps > 0) ph.issue_x(0);
    r_iss = 0, r_use = 0;  // the ring's issues and uses
    arrived = 0;  // rounds this CTA arrived at in this launch
#ifdef GRID_PROFILE
    prof_on = cta == 0 && tid == 0;
    if (prof_on) profs[15] = clock64();
#endif
    const u32 epoch_in_fit = st->epoch_in_fit;
    const u64 step0 = st->step0;
    const float* lr_table = st->lr;
    double loss_acc = 0.0, ok_acc = 0.0;  // CTA 0, warp 0: the rows each lane took
    OptimStep o_prev{};  // the step of W0 and b0 runs a step late: its rate

    // s = steps runs only the last step's W0 and b0 update (one call site of the pass: code size)
#pragma unroll 1
    for (int s = 0; s <= steps; ++s) {
        const int par = s & 1;
        const bool last = s == steps;
        const u64 k = (u64)epoch_in_fit * steps + s;
        const OptimStep oc = last ? o_prev : optim_step<OPT>(prm, lr_table[k], step0 + k + 1);
        if (!last) mbar_wait(par ? xfull1 : xfull0, (u32)((s >> 1) & 1), s);
        MARK(0);
        // ================= B0(s-1) + F0(s)
        {
            if (s > 0) ph.bias0(o_prev);
            float acc[2][NBT][4];
            zero_acc(acc);
            ph.b0f0(s, s > 0, !last, acc, o_prev);
            if (last) break;
            ph.fwd_out(acc, zs, b0s, Hp0, HG0);  // (its barrier also orders the b0 update before the reads of b0s)
        }
        MARK(1);
        ph.arrive();  // R1
        if (warp == 1 && s + 1 < steps) ph.issue_x(s + 1);  // stage (s+1)&1 held X(s-1): B0(s-1) is done
        // ================= F1, then F2 (one call site: code size)
#pragma unroll 1
        for (int l = 1; l <= 2; ++l) {
            float acc[2][NBT][4];
            zero_acc(acc);
            ph.fwd_layer(s, l == 1 ? HG0 : HG1, l == 1 ? W16F1 : W16F2, acc, 2 * l);
            ph.fwd_out(acc, 1.f, l == 1 ? b1s : b2s, l == 1 ? Hp1 : Hp2, l == 1 ? HG1 : HG2);
            MARK(2 * l + 1);
            ph.arrive();  // R2, R3
        }
        float w2m[KPW][NBT][4], m2m[KPW][NBT][4];  // the next chunk's W2 masters, momentum (chunk 0's fly during
        ph.load_chunk(W2F, M2F, 0, w2m, m2m);         // the head: own data)
        // ================= head, pass 1: logits of the whole batch in every CTA, softmax cross-entropy
        {
            float accL[4][4];
            float l[C], ex[C];  // the row's logits and exponentials
            const double2 sums = ph.head_pass1(s, par, loss_acc, ok_acc, accL, l, ex);
            loss_acc = sums.x;
            ok_acc = sums.y;
        }
        MARK(7);
        // ================= pass 2: dZ2 (a chunk of units at a time, in place in its stage), B2's dgrad, weight
        // gradient and update of the W2 masters of the chunk
        {
            u32 adl[2][4];
            u32 ah1[AMT][2][4];
            float accD[2][NBT][4];
            float wk[KPW][NBT][4], mk[KPW][NBT][4];
            u32 adz[2][4];
            ph.pass2(s, par, oc, w2m, m2m, adl, ah1, accD, wk, mk, adz);
        }
        MARK(8);
        ph.arrive();  // R5
        ph.head_update(par, oc);
        MARK(9);
        // ================= B1: dgrad to dZ0 (local), W1's weight gradient and update, chunk by chunk
        {
            float w1m[KPW][NBT][4], m1m[KPW][NBT][4];
            u32 ah0[AMT][2][4];
            float accD[2][NBT][4];
            float wk[KPW][NBT][4], mk[KPW][NBT][4];
            u32 az[2][4];
            ph.b1(s, oc, w1m, m1m, ah0, accD, wk, mk, az);
        }
        MARK(11);
        o_prev = oc;
    }

    // ---- everything this CTA owns back to the flat training state (the loop's s = steps did the last W0 update)
    __syncthreads();
    ph.put_masters();
    ph.finish<true>(st, epoch_in_fit, loss_acc, ok_acc, steps, arrived);
}

extern "C" __global__ void __launch_bounds__(256, 1)
grid_stream_kernel(float* params, float* s1, float* s2, half_t* w16, const u8* x, const int* y, u32 n, u32 seed_lo,
                   u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch, float scale, float shift,
                   OptimParams opt, u8* scratch, u32* sync) {
#if __CUDA_ARCH__ >= 900
    // SGD keeps at most one state array (s2 unused) and the plan refuses a shift (shift unused)
    grid_stream_epoch(params, s1, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, opt, scratch,
                      sync);
#else
    __trap();  // grid/plan.py refuses GPUs older than sm_90
#endif
}
