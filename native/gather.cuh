// gather.cuh: one batch row from the dataset resident on the GPU (used by gather.cu and by the fused
// update-and-gather kernels of update.cu).
// Row j of the batch is sample permuted_index(seed, epoch, n, pos0 + j) (shuffle.cuh), with the epoch
// read from device memory at replay, so one captured graph serves every epoch (no EpochState: positions
// in order, for evaluation). The row is mapped to x * scale + shift (fastnn/_data.py's input_affine; with a
// per-feature normalize, fscale/fshift point to d floats each, else they are null and the scalars apply) and
// stored as TOut in a row-major (rows, d) buffer, which cuBLASLt reads as the column-major (d, rows)
// operand. The sample's y comes along when out_y is given: yw 32-bit words per sample, copied as bits (1: an
// int32 label; k: a regression's k float32 targets), into row j of a row-major (rows, yw) buffer. A whole block
// gathers one row.
#pragma once
#include "common.cuh"
#include "shuffle.cuh"

template <typename TIn, typename TOut>
__device__ void gather_row(const TIn* __restrict__ x, const u32* __restrict__ y, int yw, int d, u32 n, u32 seed_lo,
                           u32 seed_hi, u32 half_bits, const EpochState* __restrict__ st, int pos0, float scale,
                           float shift, const float* __restrict__ fscale, const float* __restrict__ fshift,
                           TOut* __restrict__ out, u32* __restrict__ out_y, int j) {
    __shared__ u32 src;
    if (threadIdx.x == 0) {
        u32 keys[FEISTEL_ROUNDS];
        round_keys(seed_lo, seed_hi, st ? st->epoch : 0u, keys);
        u32 pos = (u32)(pos0 + j);
        src = st ? permuted_index(keys, half_bits, n, pos) : pos;
    }
    __syncthreads();
    if (out_y) {
        for (int i = threadIdx.x; i < yw; i += blockDim.x) out_y[(u64)j * yw + i] = y[(u64)src * yw + i];
    }
    const TIn* row = x + (u64)src * d;
    TOut* dst = out + (u64)j * d;
    if (fscale) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = from_f<TOut>(to_f(row[i]) * fscale[i] + fshift[i]);
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = from_f<TOut>(to_f(row[i]) * scale + shift);
    }
}
