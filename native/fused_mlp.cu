// fused_mlp.cu: a whole training epoch of a small MLP (sizes [d, h_1, ..., h_NH, C], NH >= 1 hidden layers of at most
// 16 * S neurons, C <= 16 classes, batch <= 32) in ONE persistent kernel on a thread-block cluster of S CTAs (issue 25;
// the projected design: ../shared/design/fused-v2.md section 3; the infrastructure is fused_logreg.cu's).
//
// What it computes: the same epoch as fused.cu, the graph engine and the NumPy engine: for each step s, the batch of
// positions [s*batch, s*batch + rows) in the epoch's keyed order (shuffle.cuh), uint8 x mapped to x * scale (no
// shift: fused/plan.py sends a shifted normalize to fused.cu); per hidden layer z = W h + b (bias rounded to fp16, z
// stored rounded as fused.cu does), h = act(z) (ReLU or GELU-tanh, activation.cuh) rounded to fp16; logits; softmax
// cross-entropy averaged over the rows (zero dlogits for rows a short last batch lacks); the backward pass; SGD with
// momentum/Nesterov/weight decay through optim.cuh at st->lr[epoch_in_fit * steps + s]; the loss sum and correct count
// added to st->hist. The state comes from and goes back to the engine's flat training state (with the fp16 copy in
// "mixed"), as fused.cu does. "mixed" and "fp16" (masters rounded to fp16 after every update); every product is
// mma.sync m16n8k16 with fp16 operands and fp32 accumulation.
//
// Launch: grid = one cluster of MP_S CTAs (1, 2, 4, 8), block = 288 threads (8 consumer warps, 1 producer warp),
// dynamic shared memory MP_SMEM bytes (fused/plan.py's mlp_smem_bytes; a static_assert checks the layout).
//
// Partition: CTA r owns neurons [16r, 16r + 16) of every hidden layer (their rows of W_l, bias and optimizer state),
// and columns [16r, 16r + 16) of the last layer (row-parallel over the last hidden slice: its partial logits need no
// gather of that layer). Every CTA gathers the whole batch (32 rows of uint8, the producer warp, cp.async on
// mbarriers, MP_ST stages). Layer 0 is weights-stationary: consumer warp w owns input chunks w, w + 8, ... of 16
// features; its lanes hold their fp32 masters (8 a lane a chunk) and SGD's momentum in registers, and pack the fp16 B
// fragments of the forward from them (no copy of W_0 in shared memory). Uint8 pixels are fed as fp16 subnormals
// x * 2^-24 and the scale * 2^24 applied to the fp32 accumulators (fused_logreg.cu's trick).
//
// A step (consumers; B = a named barrier of the 256 consumer threads):
//   wait full[stage]; layer 0 partials (each warp its chunks, 32 rows x 16 neurons) -> red; B; reduce in a fixed
//   order, bias, act -> Z_0 and the own slot of H_0; B; bulk copies of the slot to every peer (AG round)
//   per hidden layer l >= 1: wait AG(H_{l-1}); Z_l, H_l from the gathered H_{l-1} (4 warps, a tile each); B; AG(H_l)
//   last layer: partial logits of the own slice (4 tiles); B; AG(logits); wait; softmax, loss, dlogits of all 32 rows
//   in every CTA (fixed-order sum over the S partials); B
//   last layer backward: dH of the own slice (local: the CTA owns those columns of W_L), its gradient into gL, the
//   replicated bias gradient; dZ = dH * act'(Z); B
//   per hidden layer l = NH-1 .. 1: partial dH_{l-1} over the own 16 neurons, one 32 x 16 tile per destination CTA,
//   each warp sending its tile by bulk copy (RS round); the bias gradient; B; the weight gradient of W_l from the
//   gathered H_{l-1}, applied at once to the masters in shared memory (the dgrad that read them is behind the B);
//   wait RS(dH_{l-1}); sum the S partials in a fixed order, dZ_{l-1} = dH * act'(Z_{l-1}); B
//   layer 0: the weight gradient (dZ_0^T x the staged rows) straight into the register masters; release the stage
//   B; the last layer's weights and every bias updated element-wise; B
// Rounds a step: NH - 1 all-gathers of hidden activations (fp16, 1.5 KB a pair), one of partial logits (fp32), NH - 1
// reduce-scatters (fp32, 2 KB a pair): 784-128x3-10 has 5. No cluster barrier inside the loop.
//
// Why one buffer per round suffices (no double-buffering by parity): every peer's message of step s + 1 depends
// through the step's chain on a message this CTA sends in step s + 1 itself, or (the first all-gather) on this CTA's
// last reduce-scatter of step s, which it sends after its last read of every round buffer of step s. So nothing of
// step s + 1 lands in a buffer before this CTA is done with it; likewise an own slot is rewritten only after every
// peer has consumed it (a peer answers it, directly or through the chain, before this CTA can reach the rewrite). A
// round's mbarrier (count 1, re-armed with its byte count after the B that follows its last wait) cannot complete
// without its arming arrival, so bytes that land before the re-arm are simply counted then. red (layer 0's partials)
// aliases the first reduce-scatter's receive buffer: peers write that only after this step's logits left.
//
// Memory plan (per CTA), 784-128x3-10 with momentum at S = 8, 2 stages: 220 KB of shared memory: the staged rows
// (2 x 25.6 KB), layer-0 partials (16 KB), per hidden layer Z (fp32), dZ in two fp16 layouts, the gathered H (fp16
// [S][32][24]), masters, momentum and the fp16 copy of W_1, W_2 (16 x 128 each), the last layer's 16 x 16 slice, its
// gradient and fp16 copy, biases and their state, the partial logits [S][32][C], fp32 dlogits, reduce-scatter receive
// and send buffers ([S][32][16] fp32 each). Registers: W_0's masters and momentum (8 a lane a chunk, up to 8 chunks).
//
// Code: mlp_epoch is the driver: start_cta (shared memory zeroed, mbarriers); the consumers' state load, then per step
// layer 0's partials (in place: they read the register masters), layer0_out, hidden_fwd, logits_tile, the
// softmax, last_bwd, the hidden layers' backward, layer 0's weight gradient into the registers and the element-wise
// update; the write-back; the producer warp's produce. The SASS of this split is not byte-identical to the code in
// place (same registers, stack and instruction mix; -0.4% to +0.6% instructions): docs/design/fused-engine.md,
// "Kernel code: phases", has the numbers to check on the device, and why the other phases stay in the driver.
#include "activation.cuh"
#include "fused_head.cuh"
#include "optim.cuh"
#include "shuffle.cuh"

