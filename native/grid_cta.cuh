// grid_cta.cuh: the CTA of the grid engine's column-master kernels (grid_fast.cu, grid_stream.cu) as an object whose
// methods are the phases both kernels run alike: the gather (a step's rows: keyed index, label, bulk copy), the
// reads and writes of the biases and of one bias or W3 element with its state, the optimizer step of one
// shared-memory element, a bias step from a dZ tile, the head's end (the logits, warp 0's softmax cross-entropy of
// the batch's rows), the head's owned update (b3 and the W3 slice with its fp16 operand copies) and the epoch's end
// (the biases, the W3 slice and b3 back, the history, the profile). Each kernel's struct (FastCta, StreamCta)
// adds its own phases; its epoch function is the driver. Included by a kernel after its shape constants (NB units a
// CTA, C classes, H hidden width, NT threads, D inputs, XB staged batch bytes, NS state arrays, MSF floats between a
// shared element's two state arrays, the parameter offsets OB0..OB3) and its `upd` (one element's optimizer step).
//
// Why a struct of references: the kernels' phases were lambdas capturing the epoch function's locals by reference;
// a struct holding references to exactly those locals (and copies of the pointers no phase changes) is the same
// closure with names, so the kernels' SASS stays byte-identical (benchmarks/sass_compare.py). Measured on the way:
// a struct of values, or a reference to a local no lambda captured before, changed the SASS of every plan; so did a
// phase owning a local array (the driver declares them: docs/design/grid-engine.md, "Kernel code").
#pragma once
#include "grid_tc.cuh"

