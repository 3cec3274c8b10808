// fused_head.cuh: what the cluster kernels (fused_logreg.cu, fused_mlp.cu) compute alike: uint8 pixels as tensor-core
// operands (the fp16-subnormal trick), the weight gradient's k-step over staged rows, the softmax head of a row on two
// lanes, the producers' row copies, and the epoch's history. Each kernel's shapes come in as template arguments.
#pragma once
#include "activation.cuh"
#include "loss.cuh"
#include "ptx.cuh"

// Rounding to fp16, the operands' precision ("mixed" and "fp16").
__device__ __forceinline__ float rnd16(float x) { return round_operand<1>(x); }

// A fragments of a row pair's 16-feature chunk from two 4-byte loads of uint8 pixels (rows g, g + 8; features 4t..
// 4t+3), each pixel x the exact fp16 subnormal x * 2^-24 (its byte in the low half, zero above). K is permuted inside
// the chunk: logical k (2t, 2t+1) = features (4t, 4t+1), (2t+8, 2t+9) = (4t+2, 4t+3); B fragments must match.
__device__ __forceinline__ void u8_a_frags(u32 x0, u32 x1, u32 (&a)[4]) {
    a[0] = __byte_perm(x0, 0u, 0x4140);
    a[1] = __byte_perm(x1, 0u, 0x4140);
    a[2] = __byte_perm(x0, 0u, 0x4342);
    a[3] = __byte_perm(x1, 0u, 0x4342);
}

// One k-step (16 rows) of a weight gradient over staged rows: m = output (A = dZ^T fragments af), n = features 2g (into
// acc0) and 2g + 1 (into acc1) of a 16-feature chunk, k = rows. xr points at the chunk's features 2g of row 2t (uint8
// rows) or at its fp16 pair 2g, 2g + 1 (XF: rows of fp16 operands); rowb is the staged row stride in bytes. After a
// chunk, acc0/acc1 hold outputs (g, 4t), (g, 4t+2), (g+8, 4t), (g+8, 4t+2) / (g, 4t+1), ... of the chunk's features.
template <bool XF>
__device__ __forceinline__ void wgrad_kstep(const u8* xr, int rowb, const u32 (&af)[4], float (&acc0)[4],
                                            float (&acc1)[4]) {
    u32 q0, q1, q2, q3;  // rows 2t, 2t+1, 2t+8, 2t+9
    if constexpr (XF) {  // one 4-byte load a row holds features 2g, 2g + 1
        q0 = *reinterpret_cast<const u32*>(xr);
        q1 = *reinterpret_cast<const u32*>(xr + rowb);
        q2 = *reinterpret_cast<const u32*>(xr + 8 * rowb);
        q3 = *reinterpret_cast<const u32*>(xr + 9 * rowb);
    } else {  // one 2-byte load a row, PRMT into fp16 subnormals
        q0 = *reinterpret_cast<const unsigned short*>(xr);
        q1 = *reinterpret_cast<const unsigned short*>(xr + rowb);
        q2 = *reinterpret_cast<const unsigned short*>(xr + 8 * rowb);
        q3 = *reinterpret_cast<const unsigned short*>(xr + 9 * rowb);
    }
    constexpr u32 P0 = XF ? 0x5410 : 0x6420, P1 = XF ? 0x7632 : 0x6521;
    mma16816(acc0, af[0], af[1], af[2], af[3], __byte_perm(q0, q1, P0), __byte_perm(q2, q3, P0));
    mma16816(acc1, af[0], af[1], af[2], af[3], __byte_perm(q0, q1, P1), __byte_perm(q2, q3, P1));
}
// The gradient of a chunk's weights in master order: element e < 4 is output g, feature 4t + e; 4 + i output g + 8.
__device__ __forceinline__ void chunk_grads(const float (&acc0)[4], const float (&acc1)[4], float (&ac)[8]) {
    ac[0] = acc0[0], ac[1] = acc1[0], ac[2] = acc0[1], ac[3] = acc1[1];
    ac[4] = acc0[2], ac[5] = acc1[2], ac[6] = acc0[3], ac[7] = acc1[3];
}