// ---- shape, precision, optimizer: compile-time (-D from fused/plan.py's mlp_plan); defaults: 784-128x3-10 ----------
#ifndef MP_NH
#define MP_NH 3
#define MP_SIZES {784, 128, 128, 128, 10}
#define MP_OFFS {0, 100352, 100480, 116864, 116992, 133376, 133504, 134784}
#define MP_S 8
#define MP_ST 2
#define MP_G 16
#define MP_PREC 1
#define MP_NS 1
#define MP_ACT 0
#define MP_SMEM 232448
#endif

constexpr int NH = MP_NH;                // hidden layers
constexpr int L = NH + 1;                // linear layers
constexpr int SZ[L + 1] = MP_SIZES;      // sizes[0] inputs ... sizes[L] classes
constexpr int OFF[2 * L] = MP_OFFS;      // element offsets of W_l, b_l in the flat parameter layout
constexpr int S = MP_S, ST = MP_ST, G = MP_G, PREC = MP_PREC, NS = MP_NS, ACT = MP_ACT;
constexpr int D = SZ[0], C = SZ[L];
constexpr int BR = 32;                   // rows a step (the batch, padded)
constexpr int NCW = 8, NT = (NCW + 1) * 32;
constexpr int K1 = 16 * S;               // a hidden layer's width, padded: S slots of 16 neurons
constexpr int NCHUNK = (D + 15) / 16;    // 16-feature chunks of an input row
constexpr int NJ0 = (NCHUNK + NCW - 1) / NCW;  // layer-0 chunks a consumer warp owns
constexpr int ROWB = NCHUNK * 16 + (NCHUNK % 2 == 0 ? 16 : 0);  // staged row stride (odd 16-byte chunks)
constexpr int XST = BR * ROWB;
constexpr int SLD = 24;                  // fp16 [row][16] tiles: row stride in halfs
constexpr int TLD = BR + 8;              // fp16 [16][row] tiles (transposed): row stride in halfs
constexpr int WLD = K1 + 8;              // fp16 copy of W_l (l >= 1) [16][K1]
constexpr int CE = C + (C & 1);          // partial-logit row stride (even: 8-byte stores)
constexpr int DLD = BR + 16;             // fp32 dlogits [class][row]
constexpr int NX = 2 * NH - 1;           // exchange rounds (mbarriers)
constexpr int XL = NH - 1;               // the logits round; AG(H_l) is round l, RS(dH_{l-1}) is round NH - 1 + l
constexpr bool MOM = NS == 1;
static_assert(NH >= 1 && NH <= 6, "1 to 6 hidden layers");
static_assert(C >= 2 && C <= 16, "one pair of 8-wide class tiles");
static_assert(S == 1 || S == 2 || S == 4 || S == 8, "a portable cluster");
static_assert(NJ0 <= 8, "layer 0's masters: at most 8 chunks a warp in registers");
static_assert(G == 1 || (D % G == 0 && (G == 4 || G == 8 || G == 16)), "cp.async needs aligned rows");
static_assert(PREC == 1 || PREC == 2, "fp16 operands: mixed or fp16");
static_assert(NS <= 1, "SGD: momentum or none (AdamW's moments of W_0 do not fit: fused.cu trains it)");
__host__ __device__ constexpr bool hidden_fits() {
    for (int l = 1; l <= NH; ++l)
        if (SZ[l] > K1) return false;
    return true;
}
static_assert(hidden_fits(), "16 neurons of every hidden layer a CTA");

__host__ __device__ constexpr int up16(int a) { return (a + 15) / 16 * 16; }
__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

struct Lay {  // byte offsets into dynamic shared memory; fused/plan.py's mlp_smem_bytes adds the same parts
    int x, lab, idx, info, red, z[NH], dzt[NH], dzr[NH], hb[NH], hlast, wm[NH], ws[NH], w16[NH];
    int wl, wls, wlg, wl16, b[NH], bs[NH], bg[NH], bl, bls, blg, lbuf, dz32, dzlt, dzlr, rs[NH], rsend[NH], hist, bar,
        total;
};
__host__ __device__ constexpr Lay make_lay() {
    Lay y{};
    int o = 0;
    y.x = o; o += up16(ST * XST);
    y.lab = o; o += up16(ST * BR * 4);
    y.idx = o; o += up16(ST * BR * 4);
    y.info = o; o += up16(ST * 16);
    for (int l = 0; l < NH; ++l) {
        y.z[l] = o; o += up16(BR * 16 * 4);
        y.dzt[l] = o; o += up16(16 * TLD * 2);
        y.dzr[l] = o; o += up16(BR * SLD * 2);
        y.hb[l] = o; o += l < NH - 1 ? up16(S * BR * SLD * 2) : 0;
    }
    y.hlast = o; o += up16(BR * SLD * 2);
    for (int l = 1; l < NH; ++l) {
        y.wm[l] = o; o += up16(16 * K1 * 4);
        y.ws[l] = o; o += MOM ? up16(16 * K1 * 4) : 0;
        y.w16[l] = o; o += up16(16 * WLD * 2);
    }
    y.wl = o; o += up16(16 * 16 * 4);
    y.wls = o; o += MOM ? up16(16 * 16 * 4) : 0;
    y.wlg = o; o += up16(16 * 16 * 4);
    y.wl16 = o; o += up16(16 * SLD * 2);
    for (int l = 0; l < NH; ++l) {
        y.b[l] = o; o += 64;
        y.bs[l] = o; o += 64;
        y.bg[l] = o; o += 64;
    }
    y.bl = o; o += 64;
    y.bls = o; o += 64;
    y.blg = o; o += 64;
    y.lbuf = o; o += up16(S * BR * CE * 4);
    y.dz32 = o; o += up16(16 * DLD * 4);
    y.dzlt = o; o += up16(16 * TLD * 2);
    y.dzlr = o; o += up16(BR * SLD * 2);
    for (int l = 1; l < NH; ++l) {  // RS(dH_{l-1}): receive [S][32][16] fp32 (the first one also holds red), send
        y.rs[l] = o; o += up16(l == NH - 1 ? cmax(S * BR * 16 * 4, NCW * BR * 16 * 4) : S * BR * 16 * 4);
        y.rsend[l] = o; o += up16(S * BR * 16 * 4);
    }
    y.red = NH >= 2 ? y.rs[NH - 1] : o; o += NH >= 2 ? 0 : up16(NCW * BR * 16 * 4);
    y.hist = o; o += up16(NCW * 2 * 8);
    y.bar = o; o += up16((2 * ST + NX) * 8);
    y.total = o;
    return y;
}
constexpr Lay LY = make_lay();
static_assert(LY.total <= MP_SMEM, "fused/plan.py's shared-memory size is smaller than the kernel's layout");

struct StepInfo {
    float lr;
    int rows;
};

