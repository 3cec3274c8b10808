// loss.cuh: the one description of each loss on the GPU: its kind, and the per-row loss and gradient every kernel
// computes (loss.cu for the graph engine, fused.cu and fused_head.cuh for the fused engine, grid_tc.cuh for the grid
// engine's two kernels, many.cu for many models at once). The arithmetic is fastnn/_loss.py's NumPy functions (the NumPy engine's definition) in the
// same order, so every engine reports the same loss to rounding, and every kernel rounds it the same way.
//
// One rounding, chosen here: the hardware's __expf and __logf (ex2.approx, lg2.approx: 2 + floor(1.173 |x|) ulp
// for __expf; for __logf an absolute error of at most 2^-21.41 on [0.5, 2], 3 ulp beyond: CUDA's table) and one
// __fdividef reciprocal a row, as the kernels of the fastest rows (fused_logreg.cu and fused_mlp.cu, through
// fused_head.cuh) computed them; loss.cu, fused.cu and grid_tc.cuh used expf/logf and an IEEE division. Why these:
// the library's expf is ~8 instructions a class against 2 (a range reduction before the same ex2.approx), logf ~12
// against 2, and a head runs them on the step's critical path (a warp's rows, then a barrier) every step, while what
// the rounding changes is invisible: a row's loss log(sum) - (z_y - zmax) has sum in [1, classes] (its largest term
// is 1), so __logf moves a loss by at most ~4e-7 (the GPU tests compare losses to 1e-6 absolute and 1e-4 relative),
// and __expf's relative error grows only for terms e^x far below the row's largest, whose share of the sum and of the
// gradient is as small. The NumPy engine (float64) stays the definition; every GPU engine now rounds the loss alike.
// Every product and sum that the compiler could fuse or split differently in another kernel is spelled out
// (__fmul_rn, __fadd_rn, __fsub_rn, __fmaf_rn), as optim.cuh does: which a * b + c ptxas contracts depends on the
// code around it. A softmax gradient is (e * (1 / sum) - onehot) * scale with the product and the difference fused
// (one rounding); the graph engine starts from cuDNN's probabilities p instead: (p - onehot) * scale (xent_grad_p).
//
// Adding a loss touches three places, and no engine: fastnn/_loss.py (its KIND_ number, its description and its NumPy
// function), this header (the same LOSS_ number and its per-row functions), and the kernels that serve it (each
// refuses by name, in its plan, a loss it does not compute). tests/test_loss_kernel.py checks the numbers agree and
// compiles this header for the CPU (-DLOSS_HOST) to compare each function with the NumPy one.
#pragma once

// Loss kinds: fastnn/_loss.py's KIND_XENT, KIND_MSE, KIND_WXENT, KIND_HUBER (tests/test_loss_kernel.py checks them).
#define LOSS_XENT 0   // softmax cross-entropy over int labels, mean over the batch's rows
#define LOSS_MSE 1    // squared error, mean over the batch's rows and the outputs (no factor 1/2)
#define LOSS_WXENT 2  // softmax cross-entropy, row r weighted by w_r, normalized by the batch's sum of weights
#define LOSS_HUBER 3  // Huber's loss of each output's error (quadratic within delta), mean as LOSS_MSE

#ifdef LOSS_HOST  // the CPU test: the same functions compiled as C++ (g++ -ffp-contract=off), libm's expf/logf
#include <cmath>
#define LOSS_FN static inline
LOSS_FN float loss_mul(float a, float b) { return a * b; }
LOSS_FN float loss_add(float a, float b) { return a + b; }
LOSS_FN float loss_sub(float a, float b) { return a - b; }
LOSS_FN float loss_fma(float a, float b, float c) { return std::fmaf(a, b, c); }
LOSS_FN float loss_exp(float x) { return std::exp(x); }
LOSS_FN float loss_log2(float x) { return std::log2(x); }
LOSS_FN float loss_rcp(float x) { return 1.f / x; }
#else
#define LOSS_FN __device__ __forceinline__
LOSS_FN float loss_mul(float a, float b) { return __fmul_rn(a, b); }
LOSS_FN float loss_add(float a, float b) { return __fadd_rn(a, b); }
LOSS_FN float loss_sub(float a, float b) { return __fsub_rn(a, b); }
LOSS_FN float loss_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
LOSS_FN float loss_exp(float x) { return __expf(x); }
LOSS_FN float loss_log2(float x) { return __log2f(x); }  // lg2.approx: __logf is it times ln 2
LOSS_FN float loss_rcp(float x) { return __fdividef(1.f, x); }  // x in [1, classes]: never near __fdividef's 2^126
#endif