// XT: the element type of the input rows as the kernel takes them (void: float32 or uint8, chosen by the plan)
template <class XT> struct GridCta {
    // by reference: the launch's arguments, this thread, and the views and counters the phases share
    float*& params;
    float*& s1g;
    float*& s2g;  // (a kernel with at most one state array binds it to s1g; it is never read there)
    half_t*& w16;
    const XT* __restrict__& x;
    const int* __restrict__& y;
    u32& n;
    u32& half_bits;
    int& batch;
    OptimParams& prm;
    const int &tid, &warp, &lane, &g, &t, &cta;
    u8*& Xs;
    const u32 &act0, &wr0;
    float*& red;
    half_t*& dZ0p;
    float *&b0s, *&mb0;
    int*& lab;
#ifdef GRID_PROFILE
    long long*& profs;
    const bool& prof_on;
#endif
    const u32 &xfull0, &xfull1;
    half_t *&W3A, *&W3B;
    u32*& counter;
    const int& u0;
    const float& zs;
    u32 (&keys)[FEISTEL_ROUNDS];
    // by value: the head's views (no phase changes them)
    half_t* Hp2;
    float *b3s, *w3s, *lg, *dl, *mb3, *mw3;
    float *b1s, *b2s, *mb1, *mb2;

    // the gather: the batch's row of this lane at step s, its keyed index (shuffle.cuh) and its label into stage
    // s & 1's labels; rows past the batch's m copy row m-1 and carry label -1 (their dlogits are zero)
    __device__ u32 row_index(int s) {
        const int m = min(batch, (int)n - s * batch);
        const u32 idx = permuted_index(keys, half_bits, n, (u32)(s * batch + min(lane, m - 1)));
        const int sg = s & 1;
        lab[sg * BR + lane] = lane < m ? y[idx] : -1;
        return idx;
    }
    // and the row's d bytes into stage sg by one bulk copy (lane 0 arms the stage's mbarrier for the whole batch)
    __device__ void bulk_row(int sg, u32 idx) {
        __syncwarp();
        if (lane == 0) mbar_arm_tx(sg ? xfull1 : xfull0, (u32)XB);
        __syncwarp();
        fence_proxy_async();
        bulk_g2s(smem_u32(Xs + sg * XB + lane * D), reinterpret_cast<const u8*>(x) + (u64)idx * D, (u32)D,
                 sg ? xfull1 : xfull0);
    }
    // fragment element q of lane (g, t) at k-step kk: n-offset 16kk + 2t + (q & 1) + 8 (q >> 1)
    __device__ int kofs(int kk, int q) { return 16 * kk + 2 * t + (q & 1) + 8 * (q >> 1); }
    // W3's fp16 operand copies: element (class c, unit u) of this CTA's slice at parity par (pads: zeros)
    __device__ void put_w3(int par, int c, int u, float wv) { store_w3<C, H>(W3A, W3B, par, c, u0 + u, wv); }
    // one element of a bias or of the W3 slice (shared memory: w, its state at ms[0], ms[MSF]) from flat element e,
    // and back (with the fp16 copy)
    __device__ void get1(float& w, float* ms, long long e) {
        w = params[e];
        if constexpr (NS >= 1) ms[0] = s1g[e];
        if constexpr (NS >= 2) ms[MSF] = s2g[e];
    }
    __device__ void put1(long long e, float w, const float* ms) {
        params[e] = w;
        if (w16 != nullptr) w16[e] = from_f<half_t>(w);
        if constexpr (NS >= 1) s1g[e] = ms[0];
        if constexpr (NS >= 2) s2g[e] = ms[MSF];
    }
    // the biases of the owned units (b0, b1, b2) and b3 from the flat training state, and the owned ones back
    __device__ void get_biases() {
        if (tid < NB) {
            get1(b0s[tid], mb0 + tid, OB0 + u0 + tid);
            get1(b1s[tid], mb1 + tid, OB1 + u0 + tid);
            get1(b2s[tid], mb2 + tid, OB2 + u0 + tid);
        }
        if (tid < C) get1(b3s[tid], mb3 + tid, OB3 + tid);
    }
    __device__ void put_biases() {
        if (tid < NB) {
            put1(OB0 + u0 + tid, b0s[tid], mb0 + tid);
            put1(OB1 + u0 + tid, b1s[tid], mb1 + tid);
            put1(OB2 + u0 + tid, b2s[tid], mb2 + tid);
        }
    }
    // the end of the epoch: the owned biases, the W3 slice and (CTA 0) b3 back to the flat training state; CTA 0's
    // loss sum and correct count (it computed every row's) into the history; the phase profile
    // (W3_LOOP: the slice's elements in a loop over the threads, else one a thread, grid_fast.cu's C * NB <= NT: each
    // kernel's own form, which its SASS keeps)
    template <bool W3_LOOP>
    __device__ void finish(EpochState* st, u32 epoch_in_fit, double loss_acc, double ok_acc, int steps, u32 arrived) {
        put_biases();
        if constexpr (W3_LOOP) {
            for (int e = tid; e < C * NB; e += NT) put1(OW3 + (long long)(e / NB) * H + u0 + e % NB, w3s[e], mw3 + e);
        } else if (tid < C * NB) {
            put1(OW3 + (long long)(tid / NB) * H + u0 + tid % NB, w3s[tid], mw3 + tid);
        }
        if (cta == 0 && tid < C) put1(OB3 + tid, b3s[tid], mb3 + tid);
        if (cta == 0 && warp == 0) add_history(st, epoch_in_fit, loss_acc, ok_acc);
#ifdef GRID_PROFILE
        if (prof_on) profile_out(counter, profs, NPHASE, steps, arrived);
#endif
    }
    // the optimizer step of one shared-memory element (a bias, the W3 slice) with its state at ms[0], ms[MSF], by q:
    // prm for a weight, optim_bias(prm) for a bias (its decay is bias_decay: optim.cuh)
    __device__ void upd1(const OptimParams& q, const OptimStep& o, float g, float& w, float* ms) {
        float m = NS >= 1 ? ms[0] : 0.f, v = NS >= 2 ? ms[MSF] : 0.f;
        upd(q, o, g, w, m, v);
        if constexpr (NS >= 1) ms[0] = m;
        if constexpr (NS >= 2) ms[MSF] = v;
    }
    // the head's end, after its k-steps' sums accL: the logits, then warp 0's softmax cross-entropy of row `lane`
    // (labels of stage xs; step s's m rows, the rest give zero dlogits and no loss) into dlogits; the epoch's sums
    // in and out by value and the row's logits and exponentials l, ex in the caller's arrays (grid_tc.cuh's
    // softmax_row says why)
    // (M_IN_BRANCH: m computed in warp 0's branch, grid_stream.cu's form, else by the caller, grid_fast.cu's: each
    // kernel's own, which its SASS keeps; m = min(batch, n - s * batch))
    template <bool M_IN_BRANCH>
    __device__ double2 head_end(int s, int xs, int m, double loss_acc, double ok_acc, float (&accL)[4][4],
                                float (&l)[C], float (&ex)[C]) {
        head_logits<C>(accL, red, b3s, lg, tid, warp, g, t);
        if (warp == 0) {
            if constexpr (M_IN_BRANCH) m = min(batch, (int)n - s * batch);
            const double2 sums =
                softmax_row<C>(lg, dl, lane, lab[xs * BR + lane], m, cta == 0, loss_acc, ok_acc, l, ex);
            loss_acc = sums.x;
            ok_acc = sums.y;
        }
        __syncthreads();
        return make_double2(loss_acc, ok_acc);
    }
    // the bias step of this CTA's units of a hidden layer from its dZ in an activation tile (unit offset col0)
    __device__ void bias_step(const half_t* dz, int col0, float* bs, float* ms, const OptimStep& o) {
        if (tid < NB) {
            const float sd = tile_col_sum(dz, col0 + tid);
            upd1(optim_bias(prm), o, sd, bs[tid], ms + tid);
        }
    }
    // the owners' side of the head: b3 (replicated, the same order everywhere) and W3[:, U_p] (the fp32 slice
    // [16][NB] in shared memory) from dlogits and the CTA's H2 tile, with the slice's fp16 copies of parity `par`
    // for the next step
    __device__ void head_update(int par, const OptimStep& oc) {
        if (tid < C) {
            upd1(optim_bias(prm), oc, b3_grad(dl, tid), b3s[tid], mb3 + tid);
        }
        for (int e = tid; e < 16 * NB; e += NT) {
            const int c = e / NB, u = e % NB;
            float wv = w3s[e];
            if (c < C) {
                upd1(prm, oc, w3_grad(dl, Hp2, c, u), wv, mw3 + e);
                w3s[e] = wv;
            }
            put_w3(par ^ 1, c, u, wv);
        }
    }
};
