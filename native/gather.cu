// gather.cu: build one training batch from the dataset resident on the GPU.
// Row j of the batch is sample permuted_index(seed, epoch, n, pos0 + j) (shuffle.cuh), with the
// epoch read from device memory at replay, so one captured graph serves every epoch.
// Launch: grid = (rows), block = (GATHER_THREADS); one block per batch row. The row is mapped to
// x * scale + shift (fastnn/data.py's input_affine) and stored as TOut in a row-major (rows, d)
// buffer, which cuBLASLt reads as the column-major (d, rows) operand. Labels come along.
#include "common.cuh"
#include "shuffle.cuh"

template <typename TIn, typename TOut>
__device__ void gather_rows(const TIn* __restrict__ x, const int* __restrict__ y, int d, u32 n,
                            u32 seed_lo, u32 seed_hi, u32 half_bits, const EpochState* __restrict__ st,
                            int pos0, float scale, float shift, TOut* __restrict__ out,
                            int* __restrict__ out_y) {
    __shared__ u32 src;
    if (threadIdx.x == 0) {
        u32 keys[FEISTEL_ROUNDS];
        round_keys(seed_lo, seed_hi, st ? st->epoch : 0u, keys);
        u32 pos = (u32)(pos0 + blockIdx.x);
        src = st ? permuted_index(keys, half_bits, n, pos) : pos;  // no state: identity (eval)
        if (out_y) out_y[blockIdx.x] = y[src];
    }
    __syncthreads();
    const TIn* row = x + (u64)src * d;
    TOut* dst = out + (u64)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = from_f<TOut>(to_f(row[i]) * scale + shift);
}

#define GATHER(name, TIn, TOut)                                                                              \
    extern "C" __global__ void name(const TIn* x, const int* y, int d, u32 n, u32 seed_lo, u32 seed_hi,     \
                                    u32 half_bits, const EpochState* st, int pos0, float scale, float shift, \
                                    TOut* out, int* out_y) {                                                 \
        gather_rows<TIn, TOut>(x, y, d, n, seed_lo, seed_hi, half_bits, st, pos0, scale, shift, out, out_y); \
    }

GATHER(gather_u8_f16, u8, half_t)
GATHER(gather_u8_f32, u8, float)
GATHER(gather_f32_f16, float, half_t)
GATHER(gather_f32_f32, float, float)