// The mbarriers, 8 bytes each from bar0: full[ST], empty[ST], then one per exchange round (NX).
struct Bars {
    u32 bar0;
    __device__ __forceinline__ u32 full(int i) const { return bar0 + 8u * (u32)i; }
    __device__ __forceinline__ u32 empty(int i) const { return bar0 + 8u * (u32)(ST + i); }
    __device__ __forceinline__ u32 xbar(int i) const { return bar0 + 8u * (u32)(2 * ST + i); }
};
// Bytes a CTA receives in exchange round i: an all-gather of H, the logits', a reduce-scatter of dH.
__device__ __forceinline__ u32 xbytes(int i) {
    if (i < XL) return (u32)(S - 1) * BR * SLD * 2;
    if (i == XL) return (u32)(S - 1) * BR * CE * 4;
    return (u32)(S - 1) * BR * 16 * 4;
}

#if MP_PREC == 2
typedef half_t TParam;
#else
typedef float TParam;
#endif

// Fragments of fp16 operands in shared memory (g = lane / 4, t = lane % 4; mma16816's layout).
// A (m16 x k16) from row-major A[m][k], lda halfs.
__device__ __forceinline__ void frag_a(const half_t* A, int lda, int m0, int k0, u32 (&a)[4]) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const half_t* p = A + (m0 + g) * lda + k0 + 2 * t;
    a[0] = *reinterpret_cast<const u32*>(p);
    a[1] = *reinterpret_cast<const u32*>(p + 8 * lda);
    a[2] = *reinterpret_cast<const u32*>(p + 8);
    a[3] = *reinterpret_cast<const u32*>(p + 8 * lda + 8);
}
// B (k16 x n8) from n-major Bt[n][k] (k contiguous), ldb halfs.
__device__ __forceinline__ void frag_b_nk(const half_t* Bt, int ldb, int k0, int n0, u32 (&b)[2]) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const half_t* p = Bt + (n0 + g) * ldb + k0 + 2 * t;
    b[0] = *reinterpret_cast<const u32*>(p);
    b[1] = *reinterpret_cast<const u32*>(p + 8);
}
// B (k16 x n8) from k-major Bk[k][n] (n contiguous), ldb halfs: two 16-bit loads and a PRMT per register.
__device__ __forceinline__ void frag_b_kn(const half_t* Bk, int ldb, int k0, int n0, u32 (&b)[2]) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const half_t* p = Bk + (k0 + 2 * t) * ldb + n0 + g;
    const u32 q0 = p[0], q1 = p[ldb], q2 = p[8 * ldb], q3 = p[9 * ldb];
    b[0] = __byte_perm(q0, q1, 0x5410);
    b[1] = __byte_perm(q2, q3, 0x5410);
}
__device__ __forceinline__ void zero4(float (&d)[4]) { d[0] = d[1] = d[2] = d[3] = 0.f; }
// The sum of v(0..31) in a fixed order (two chains of 16, then their sum): a bias gradient's column, one lane each,
// no shuffles (shuffles in warp-indexed branches make the compiler emit divergence-safe collective code).
template <typename V> __device__ __forceinline__ float col_sum32(V v) {
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        a += v(r);
        b += v(r + 16);
    }
    return a + b;
}

// The CTA's start: shared memory zeroed (every pad stays zero), the mbarriers initialised (each round's armed for
// step 0 before any peer can send), every CTA's barriers in place before anyone sends.
__device__ __forceinline__ void start_cta() {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr Lay LY = make_lay();
    const Bars bar{smem_u32(sm + LY.bar)};
    for (int i = threadIdx.x; i < LY.total / 16; i += NT) reinterpret_cast<uint4*>(sm)[i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < ST; ++i) {
            mbar_init(bar.full(i), 32 + 1);  // each producer lane's cp.async arrival, and lane 0's release
            mbar_init(bar.empty(i), NCW);
        }
        for (int i = 0; i < NX; ++i) {
            mbar_init(bar.xbar(i), 1);
            if (S > 1) mbar_arm_tx(bar.xbar(i), xbytes(i));  // step 0's; re-armed after each wait (see the header)
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if constexpr (S > 1) cluster_sync_full();
}

// Layer 0's outputs: its warps' partials summed in a fixed order, scaled back to x * scale (zs), the bias, the
// activation -> Z_0 and the own slot of H_0 (or H_last); two neurons of one row a thread.
__device__ __forceinline__ void layer0_out(float zs, u32 rank) {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr int SZ[L + 1] = MP_SIZES;
    constexpr Lay LY = make_lay();
    const int tid = threadIdx.x;
    const int n0 = 16 * (int)rank;
    auto F = [&](int off) { return reinterpret_cast<float*>(sm + off); };
    auto Hh = [&](int off) { return reinterpret_cast<half_t*>(sm + off); };
    auto nreal = [&](int l) { return min(16, max(0, SZ[l + 1] - n0)); };
    const int r = tid >> 3, m = 2 * (tid & 7);
    float2 v = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < NCW; ++w) {
        const float2 q = *reinterpret_cast<const float2*>(F(LY.red) + (w * BR + r) * 16 + m);
        v.x += q.x;
        v.y += q.y;
    }
    float z[2] = {v.x * zs, v.y * zs}, h[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (m + i < nreal(0)) {
            z[i] += rnd16(F(LY.b[0])[m + i]);
            h[i] = rnd16(activation<ACT>(z[i]));
            z[i] = rnd16(z[i]);
        } else {
            z[i] = h[i] = 0.f;
        }
    }
    *reinterpret_cast<float2*>(F(LY.z[0]) + r * 16 + m) = make_float2(z[0], z[1]);
    half_t* hd = NH == 1 ? Hh(LY.hlast) : Hh(LY.hb[0]) + (int)rank * BR * SLD;
    *reinterpret_cast<u32*>(hd + r * SLD + m) = pack_h2(h[0], h[1]);
}

// The last layer's partial logits of the own 16 columns into lown, warps 0-3 (a 16 x 8 tile each).
__device__ __forceinline__ void logits_tile(float* lown) {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr Lay LY = make_lay();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    auto Hh = [&](int off) { return reinterpret_cast<half_t*>(sm + off); };
    const int mt = warp >> 1, nt = warp & 1;
    if (nt == 0 || C > 8) {
        u32 a[4], b[2];
        float d[4];
        zero4(d);
        frag_a(Hh(LY.hlast), SLD, mt * 16, 0, a);
        frag_b_nk(Hh(LY.wl16), SLD, 0, nt * 8, b);
        mma16816(d, a, b);
        const int c = nt * 8 + 2 * t, r = mt * 16 + g;
        if (c < C) {
            *reinterpret_cast<float2*>(lown + r * CE + c) = make_float2(d[0], d[1]);
            *reinterpret_cast<float2*>(lown + (r + 8) * CE + c) = make_float2(d[2], d[3]);
        }
    }
}