// ---- softmax cross-entropy (LOSS_XENT; LOSS_WXENT is the same with a row weight) -----------------------------------
// A row of logits z with maximum zmax (argmax_takes's, common.cuh) and label y: e_j = exp(z_j - zmax),
// sum = sum_j e_j (each added by xent_add, in the caller's order), the row's loss log(sum) - (z_y - zmax) (= logsumexp(z) - z_y, exact for
// any logit size), and the gradient of the batch's loss (e_j * (1 / sum) - [j == y]) * scale, the product and the
// difference fused, with scale = 1 / rows (LOSS_XENT) or w_r / sum of the batch's weights (LOSS_WXENT).
// Plain sums and differences here: no product stands beside them to be fused (__expf ends in ex2.approx, and
// (z - zmax) * log2(e) is no fma), and __fadd_rn/__fsub_rn kept ptxas from folding the padded classes' zeros.
LOSS_FN float xent_exp(float z, float zmax) { return loss_exp(z - zmax); }
LOSS_FN float xent_add(float sum, float e) { return sum + e; }
#define LOSS_LN2 0.693147180559945309f
// log(sum) - (z_y - zmax) with __logf's product by ln 2 fused with the difference (one rounding)
LOSS_FN float xent_row_loss(float sum, float zy, float zmax) {
    return loss_fma(loss_log2(sum), LOSS_LN2, -(zy - zmax));
}
LOSS_FN float xent_inv(float sum) { return loss_rcp(sum); }
// onehot: 1 for the row's label, 0 for the other classes (the caller's select). e * inv - onehot is written plainly:
// ptxas contracts it into one fma in every kernel that includes this header (their SASS shows one FFMA a class, with
// the select beside it), and __fmaf_rn(e, inv, -onehot) made it turn the select into integer conversions.
LOSS_FN float xent_grad(float e, float inv, float onehot, float scale) { return loss_mul(e * inv - onehot, scale); }
// The graph engine's: from cuDNN's softmax probability p of the logit.
LOSS_FN float xent_grad_p(float p, bool is_label, float scale) {
    return loss_mul(loss_sub(p, is_label ? 1.f : 0.f), scale);
}
// LOSS_WXENT: row r's loss weighted by w_r (the history sums w_r * loss_r; the batch's mean divides by its weights).
LOSS_FN float wxent_row_loss(float w, float sum, float zy, float zmax) {
    return loss_mul(w, xent_row_loss(sum, zy, zmax));
}

// ---- squared error (LOSS_MSE) -------------------------------------------------------------------------------------
// Output o against target t: d = o - t; the row's loss is sum_j d_j^2 (each added by one fma, in the caller's order)
// divided by the k outputs; the gradient of the batch's loss d * scale with scale = 2 / (rows * k), rounded once by
// the caller (the NumPy engine's 2.0 / diff.size).
LOSS_FN float mse_diff(float o, float t) { return loss_sub(o, t); }
LOSS_FN float mse_add_sq(float sq, float d) { return loss_fma(d, d, sq); }
LOSS_FN float mse_row_loss(float sq, int k) { return sq / (float)k; }
LOSS_FN float mse_grad(float d, float scale) { return loss_mul(d, scale); }

// ---- Huber (LOSS_HUBER) -------------------------------------------------------------------------------------------
// Of an output's error d = o - t with threshold delta > 0: 0.5 d^2 where |d| <= delta, else delta (|d| - delta / 2);
// the row's loss is their mean over the k outputs, its gradient clamp(d, -delta, delta) * scale with
// scale = 1 / (rows * k) (LOSS_MSE's mean, without the factor 2 that d^2 brings).
LOSS_FN float huber_elem(float d, float delta) {
    const float a = fabsf(d);
    return a <= delta ? loss_mul(loss_mul(0.5f, d), d) : loss_mul(delta, loss_sub(a, loss_mul(0.5f, delta)));
}
LOSS_FN float huber_grad(float d, float delta, float scale) {
    return loss_mul(fminf(fmaxf(d, -delta), delta), scale);
}

// Which kernels serve which kinds: loss.cu (the graph engine) LOSS_XENT and LOSS_MSE, and a weighted fit's LOSS_WXENT
// (wxent, and wmse: the squared error weighted alike); fused.cu LOSS_XENT and
// LOSS_MSE (FUSED_LOSS); fused_logreg.cu and fused_mlp.cu (fused_head.cuh) and the grid engine's grid_fast.cu and
// grid_stream.cu (grid_tc.cuh) LOSS_XENT only, each plan refusing another kind by name. Why the grid kernels refuse
// MSE rather than serve it: their batch stage carries one int32 label a row and their head is a softmax over one m16
// tile of logits fused with the argmax and the label gather; a regression needs k float32 targets a row staged beside
// each batch (through the same bulk copies and mbarriers), a head without the softmax, and a second variant of both
// kernels, each near the ~64 KB per-step code budget (a probe measured 12-17% slower steps past it). No one has asked
// for or measured regression at those shapes (three equal hidden layers of 128+ units, <= 32 rows a step); the graph
// and fused engines train it, and grid/plan.py names engine='graph'.