// The softmax head of one row on a pair of lanes (hh = lane & 1 takes classes hh*CH .. hh*CH + CH - 1): the logits
// are the S partial rows at row0 + q * slot_stride summed in a fixed order (identical bits in every CTA) plus the bias;
// argmax first-max-wins (NaN first, as numpy); d[c] = (softmax - onehot) * inv_rows, zero for a row the batch lacks;
// the loss and correct count of a valid row added on lane hh = 0. Both lanes of a pair must call it.
template <int C, int S>
__device__ __forceinline__ void softmax_pair(const float* row0, int slot_stride, const float* bias, bool valid, int yl,
                                             float inv_rows, float (&d)[(C + 1) / 2], double& loss_acc,
                                             float& ok_acc) {
    constexpr int CH = (C + 1) / 2;
    const int hh = threadIdx.x & 1, cb = hh * CH;
    float z[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) z[c] = 0.f;
#pragma unroll
    for (int q = 0; q < S; ++q) {
        const float* src = row0 + q * slot_stride + cb;
#pragma unroll
        for (int c = 0; c < CH; ++c)
            if (cb + c < C) z[c] += src[c];
    }
    float m = __int_as_float(0xff800000);  // -inf
    int bi = 0x7fffffff;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (cb + c < C) {
            z[c] += bias[cb + c];
            if (argmax_takes(z[c], m)) {
                m = z[c];
                bi = cb + c;
            }
        }
    }
    {  // the pair's argmax, the lower classes (lane hh = 0) first
        const float om = __shfl_xor_sync(0xffffffffu, m, 1);
        const int ob = __shfl_xor_sync(0xffffffffu, bi, 1);
        const float lm = hh ? om : m, um = hh ? m : om;
        const int lb = hh ? ob : bi, ub = hh ? bi : ob;
        const bool up = argmax_takes(um, lm);
        m = up ? um : lm;
        bi = up ? ub : lb;
    }
    float ex[CH], ssum = 0.f, zy = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        ex[c] = cb + c < C ? xent_exp(z[c], m) : 0.f;
        ssum = xent_add(ssum, ex[c]);
        zy += yl == cb + c ? z[c] : 0.f;
    }
    ssum += __shfl_xor_sync(0xffffffffu, ssum, 1);
    zy += __shfl_xor_sync(0xffffffffu, zy, 1);
    const float inv = xent_inv(ssum);
#pragma unroll
    for (int c = 0; c < CH; ++c) d[c] = valid ? xent_grad(ex[c], inv, yl == cb + c ? 1.f : 0.f, inv_rows) : 0.f;
    if (valid && hh == 0) {
        loss_acc += (double)xent_row_loss(ssum, zy, m);
        ok_acc += bi == yl ? 1.f : 0.f;
    }
}

// A producer's copy of G bytes of a row (cp.async of 16, 8 or 4 bytes; G = 1: a plain byte).
template <int G> __device__ __forceinline__ void copy_unit(u8* dst, const u8* src) {
    if constexpr (G == 16) cp_async16(smem_u32(dst), src);
    else if constexpr (G == 8) cp_async8(smem_u32(dst), src);
    else if constexpr (G == 4) cp_async4(smem_u32(dst), src);
    else *dst = *src;
}

// The epoch's loss sum and correct count: each consumer warp's lanes summed (a butterfly: a fixed order), the warps'
// sums in order by one thread of CTA 0, added to the history slot of this epoch. Every CTA computed every row's loss:
// CTA 0's are the epoch's. All consumer threads call it.
template <int NCW>
__device__ __forceinline__ void epoch_history(double loss_acc, float ok_acc, double* hsum, EpochState* est,
                                              u32 epoch_in_fit, u32 rank) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    double l = loss_acc, c = (double)ok_acc;
    for (int o = 16; o > 0; o >>= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, o);
        c += __shfl_xor_sync(0xffffffffu, c, o);
    }
    if (lane == 0) {
        hsum[2 * warp] = l;
        hsum[2 * warp + 1] = c;
    }
    bar_consumers();
    if (rank == 0 && threadIdx.x == 0) {
        double ls = 0.0, cs = 0.0;
        for (int w = 0; w < NCW; ++w) {
            ls += hsum[2 * w];
            cs += hsum[2 * w + 1];
        }
        est->hist[2 * epoch_in_fit] += ls;
        est->hist[2 * epoch_in_fit + 1] += cs;
    }
}

// Benchmark-only phase timing (-DFUSED_PROFILE, Tuning(fused_profile=True)): FUSED_PROF(i) adds the clock64 cycles
// since the previous mark to prof[i], in the one warp whose prof_on is set (no barrier added).
#ifdef FUSED_PROFILE
#define FUSED_PROF(i)                               \
    do {                                            \
        if (prof_on) {                              \
            const long long t_ = clock64();         \
            prof[i] += t_ - prof_t;                 \
            prof_t = t_;                            \
        }                                           \
    } while (0)
#else
#define FUSED_PROF(i) do {} while (0)
#endif
