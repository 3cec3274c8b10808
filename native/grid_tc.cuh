// grid_tc.cuh: what the grid engine's two tensor-core kernels (grid_fast.cu, grid_stream.cu) share beyond grid.cuh:
// the inline PTX of their bulk copies, ldmatrix / movmatrix / prmt operands and L2-only loads, the ReLU mask of an
// fp16 pair, the activation tiles' layout (index, A fragments, column sums), the staged rows' fragments of W0's
// products, the waits with watchdogs (round counter, mbarrier), the head (logits, softmax cross-entropy, the in-place
// dZ2, operands and W3 copies), the history and the phase profile. The including kernel defines GRID_KERNEL, its file
// name, for the watchdog's message. The kernels' SASS was kept byte-identical when these left them: where a function
// takes an argument in an unusual form (sums by value, arrays of the caller's, a pointer already at the lane's
// column), that form is what keeps it so.
#pragma once
#include "grid.cuh"
#include "loss.cuh"

#ifndef GRID_KERNEL
#error "define GRID_KERNEL (the kernel's file name, for the watchdog's message) before grid_tc.cuh"
#endif

// the scratch layouts' alignment: 128 bytes, a whole L2 line, for every buffer
__host__ __device__ constexpr long long up128(long long a) { return (a + 127) / 128 * 128; }
// The global scratch both kernels lay out alike from byte o (each kernel's Scratch has these fields): W1's and W2's
// fp16 rows in fragment order (h x h each), W3's two fp16 operand copies by step parity, and the four exchange
// buffers (H0, H1, H2, dZ1; h x 32 rows of fp16). Returns the first byte after them. grid/plan.py's
// fast_scratch_bytes and stream_scratch_bytes count the same.
template <class S> __host__ __device__ constexpr long long shared_scratch(S& s, long long o, int h, int ks, int br) {
    s.w16f1 = o; o += up128(2LL * h * h);
    s.w16f2 = o; o += up128(2LL * h * h);
    s.w3a = o; o += up128(2LL * 2 * ks * 32 * 8);
    s.w3b = o; o += up128(2LL * 2 * (h / 8) * 32 * 4);
    s.hg0 = o; o += up128(2LL * h * br);
    s.hg1 = o; o += up128(2LL * h * br);
    s.hg2 = o; o += up128(2LL * h * br);
    s.dzg1 = o; o += up128(2LL * h * br);
    return o;
}