// The last layer's backward: dH of the own slice times act'(Z) -> dZ_{NH-1} (warps 0-3), its weight gradient
// (warps 4-5), the replicated bias gradient (warp 6).
__device__ __forceinline__ void last_bwd(u32 rank) {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr int SZ[L + 1] = MP_SIZES;
    constexpr Lay LY = make_lay();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n0 = 16 * (int)rank;
    auto F = [&](int off) { return reinterpret_cast<float*>(sm + off); };
    auto Hh = [&](int off) { return reinterpret_cast<half_t*>(sm + off); };
    auto nreal = [&](int l) { return min(16, max(0, SZ[l + 1] - n0)); };
    if (warp < 4) {
        const int mt = warp >> 1, nt = warp & 1;
        u32 a[4], b[2];
        float d[4];
        zero4(d);
        frag_a(Hh(LY.dzlr), SLD, mt * 16, 0, a);     // dlogits [row][class]
        frag_b_kn(Hh(LY.wl16), SLD, 0, nt * 8, b);   // W_L [class][neuron]: k = class, n = neuron
        mma16816(d, a, b);
        const int l = NH - 1;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = mt * 16 + g + 8 * hr, m = nt * 8 + 2 * t;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float zz = F(LY.z[l])[r * 16 + m + i];
                const float dz = m + i < nreal(l) ? rnd16(d[2 * hr + i] * activation_grad<ACT>(zz)) : 0.f;
                const half_t dh = from_f<half_t>(dz);
                Hh(LY.dzt[l])[(m + i) * TLD + r] = dh;
                Hh(LY.dzr[l])[r * SLD + m + i] = dh;
            }
        }
    } else if (warp < 6) {
        const int nt = warp - 4;
        float d[4];
        zero4(d);
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            u32 a[4], b[2];
            frag_a(Hh(LY.dzlt), TLD, 0, ks * 16, a);          // dlogits^T [class][row]
            frag_b_kn(Hh(LY.hlast), SLD, ks * 16, nt * 8, b);  // H [row][neuron]: k = row, n = neuron
            mma16816(d, a, b);
        }
        const int m = nt * 8 + 2 * t;
        *reinterpret_cast<float2*>(F(LY.wlg) + g * 16 + m) = make_float2(d[0], d[1]);
        *reinterpret_cast<float2*>(F(LY.wlg) + (g + 8) * 16 + m) = make_float2(d[2], d[3]);
    } else if (warp == 6 && lane < C) {
        F(LY.blg)[lane] = col_sum32([&](int r) { return F(LY.dz32)[lane * DLD + r]; });
    }
}

// Hidden layer l >= 1 forward, warps 0-3 (a 16 x 8 tile each): Z_l = H_{l-1} W_l^T from the gathered H_{l-1}, the
// bias, the activation -> Z_l and the own slot of H_l (or H_last).
__device__ __forceinline__ void hidden_fwd(int l, u32 rank) {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr int SZ[L + 1] = MP_SIZES;
    constexpr Lay LY = make_lay();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n0 = 16 * (int)rank;
    auto F = [&](int off) { return reinterpret_cast<float*>(sm + off); };
    auto Hh = [&](int off) { return reinterpret_cast<half_t*>(sm + off); };
    auto nreal = [&](int l) { return min(16, max(0, SZ[l + 1] - n0)); };
    const int mt = warp >> 1, nt = warp & 1;
    float d[4];
    zero4(d);
    const half_t* hb = Hh(LY.hb[l - 1]);
#pragma unroll
    for (int q = 0; q < S; ++q) {  // k-step q: the 16 neurons of CTA q
        u32 a[4], b[2];
        frag_a(hb + q * BR * SLD, SLD, mt * 16, 0, a);
        frag_b_nk(Hh(LY.w16[l]), WLD, q * 16, nt * 8, b);
        mma16816(d, a, b);
    }
    half_t* hd = l == NH - 1 ? Hh(LY.hlast) : Hh(LY.hb[l]) + (int)rank * BR * SLD;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = mt * 16 + g + 8 * hr, m = nt * 8 + 2 * t;
        float z[2] = {d[2 * hr], d[2 * hr + 1]}, h[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (m + i < nreal(l)) {
                z[i] += rnd16(F(LY.b[l])[m + i]);
                h[i] = rnd16(activation<ACT>(z[i]));
                z[i] = rnd16(z[i]);
            } else {
                z[i] = h[i] = 0.f;
            }
        }
        *reinterpret_cast<float2*>(F(LY.z[l]) + r * 16 + m) = make_float2(z[0], z[1]);
        *reinterpret_cast<u32*>(hd + r * SLD + m) = pack_h2(h[0], h[1]);
    }
}

// ---- the producer warp: up to ST steps ahead, a batch row a lane ---------------------------------------------------
// Per step: wait empty[stage]; the Feistel index and label of each row; the rows by cp.async (G bytes a unit) or plain
// copies, completing on full[stage]; the step constants by lane 0, released by a plain arrive. (A phase of its own,
// its SASS is not byte-identical to the code in place: issue 37's notes in docs/design/fused-engine.md.)
__device__ __forceinline__ void produce(const u8* __restrict__ x, const int* __restrict__ y, u32 n, u32 seed_lo,
                                        u32 seed_hi, u32 half_bits, u32 epoch, u32 epoch_in_fit,
                                        const float* const& lr_table, int steps, int batch) {
    extern __shared__ __align__(128) u8 sm[];  // the kernel's own symbol
    constexpr Lay LY = make_lay();
    const int lane = threadIdx.x & 31;
    u8* X = sm + LY.x;
    int* lab = reinterpret_cast<int*>(sm + LY.lab);
    int* idxs = reinterpret_cast<int*>(sm + LY.idx);
    StepInfo* info = reinterpret_cast<StepInfo*>(sm + LY.info);
    const Bars bar{smem_u32(sm + LY.bar)};
    u32 keys[FEISTEL_ROUNDS];
    round_keys(seed_lo, seed_hi, epoch, keys);
    constexpr int GF = G > 1 ? G : 1;
    constexpr int UPR = NCHUNK * 16 / GF;  // copy units a staged row
    int stg = 0;
    u32 epar = 1u;
    for (int s = 0; s < steps; ++s) {
        wait_warp<false>(bar.empty(stg), epar, s, W_EMPTY);
        const int rows = min(batch, (int)n - s * batch);
        int* ix = idxs + stg * BR;
        if (lane < rows) {
            const u32 id = permuted_index(keys, half_bits, n, (u32)(s * batch + lane));
            ix[lane] = (int)id;
            if constexpr (G > 1) cp_async4(smem_u32(lab + stg * BR + lane), y + id);
            else lab[stg * BR + lane] = y[id];
        }
        __syncwarp();
        u8* xd = X + stg * XST;
        for (int u = lane; u < rows * UPR; u += 32) {
            const int r = u / UPR, c = u - r * UPR, f = c * GF;
            if (f >= D) continue;  // pad features stay zero
            copy_unit<G>(xd + r * ROWB + f, x + (u64)ix[r] * D + f);
        }
        if constexpr (G > 1) cp_async_arrive_noinc(bar.full(stg));
        else mbar_arrive(bar.full(stg));
        if (lane == 0) {  // the step constants, after the copies are on their way (a global load), released
            info[stg] = StepInfo{lr_table[(u64)epoch_in_fit * steps + s], rows};
            mbar_arrive(bar.full(stg));
        }
        __syncwarp();  // the stage's indices are read by every lane before the next step rewrites another stage
        if (++stg == ST) {
            stg = 0;
            epar ^= 1u;
        }
    }
}

