// gather.cu: build one training batch from the dataset resident on the GPU.
// Row j of the batch is sample permuted_index(seed, epoch, n, pos0 + j) (shuffle.cuh), with the
// epoch read from device memory at replay, so one captured graph serves every epoch (no EpochState:
// positions in order, for evaluation). The row is mapped to x * scale + shift (fastnn/data.py's
// input_affine) and stored as TOut in a row-major (rows, d) buffer, which cuBLASLt reads as the
// column-major (d, rows) operand. Labels come along when out_y is given.
// Launch: grid = ceil(rows / GATHER_WARPS), block = GATHER_WARPS * 32: a warp per row, every lane
// computing the row's index itself (no barrier), then 4 elements per access when d % 4 == 0 (a first
// version with a block per row, thread 0 computing the index behind a barrier and one element per
// access took 3 us for 128 rows of 784 bytes).
#include "common.cuh"
#include "shuffle.cuh"

#define GATHER_WARPS 8

__device__ __forceinline__ void load4(const u8* p, float v[4]) {
    u32 t = *reinterpret_cast<const u32*>(p);
    v[0] = (float)(t & 0xffu); v[1] = (float)((t >> 8) & 0xffu); v[2] = (float)((t >> 16) & 0xffu); v[3] = (float)(t >> 24);
}
__device__ __forceinline__ void load4(const float* p, float v[4]) {
    float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void store4(half_t* p, const float v[4]) {
    uint2 t;
    t.x = (u32)from_f<half_t>(v[0]) | ((u32)from_f<half_t>(v[1]) << 16);
    t.y = (u32)from_f<half_t>(v[2]) | ((u32)from_f<half_t>(v[3]) << 16);
    *reinterpret_cast<uint2*>(p) = t;
}
__device__ __forceinline__ void store4(float* p, const float v[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

template <typename TIn, typename TOut>
__device__ void gather_rows(const TIn* __restrict__ x, const int* __restrict__ y, int d, u32 n, u32 seed_lo,
                            u32 seed_hi, u32 half_bits, const EpochState* __restrict__ st, int pos0, int rows,
                            float scale, float shift, TOut* __restrict__ out, int* __restrict__ out_y) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * GATHER_WARPS + (threadIdx.x >> 5);
    if (j >= rows) return;
    const u32 pos = (u32)(pos0 + j);
    u32 src = pos;
    if (st) {
        u32 keys[FEISTEL_ROUNDS];
        round_keys(seed_lo, seed_hi, st->epoch, keys);
        src = permuted_index(keys, half_bits, n, pos);
    }
    if (out_y && lane == 0) out_y[j] = y[src];
    const TIn* row = x + (u64)src * d;
    TOut* dst = out + (u64)j * d;
    if ((d & 3) == 0) {  // 4-element accesses: rows start 4-element aligned
        for (int i = 4 * lane; i < d; i += 128) {
            float v[4];
            load4(row + i, v);
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = v[e] * scale + shift;
            store4(dst + i, v);
        }
    } else {
        for (int i = lane; i < d; i += 32) dst[i] = from_f<TOut>(to_f(row[i]) * scale + shift);
    }
}

#define GATHER(name, TIn, TOut)                                                                                \
    extern "C" __global__ void name(const TIn* x, const int* y, int d, u32 n, u32 seed_lo, u32 seed_hi,       \
                                    u32 half_bits, const EpochState* st, int pos0, int rows, float scale,     \
                                    float shift, TOut* out, int* out_y) {                                     \
        gather_rows<TIn, TOut>(x, y, d, n, seed_lo, seed_hi, half_bits, st, pos0, rows, scale, shift, out, out_y); \
    }

GATHER(gather_u8_f16, u8, half_t)
GATHER(gather_u8_f32, u8, float)
GATHER(gather_f32_f16, float, half_t)
GATHER(gather_f32_f32, float, float)