// ---- PTX helpers ----------------------------------------------------------------------------------------------------
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32 a, u32 (&d)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(u32 a, u32 (&d)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x2_t(u32 a, u32& d0, u32& d1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(d0), "=r"(d1) : "r"(a) : "memory");
}
__device__ __forceinline__ u32 movtrans(u32 a) {
    u32 d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
__device__ __forceinline__ uint4 ldcg16(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ldcg8(const void* p) {
    uint2 v;
    asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
// the ReLU mask by the fp16 activation (strictly positive: sign clear, not zero) applied to two fp32 values
__device__ __forceinline__ u32 mask_pack(float d0, float d1, u32 h) {
    const bool m0 = (short)(h & 0xffffu) > 0, m1 = (short)(h >> 16) > 0;
    return pack_h2(m0 ? d0 : 0.f, m1 ? d1 : 0.f);
}
__device__ __forceinline__ bool h_pos(half_t h) { return (short)h > 0; }

// ---- activation tiles ([8-unit tiles][32 rows][8] fp16: the exchange buffers, stages and own tiles) -----------------
// the element (row, unit) of an activation tile
__device__ __forceinline__ int cg_idx(int row, int unit) { return ((unit >> 3) * 32 + row) * 8 + (unit & 7); }
// A fragments of an activation tile (shared memory at act) for (m-tile mt of rows, k-step kl of 16 units)
__device__ __forceinline__ void load_act_a(u32 act, int kl, int mt, int lane, u32 (&a)[4]) {
    const int j4 = lane >> 3, r = lane & 7;
    ldsm_x4(act + (u32)((((2 * kl + (j4 >> 1)) * 32) + 16 * mt + (j4 & 1) * 8 + r) << 4), a);
}
// the sum over the 32 rows of unit col of a dZ tile, in row order (a bias gradient: the same bits in every CTA)
__device__ __forceinline__ float tile_col_sum(const half_t* dz, int col) {
    float sd = 0.f;
    for (int b = 0; b < 32; ++b) sd += to_f(dz[cg_idx(b, col)]);
    return sd;
}

// ---- the batch's staged rows ([32][D] elements: uint8 pixels, or the bits of fp16 operands) -----------------------
// B fragments (k = rows) of W0's weight gradient at feature pix: bx[kb] = rows (16kb + 2t, +1), (+8, +9), each pair's
// elements in the low and high halves (uint8 pixels: the fp16 subnormals x * 2^-24)
template <int D, typename T>
__device__ __forceinline__ void rows_b_frags(const T* x, int pix, int t, u32 (&bx)[2][2]) {
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
        const int r = 16 * kb + 2 * t;
        bx[kb][0] = prmt(x[r * D + pix], x[(r + 1) * D + pix], 0x5410u);
        bx[kb][1] = prmt(x[(r + 8) * D + pix], x[(r + 9) * D + pix], 0x5410u);
    }
}

// A fragments (rows r0, r0 + 8 x features c0, c0 + 1 and c0 + 8, c0 + 9) of W0's forward, x at the rows' feature
// c0 (the caller adds c0: the compiler then forms the addresses as it did inline): uint8 pixel pairs as two fp16
// subnormals each, or fp16 pairs as they are
template <int D>
__device__ __forceinline__ uint4 rows_a_frags(const u8* x, int r0) {
    uint4 a;
    a.x = prmt(*reinterpret_cast<const unsigned short*>(x + r0 * D), 0u, 0x4140u);
    a.y = prmt(*reinterpret_cast<const unsigned short*>(x + (r0 + 8) * D), 0u, 0x4140u);
    a.z = prmt(*reinterpret_cast<const unsigned short*>(x + r0 * D + 8), 0u, 0x4140u);
    a.w = prmt(*reinterpret_cast<const unsigned short*>(x + (r0 + 8) * D + 8), 0u, 0x4140u);
    return a;
}
template <int D>
__device__ __forceinline__ uint4 rows_a_frags(const unsigned short* x, int r0) {
    uint4 a;
    a.x = *reinterpret_cast<const u32*>(x + r0 * D);
    a.y = *reinterpret_cast<const u32*>(x + (r0 + 8) * D);
    a.z = *reinterpret_cast<const u32*>(x + r0 * D + 8);
    a.w = *reinterpret_cast<const u32*>(x + (r0 + 8) * D + 8);
    return a;
}

// ---- waits with watchdogs: a lost arrival traps within seconds, naming where --------------------------------------
__device__ __noinline__ void grid_stuck(int what, u32 v, u32 target, int s) {
    printf(GRID_KERNEL " watchdog: %s at step %d, block %d, thread %d: %u of %u\n",
           what == 0 ? "round counter" : "mbarrier parity", s, (int)blockIdx.x, (int)threadIdx.x, v, target);
    __trap();
}
__device__ __forceinline__ void watchdog(u32& polls, u64& t0, int what, u32 v, u32 target, int s) {
    if (wait_expired(polls, t0)) grid_stuck(what, v, target, s);
}
__device__ __forceinline__ void mbar_wait(u32 a, u32 parity, int s) {
    u32 polls = 0;
    u64 t0 = 0;
    while (!mbar_try(a, parity)) watchdog(polls, t0, 1, a, parity, s);
}
// one CTA's arrival: every thread's global writes, then one thread's gpu-scope release (grid.md rule 3)
__device__ __forceinline__ void round_arrive(u32* counter) {
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
// thread 0 only: until all P CTAs arrived; then the bulk copies it issues may read their data
__device__ __forceinline__ void round_wait(const u32* counter, u32 target, int s) {
    u32 polls = 0, v;
    u64 t0 = 0;
    while (true) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
        if ((int)(v - target) >= 0) break;
        watchdog(polls, t0, 0, v, target, s);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- the head (8 warps of 32 lanes, 32 rows a step, classes in one m16 tile) ---------------------------------------
// dlogits [32][16] (fp32) as the fp16 A fragments of the head's dgrad (rows 16mt.., classes)
__device__ __forceinline__ void dlogits_operand(const float* dl, int g, int t, u32 (&adl)[2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        const int r0 = 16 * mt + g;
        adl[mt][0] = pack_h2(dl[r0 * 16 + 2 * t], dl[r0 * 16 + 2 * t + 1]);
        adl[mt][1] = pack_h2(dl[(r0 + 8) * 16 + 2 * t], dl[(r0 + 8) * 16 + 2 * t + 1]);
        adl[mt][2] = pack_h2(dl[r0 * 16 + 2 * t + 8], dl[r0 * 16 + 2 * t + 9]);
        adl[mt][3] = pack_h2(dl[(r0 + 8) * 16 + 2 * t + 8], dl[(r0 + 8) * 16 + 2 * t + 9]);
    }
}
// element (class c, unit nn) of W3 into its fp16 operand copies of parity par: W3A [2][h/16][32][8] (the A operand of
// logits^T) and W3B [2][h/8][32][4] (the B operand of the head's dgrad); classes past C (the pads) as zeros
template <int C, int H>
__device__ __forceinline__ void store_w3(half_t* W3A, half_t* W3B, int par, int c, int nn, float wv) {
    constexpr int KS = H / 16;
    const half_t hv = from_f<half_t>(c < C ? wv : 0.f);
    const int o = nn & 15;
    W3A[((long long)(par * KS + (nn >> 4)) * 32 + (c & 7) * 4 + ((o & 7) >> 1)) * 8 + ((o >= 8) ? 4 : 0) +
        ((c >= 8) ? 2 : 0) + (o & 1)] = hv;
    W3B[((long long)(par * (H / 8) + (nn >> 3)) * 32 + (nn & 7) * 4 + ((c & 7) >> 1)) * 4 + ((c >= 8) ? 2 : 0) +
        (c & 1)] = hv;
}
// logits^T of k-step kl: W3's A fragment af (16 classes x 16 units) x the activation tile's B fragments (ldmatrix
// .trans: units x rows 8nt.., the tile at act) into accL[nt] (j4 = lane >> 3, r = lane & 7)
__device__ __forceinline__ void head_kstep(u32 act, int kl, uint4 af, int j4, int r, float (&accL)[4][4]) {
#pragma unroll
    for (int ntp = 0; ntp < 4; ntp += 2) {
        u32 b[4];
        ldsm_x4(act + (u32)((((2 * kl + (j4 & 1)) * 32) + 8 * (ntp + (j4 >> 1)) + r) << 4), b);
        mma16816(accL[ntp], af.x, af.y, af.z, af.w, b[0], b[1]);
        mma16816(accL[ntp + 1], af.x, af.y, af.z, af.w, b[2], b[3]);
    }
}
// dZ2 of k-step kl (n-tiles 2kl, 2kl + 1 of 8 units) in place: dlogits (A fragments adl) x W3's B fragments (w3b: this
// lane's uint2 of n-tile 0, 32 a tile; CG: in global memory, read past L1), ReLU-masked by the H2 it overwrites in the
// activation tile ([n-tiles][32 rows][8] fp16; apt: at this lane's unit pair 2t of row 0), and as the A fragments
// adz of B2's dgrad. The caller offsets apt by 2t: the compiler then forms the addresses as it did inline.
template <bool CG>
__device__ __forceinline__ void dz2_kstep(const u32 (&adl)[2][4], const uint2* w3b, half_t* apt, int kl, int g,
                                          u32 (&adz)[2][4]) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
        const int ntl = 2 * kl + h2;
        uint2 wb;
        if constexpr (CG) wb = ldcg8(w3b + ntl * 32);
        else wb = w3b[ntl * 32];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            mma16816(d, adl[mt][0], adl[mt][1], adl[mt][2], adl[mt][3], wb.x, wb.y);
            const int r0 = 16 * mt + g;
            u32* q0 = reinterpret_cast<u32*>(apt + (ntl * 32 + r0) * 8);
            u32* q1 = reinterpret_cast<u32*>(apt + (ntl * 32 + r0 + 8) * 8);
            const u32 z0 = mask_pack(d[0], d[1], *q0), z1 = mask_pack(d[2], d[3], *q1);
            *q0 = z0;
            *q1 = z1;
            adz[mt][2 * h2] = z0;
            adz[mt][2 * h2 + 1] = z1;
        }
    }
}
// the logits of the whole batch: each warp's partial logits^T (accL[nt]: classes g, g + 8 x rows 8nt + 2t, +1 of its
// k-steps) through red [8 warps][16][40], summed over the warps in a fixed order (identical bits in every CTA) plus b3
// into lg [32 rows][16]; every thread calls it (two barriers: lg is complete when it returns)
template <int C>
__device__ __forceinline__ void head_logits(const float (&accL)[4][4], float* red, const float* b3s, float* lg,
                                            int tid, int warp, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        *reinterpret_cast<float2*>(red + (warp * 16 + g) * 40 + 8 * nt + 2 * t) = make_float2(accL[nt][0], accL[nt][1]);
        *reinterpret_cast<float2*>(red + (warp * 16 + g + 8) * 40 + 8 * nt + 2 * t) =
            make_float2(accL[nt][2], accL[nt][3]);
    }
    __syncthreads();
    for (int e = tid; e < 32 * C; e += 256) {
        const int b = e / C, c = e % C;
        float z = b3s[c];
#pragma unroll
        for (int w = 0; w < 8; ++w) z += red[(w * 16 + c) * 40 + b];
        lg[b * 16 + c] = z;
    }
    __syncthreads();
}
// the softmax cross-entropy of row b of lg [32][16] (one row a lane of warp 0; the loss as loss.cuh and the NumPy
// engine define it) with label yl (-1: a row past the batch's m): dl[b][c] = (softmax - onehot) / m, zero for a row
// past m; argmax first-max-wins (NaN first, as numpy). Returns (loss_acc, ok_acc) with, if `add` and the row is valid,
// its loss logsumexp - z[yl] and correct count added. The sums go in and out by value and the row's logits l and
// exponentials ex live in the caller's arrays: a reference to the caller's sums, or arrays of its own, would change
// when the compiler promotes them to registers, and with it the kernels' register allocation (their SASS).
template <int C>
__device__ __forceinline__ double2 softmax_row(const float* lg, float* dl, int b, int yl, int m, bool add,
                                               double loss_acc, double ok_acc, float (&l)[C], float (&ex)[C]) {
    float zmax = __int_as_float(0xff800000);
    int am = 0x7fffffff;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        l[c] = lg[b * 16 + c];
        if (argmax_takes(l[c], zmax)) {
            zmax = l[c];
            am = c;
        }
    }
    float S = 0.f, zy = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        ex[c] = xent_exp(l[c], zmax);
        S = xent_add(S, ex[c]);
        zy += c == yl ? l[c] : 0.f;
    }
    const float inv = xent_inv(S), inv_rows = 1.f / (float)m;
    const bool valid = yl >= 0;