// ---- the kernel ---------------------------------------------------------------------------------------------------
__device__ void mlp_epoch(TParam* params, float* s1g, half_t* w16g, const u8* __restrict__ x,
                          const int* __restrict__ y, u32 n, u32 seed_lo, u32 seed_hi, u32 half_bits, EpochState* est,
                          int steps, int batch, float scale, OptimParams p) {
    extern __shared__ __align__(128) u8 sm[];
    // Device-side copies of the shape tables (indexed by run-time layer numbers that unrolling makes constant).
    constexpr int SZ[L + 1] = MP_SIZES;
    constexpr int OFF[2 * L] = MP_OFFS;
    constexpr Lay LY = make_lay();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const u32 rank = S > 1 ? cluster_rank() : 0u;
    const int n0 = 16 * (int)rank;  // this CTA's first neuron of every hidden layer
    auto F = [&](int off) { return reinterpret_cast<float*>(sm + off); };
    auto Hh = [&](int off) { return reinterpret_cast<half_t*>(sm + off); };
    u8* X = sm + LY.x;
    int* lab = reinterpret_cast<int*>(sm + LY.lab);
    int* idxs = reinterpret_cast<int*>(sm + LY.idx);
    StepInfo* info = reinterpret_cast<StepInfo*>(sm + LY.info);
    const Bars bar{smem_u32(sm + LY.bar)};
    // real neurons of hidden layer l in this CTA, and real input columns of layer l
    auto nreal = [&](int l) { return min(16, max(0, SZ[l + 1] - n0)); };

    start_cta();
    if (p.kind != OPTIM_SGD) __trap();  // fused/plan.py sends AdamW to fused.cu
    const u32 epoch = est->epoch, epoch_in_fit = est->epoch_in_fit;
    const float* lr_table = est->lr;

    if (warp < NCW) {
        // =============================== consumers ===============================
        // layer 0 masters: [0..3] neuron n0 + g, features 16c + 4t .. + 3 of chunk c = warp + 8j; [4..7] neuron g + 8
        const bool lo_real = g < nreal(0), hi_real = g + 8 < nreal(0);
        float mw[NJ0][8], mom[NJ0][8];
        u32 freal = 0;  // bit 4j + i: feature 16c + 4t + i is real
#pragma unroll
        for (int j = 0; j < NJ0; ++j) {
            const int c = warp + NCW * j;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int f = c * 16 + 4 * t + i;
                const bool real = c < NCHUNK && f < D;
                freal |= real ? 1u << (4 * j + i) : 0u;
                const int e0 = OFF[0] + (n0 + g) * D + f, e1 = OFF[0] + (n0 + g + 8) * D + f;
                mw[j][i] = real && lo_real ? to_f(params[e0]) : 0.f;
                mw[j][4 + i] = real && hi_real ? to_f(params[e1]) : 0.f;
                mom[j][i] = MOM && real && lo_real ? s1g[e0] : 0.f;
                mom[j][4 + i] = MOM && real && hi_real ? s1g[e1] : 0.f;
            }
        }
        // layers 1..NH-1 (rows n0.., all input columns), the last layer's columns n0.., biases
        for (int l = 1; l < NH; ++l) {
            const int K = SZ[l];
            for (int e = tid; e < 16 * K1; e += NCW * 32) {
                const int m = e / K1, k = e % K1;
                float w = 0.f, v = 0.f;
                if (m < nreal(l) && k < K) {
                    const int gi = OFF[2 * l] + (n0 + m) * K + k;
                    w = to_f(params[gi]);
                    v = MOM ? s1g[gi] : 0.f;
                }
                F(LY.wm[l])[e] = w;
                if (MOM) F(LY.ws[l])[e] = v;
                Hh(LY.w16[l])[m * WLD + k] = from_f<half_t>(w);
            }
        }
        {
            const int K = SZ[NH];
            const int e = tid;  // 256 threads: [class][neuron]
            const int c = e >> 4, m = e & 15;
            float w = 0.f, v = 0.f;
            if (c < C && m < min(16, max(0, K - n0))) {
                const int gi = OFF[2 * NH] + c * K + n0 + m;
                w = to_f(params[gi]);
                v = MOM ? s1g[gi] : 0.f;
            }
            F(LY.wl)[e] = w;
            if (MOM) F(LY.wls)[e] = v;
            Hh(LY.wl16)[c * SLD + m] = from_f<half_t>(w);
        }
        if (tid < 16 * NH) {
            const int l = tid >> 4, m = tid & 15;
            if (m < nreal(l)) {
                const int gi = OFF[2 * l + 1] + n0 + m;
                F(LY.b[l])[m] = to_f(params[gi]);
                if (MOM) F(LY.bs[l])[m] = s1g[gi];
            }
        } else if (tid >= 128 && tid < 128 + C) {
            const int gi = OFF[2 * NH + 1] + tid - 128;
            F(LY.bl)[tid - 128] = to_f(params[gi]);
            if (MOM) F(LY.bls)[tid - 128] = s1g[gi];
        }
        bar_consumers();

        const float zs = scale * 16777216.f;  // 2^24 * scale: fp16-subnormal pixels back to x * scale
        double loss_acc = 0.0;
        float ok_acc = 0.f;
#ifdef FUSED_PROFILE
        long long prof[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        const bool prof_on = rank == 0 && warp == 0;
        long long prof_t = clock64();
#endif
        // Stage the own slot of a round (written by the threads that call this before the barrier) and send it: one
        // bulk copy to each peer by lanes of warp 0, after every writer's proxy fence and the barrier.
        auto send_slot = [&](u32 slot_addr, u32 bytes, int round) {
            fence_proxy_async();
            bar_consumers();
            if constexpr (S > 1) {
                if (warp == 0 && lane < S - 1) {
                    const u32 q = (u32)lane < rank ? (u32)lane : (u32)lane + 1u;
                    bulk_s2cluster(mapa(slot_addr, q), slot_addr, bytes, mapa(bar.xbar(round), q));
                }
            }
        };
        int stg = 0;
        u32 fpar = 0;
        for (int s = 0; s < steps; ++s) {
            const u32 xpar = (u32)(s & 1);  // every round's barrier completes once a step
            wait_warp<false>(bar.full(stg), fpar, s, W_FULL);
            const StepInfo si = info[stg];
            const int rows = si.rows;
            const float inv_rows = 1.f / (float)rows;
            const OptimStep o = optim_step<OPTIM_SGD>(p, si.lr, 1);
            const u8* xs = X + stg * XST;
            FUSED_PROF(0);

            // ---- layer 0: partials over this warp's chunks, 32 rows x 16 neurons, B fragments from the masters
            {
                float acc[2][2][4];
#pragma unroll
                for (int a = 0; a < 2; ++a)
#pragma unroll
                    for (int b = 0; b < 2; ++b) zero4(acc[a][b]);
                const u8* xr = xs + g * ROWB + 4 * t;
#pragma unroll
                for (int j = 0; j < NJ0; ++j) {
                    const int c = warp + NCW * j;
                    if (c < NCHUNK) {
                        const u32 x0 = *reinterpret_cast<const u32*>(xr + c * 16);
                        const u32 x1 = *reinterpret_cast<const u32*>(xr + 8 * ROWB + c * 16);
                        const u32 x2 = *reinterpret_cast<const u32*>(xr + 16 * ROWB + c * 16);
                        const u32 x3 = *reinterpret_cast<const u32*>(xr + 24 * ROWB + c * 16);
                        u32 a0[4], a1[4];  // rows g, g + 8 and 16 + g, 24 + g (K permuted inside the chunk)
                        u8_a_frags(x0, x1, a0);
                        u8_a_frags(x2, x3, a1);
                        const u32 b0[2] = {pack_h2(mw[j][0], mw[j][1]), pack_h2(mw[j][2], mw[j][3])};
                        const u32 b1[2] = {pack_h2(mw[j][4], mw[j][5]), pack_h2(mw[j][6], mw[j][7])};
                        mma16816(acc[0][0], a0, b0);
                        mma16816(acc[0][1], a0, b1);
                        mma16816(acc[1][0], a1, b0);
                        mma16816(acc[1][1], a1, b1);
                    }
                }
                float* red = F(LY.red) + warp * BR * 16;
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt) {
                        float* q = red + (mt * 16 + g) * 16 + nt * 8 + 2 * t;
                        *reinterpret_cast<float2*>(q) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
                        *reinterpret_cast<float2*>(q + 8 * 16) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
                    }
            }
            bar_consumers();
            layer0_out(zs, rank);  // the fixed-order sum over the warps, bias, activation
            if constexpr (NH >= 2) send_slot(smem_u32(Hh(LY.hb[0]) + (int)rank * BR * SLD), BR * SLD * 2, 0);
            else bar_consumers();
            FUSED_PROF(1);

            // ---- hidden layers 1 .. NH-1: Z_l = H_{l-1} W_l^T from the gathered H_{l-1} (4 warps, a 16 x 8 tile each)
#pragma unroll
            for (int l = 1; l < NH; ++l) {
                FUSED_PROF(2);  // hidden forward: compute and the send (the first: layer 0's send)
                if constexpr (S > 1) wait_warp<true>(bar.xbar(l - 1), xpar, s, W_XCHG + l - 1);
                FUSED_PROF(8);  // hidden forward: the all-gather's wait
                if (warp < 4) hidden_fwd(l, rank);
                if (l < NH - 1) send_slot(smem_u32(Hh(LY.hb[l]) + (int)rank * BR * SLD), BR * SLD * 2, l);
                else bar_consumers();
                if (S > 1 && tid == 0) mbar_arm_tx(bar.xbar(l - 1), xbytes(l - 1));  // every warp passed its wait
            }
            FUSED_PROF(2);

            // ---- last layer: partial logits of the own 16 columns (4 tiles), all-gathered
            float* lown = F(LY.lbuf) + (int)rank * BR * CE;
            if (warp < 4) logits_tile(lown);
            send_slot(smem_u32(lown), BR * CE * 4, XL);
            if constexpr (S > 1) wait_warp<true>(bar.xbar(XL), xpar, s, W_XCHG + XL);
            FUSED_PROF(3);

            // ---- softmax, loss, argmax, dlogits of all 32 rows (warps 0 and 1, two lanes a row), as fused_logreg.cu
            if (__all_sync(0xffffffffu, warp < 2)) {  // a vote: warp-uniform to the compiler (no collective code)
                constexpr int CH = (C + 1) / 2;
                const int rl = lane >> 1, hh = lane & 1, r = 16 * warp + rl, cb = hh * CH;
                const bool valid = r < rows;
                float d[CH];
                softmax_pair<C, S>(F(LY.lbuf) + r * CE, BR * CE, F(LY.bl), valid, valid ? lab[stg * BR + r] : -1,
                                   inv_rows, d, loss_acc, ok_acc);
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    if (cb + c < C) {
                        const half_t dh = from_f<half_t>(d[c]);
                        F(LY.dz32)[(cb + c) * DLD + r] = d[c];
                        Hh(LY.dzlt)[(cb + c) * TLD + r] = dh;
                        Hh(LY.dzlr)[r * SLD + cb + c] = dh;
                    }
                }
            }
            bar_consumers();
            if (S > 1 && tid == 0) mbar_arm_tx(bar.xbar(XL), xbytes(XL));
            FUSED_PROF(4);

            // ---- last layer backward: dH of the own slice (warps 0-3), its weight gradient (warps 4-5), the
            // replicated bias gradient (warp 6)
            last_bwd(rank);
            bar_consumers();
            FUSED_PROF(5);

            // ---- hidden layers NH-1 .. 1: RS of dH_{l-1}, bias and weight gradients (W_l updated at once)
#pragma unroll
            for (int l = NH - 1; l >= 1; --l) {
                const int rr = NH - 1 + l;  // the round
                if (warp < S) {  // dH_{l-1} partial, columns of CTA q = warp: 32 x 16, both m-tiles, two n-tiles
                    const int q = warp;
                    float d[2][2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        u32 a[4];
                        frag_a(Hh(LY.dzr[l]), SLD, mt * 16, 0, a);  // dZ_l [row][neuron]: k = neuron
#pragma unroll
                        for (int nt = 0; nt < 2; ++nt) {
                            u32 b[2];
                            frag_b_kn(Hh(LY.w16[l]), WLD, 0, q * 16 + nt * 8, b);  // W_l [neuron][input]
                            zero4(d[mt][nt]);
                            mma16816(d[mt][nt], a, b);
                        }
                    }
                    float* dst = q == (int)rank ? F(LY.rs[l]) + q * BR * 16 : F(LY.rsend[l]) + q * BR * 16;
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                        for (int nt = 0; nt < 2; ++nt) {
                            float* pp = dst + (mt * 16 + g) * 16 + nt * 8 + 2 * t;
                            *reinterpret_cast<float2*>(pp) = make_float2(d[mt][nt][0], d[mt][nt][1]);
                            *reinterpret_cast<float2*>(pp + 8 * 16) = make_float2(d[mt][nt][2], d[mt][nt][3]);
                        }
                    if (S > 1 && q != (int)rank) {  // to CTA q's slot of this rank, on its round barrier
                        fence_proxy_async();
                        __syncwarp();
                        if (lane == 0) {
                            const u32 src = smem_u32(dst);
                            const u32 rdst = smem_u32(F(LY.rs[l]) + (int)rank * BR * 16);
                            bulk_s2cluster(mapa(rdst, (u32)q), src, BR * 16 * 4, mapa(bar.xbar(rr), (u32)q));
                        }
                    }
                }
                if (warp == NCW - 1 && lane < 16)  // the bias gradient of the own neurons: column sums of dZ_l
                    F(LY.bg[l])[lane] = col_sum32([&](int r) { return to_f(Hh(LY.dzr[l])[r * SLD + lane]); });
                FUSED_PROF(6);  // hidden backward: dgrad, sends, bias (the first: the last layer's B)
                bar_consumers();  // W_l's fp16 copy read by every dgrad above before the update below rewrites it
                if (warp < S) {  // weight gradient of W_l, input columns of slot q = warp, and the SGD step at once
                    const int q = warp;
                    const half_t* hprev = Hh(LY.hb[l - 1]) + q * BR * SLD;
                    float d[2][4];
                    zero4(d[0]);
                    zero4(d[1]);
#pragma unroll
                    for (int ks = 0; ks < 2; ++ks) {
                        u32 a[4];
                        frag_a(Hh(LY.dzt[l]), TLD, 0, ks * 16, a);  // dZ_l^T [neuron][row]
#pragma unroll
                        for (int nt = 0; nt < 2; ++nt) {
                            u32 b[2];
                            frag_b_kn(hprev, SLD, ks * 16, nt * 8, b);  // H_{l-1} [row][input]
                            mma16816(d[nt], a, b);
                        }
                    }
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int m = g + 8 * (e >> 1), k = q * 16 + nt * 8 + 2 * t + (e & 1);
                            if (m < nreal(l) && k < SZ[l]) {
                                float w = F(LY.wm[l])[m * K1 + k], v = MOM ? F(LY.ws[l])[m * K1 + k] : 0.f, u = 0.f;
                                optim_update<OPTIM_SGD>(p, o, NS, d[nt][e], w, v, u);
                                if constexpr (PREC == 2) w = rnd16(w);
                                F(LY.wm[l])[m * K1 + k] = w;
                                if (MOM) F(LY.ws[l])[m * K1 + k] = v;
                                Hh(LY.w16[l])[m * WLD + k] = from_f<half_t>(w);
                            }
                        }
                }
                // dZ_{l-1} = (the S partials summed in a fixed order) * act'(Z_{l-1})
                FUSED_PROF(9);  // hidden backward: B, weight gradient and update
                if constexpr (S > 1) wait_warp<true>(bar.xbar(rr), xpar, s, W_XCHG + rr);
                FUSED_PROF(10);  // hidden backward: the reduce-scatter's wait
                {
                    const int r = tid >> 3, m = 2 * (tid & 7);
                    float2 v = make_float2(0.f, 0.f);
#pragma unroll
                    for (int q = 0; q < S; ++q) {
                        const float2 u = *reinterpret_cast<const float2*>(F(LY.rs[l]) + (q * BR + r) * 16 + m);
                        v.x += u.x;
                        v.y += u.y;
                    }
                    const float dv[2] = {v.x, v.y};
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const float zz = F(LY.z[l - 1])[r * 16 + m + i];
                        const float dz = m + i < nreal(l - 1) ? rnd16(dv[i] * activation_grad<ACT>(zz)) : 0.f;
                        const half_t dh = from_f<half_t>(dz);
                        Hh(LY.dzt[l - 1])[(m + i) * TLD + r] = dh;
                        Hh(LY.dzr[l - 1])[r * SLD + m + i] = dh;
                    }
                }
                bar_consumers();
                if (S > 1 && tid == 0) mbar_arm_tx(bar.xbar(rr), xbytes(rr));
                FUSED_PROF(11);  // hidden backward: dZ of the layer below, B
            }
            FUSED_PROF(6);

            // ---- layer 0: weight gradient (m = neuron, n = feature, k = row) into the register masters; bias
            {
                u32 af[2][4];
                frag_a(Hh(LY.dzt[0]), TLD, 0, 0, af[0]);
                frag_a(Hh(LY.dzt[0]), TLD, 0, 16, af[1]);
#pragma unroll
                for (int j = 0; j < NJ0; ++j) {
                    const int c = warp + NCW * j;
                    if (c < NCHUNK) {
                        float a0[4] = {0.f, 0.f, 0.f, 0.f}, a1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                        for (int ks = 0; ks < 2; ++ks) {
                            wgrad_kstep<false>(xs + c * 16 + 2 * g + (ks * 16 + 2 * t) * ROWB, ROWB, af[ks], a0, a1);
                        }
                        float ac[8];  // neurons g, g + 8 (n-tile 0: features 4t, 4t+2; n-tile 1: 4t+1, 4t+3)
                        chunk_grads(a0, a1, ac);
#pragma unroll
                        for (int e = 0; e < 8; ++e) {  // pads: zero gradient, weight and state stay zero
                            float w = mw[j][e], v = mom[j][e], u = 0.f;
                            optim_update<OPTIM_SGD>(p, o, NS, ac[e] * zs, w, v, u);
                            if constexpr (PREC == 2) w = rnd16(w);
                            mw[j][e] = w;
                            if (MOM) mom[j][e] = v;
                        }
                    }
                }
                if (warp == NCW - 1 && lane < 16)  // layer 0's bias gradient (dZ_0 complete since the last barrier)
                    F(LY.bg[0])[lane] = col_sum32([&](int r) { return to_f(Hh(LY.dzr[0])[r * SLD + lane]); });
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(bar.empty(stg));
            bar_consumers();
            FUSED_PROF(7);

            // ---- the last layer's slice and every bias: element-wise
            {
                const int c = tid >> 4, m = tid & 15;  // W_L [class][neuron]
                if (c < C && m < nreal(NH - 1)) {
                    float w = F(LY.wl)[tid], v = MOM ? F(LY.wls)[tid] : 0.f, u = 0.f;
                    optim_update<OPTIM_SGD>(p, o, NS, F(LY.wlg)[tid], w, v, u);
                    if constexpr (PREC == 2) w = rnd16(w);
                    F(LY.wl)[tid] = w;
                    if (MOM) F(LY.wls)[tid] = v;
                    Hh(LY.wl16)[c * SLD + m] = from_f<half_t>(w);
                }
                if (tid < 16 * NH) {
                    const int l = tid >> 4, mm = tid & 15;
                    if (mm < nreal(l)) {
                        float w = F(LY.b[l])[mm], v = MOM ? F(LY.bs[l])[mm] : 0.f, u = 0.f;
                        // a bias: its decay is bias_decay (optim.cuh)
                        optim_update<OPTIM_SGD>(optim_bias(p), o, NS, F(LY.bg[l])[mm], w, v, u);
                        if constexpr (PREC == 2) w = rnd16(w);
                        F(LY.b[l])[mm] = w;
                        if (MOM) F(LY.bs[l])[mm] = v;
                    }
                } else if (tid >= 128 && tid < 128 + C) {  // the replicated bias: the same arithmetic everywhere
                    const int cc = tid - 128;
                    float w = F(LY.bl)[cc], v = MOM ? F(LY.bls)[cc] : 0.f, u = 0.f;
                    // a bias: its decay is bias_decay (optim.cuh)
                    optim_update<OPTIM_SGD>(optim_bias(p), o, NS, F(LY.blg)[cc], w, v, u);
                    if constexpr (PREC == 2) w = rnd16(w);
                    F(LY.bl)[cc] = w;
                    if (MOM) F(LY.bls)[cc] = v;
                }
            }
            bar_consumers();
            if (++stg == ST) {
                stg = 0;
                fpar ^= 1u;
            }
        }
#ifdef FUSED_PROFILE
        if (prof_on && lane == 0 && steps > 0)
            printf("fused_mlp phases (cycles/step, CTA 0 warp 0): rows-wait %lld layer0 %lld hidden-fwd %lld "
                   "all-gather-waits %lld logits %lld softmax %lld last-bwd %lld hidden-bwd: dgrad+send %lld "
                   "wgrad+update %lld reduce-scatter-waits %lld dz %lld; layer0-bwd %lld\n",
                   prof[0] / steps, prof[1] / steps, prof[2] / steps, prof[8] / steps, prof[3] / steps,
                   prof[4] / steps, prof[5] / steps, prof[6] / steps, prof[9] / steps, prof[10] / steps,
                   prof[11] / steps, prof[7] / steps);
#endif

        // ---- write the state back: W_0 from the registers, the rest from shared memory; CTA 0 the last bias
#pragma unroll
        for (int j = 0; j < NJ0; ++j) {
            const int c = warp + NCW * j;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (!(freal & (1u << (4 * j + i)))) continue;
                const int f = c * 16 + 4 * t + i;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (!(h ? hi_real : lo_real)) continue;
                    const int e = OFF[0] + (n0 + g + 8 * h) * D + f;
                    params[e] = from_f<TParam>(mw[j][4 * h + i]);
                    if (w16g) w16g[e] = from_f<half_t>(mw[j][4 * h + i]);
                    if (MOM) s1g[e] = mom[j][4 * h + i];
                }
            }
        }
        for (int l = 1; l < NH; ++l) {
            const int K = SZ[l];
            for (int e = tid; e < 16 * K1; e += NCW * 32) {
                const int m = e / K1, k = e % K1;
                if (m < nreal(l) && k < K) {
                    const int gi = OFF[2 * l] + (n0 + m) * K + k;
                    const float w = F(LY.wm[l])[e];
                    params[gi] = from_f<TParam>(w);
                    if (w16g) w16g[gi] = from_f<half_t>(w);
                    if (MOM) s1g[gi] = F(LY.ws[l])[e];
                }
            }
        }
        {
            const int K = SZ[NH], c = tid >> 4, m = tid & 15;
            if (c < C && m < min(16, max(0, K - n0))) {
                const int gi = OFF[2 * NH] + c * K + n0 + m;
                params[gi] = from_f<TParam>(F(LY.wl)[tid]);
                if (w16g) w16g[gi] = from_f<half_t>(F(LY.wl)[tid]);
                if (MOM) s1g[gi] = F(LY.wls)[tid];
            }
        }
        if (tid < 16 * NH) {
            const int l = tid >> 4, m = tid & 15;
            if (m < nreal(l)) {
                const int gi = OFF[2 * l + 1] + n0 + m;
                params[gi] = from_f<TParam>(F(LY.b[l])[m]);
                if (w16g) w16g[gi] = from_f<half_t>(F(LY.b[l])[m]);
                if (MOM) s1g[gi] = F(LY.bs[l])[m];
            }
        } else if (rank == 0 && tid >= 128 && tid < 128 + C) {
            const int gi = OFF[2 * NH + 1] + tid - 128;
            params[gi] = from_f<TParam>(F(LY.bl)[tid - 128]);
            if (w16g) w16g[gi] = from_f<half_t>(F(LY.bl)[tid - 128]);
            if (MOM) s1g[gi] = F(LY.bls)[tid - 128];
        }
        epoch_history<NCW>(loss_acc, ok_acc, reinterpret_cast<double*>(sm + LY.hist), est, epoch_in_fit, rank);
    } else {
        // =============================== the producer warp ===============================
        produce(x, y, n, seed_lo, seed_hi, half_bits, epoch, epoch_in_fit, lr_table, steps, batch);
    }
    __syncthreads();
    if constexpr (S > 1) cluster_sync_full();
}

extern "C" __global__ void __launch_bounds__(NT, 1)
fused_mlp_kernel(TParam* params, float* s1, float* s2, half_t* w16, const u8* x, const int* y, u32 n, u32 seed_lo,
                 u32 seed_hi, u32 half_bits, EpochState* st, int steps, int batch, float scale, float shift,
                 OptimParams opt) {
#if __CUDA_ARCH__ >= 900
    (void)s2;
    (void)shift;  // fused/plan.py sends a nonzero shift to fused.cu
    mlp_epoch(params, s1, w16, x, y, n, seed_lo, seed_hi, half_bits, st, steps, batch, scale, opt);
#else
    __trap();
#endif
}