#pragma unroll
    for (int c = 0; c < C; ++c) dl[b * 16 + c] = valid ? xent_grad(ex[c], inv, c == yl ? 1.f : 0.f, inv_rows) : 0.f;
    if (add && valid) {
        loss_acc += (double)xent_row_loss(S, zy, zmax);
        ok_acc += am == yl ? 1.0 : 0.0;
    }
    return make_double2(loss_acc, ok_acc);
}
// the gradients of the head's owned parameters from dl [32][16], each summed over the rows in row order (the same bits
// in every CTA): b3's of class c; W3's of (class c, unit u) with H2 from the CTA's own tile hp2
__device__ __forceinline__ float b3_grad(const float* dl, int c) {
    float sd = 0.f;
    for (int b = 0; b < 32; ++b) sd += dl[b * 16 + c];
    return sd;
}
__device__ __forceinline__ float w3_grad(const float* dl, const half_t* hp2, int c, int u) {
    float sw = 0.f;
    for (int b = 0; b < 32; ++b) sw += dl[b * 16 + c] * to_f(hp2[cg_idx(b, u)]);
    return sw;
}
// warp 0 of CTA 0: the epoch's loss sum and correct count (each lane's rows) into st->hist[2 * epoch_in_fit + {0, 1}]
__device__ __forceinline__ void add_history(EpochState* st, u32 epoch_in_fit, double loss_acc, double ok_acc) {
    const int lane = threadIdx.x & 31;
    double l = loss_acc, c = ok_acc;
    for (int o = 16; o > 0; o >>= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, o);
        c += __shfl_xor_sync(0xffffffffu, c, o);
    }
    if (lane == 0) {
        st->hist[2 * epoch_in_fit] += l;
        st->hist[2 * epoch_in_fit + 1] += c;
    }
}

// Benchmark-only phase timing (-DGRID_PROFILE, Tuning.grid_profile): thread 0 of CTA 0 sums clock64() cycles per
// phase over the epoch (no added barrier: the marks fall where thread 0 passes).
#ifdef GRID_PROFILE
#define MARK(i)                                      \
    do {                                             \
        if (prof_on) {                               \
            const long long t_ = clock64();          \
            profs[i] += t_ - profs[15];              \
            profs[15] = t_;                          \
        }                                            \
    } while (0)
// thread 0 of CTA 0 at the end: the nphase phases' cycle sums, the steps and the rounds arrived at into sync's bytes
// 128.. (the engine reads them back)
__device__ __forceinline__ void profile_out(u32* sync, const long long* profs, int nphase, int steps, u32 arrived) {
    long long* out = reinterpret_cast<long long*>(sync + 32);  // bytes 128..
    for (int q = 0; q < nphase; ++q) out[q] = profs[q];
    out[nphase] = steps;
    out[nphase + 1] = arrived;
}
#else
#define MARK(i) do {} while (0)
#endif
