// shuffle.cuh: the sample order, index p of the keyed permutation of [0, n) for (seed, epoch).
// The same uint32 arithmetic as fastnn/_shuffle.py (the definition): lowbias32 mixing, a balanced
// Feistel network of FEISTEL_ROUNDS rounds on the smallest even bit count covering n, and
// cycle-walking back into [0, n). The GPU tests check that both give the same order.
#pragma once
#include "common.cuh"

#define FEISTEL_ROUNDS 6

__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ void round_keys(u32 seed_lo, u32 seed_hi, u32 epoch, u32 keys[FEISTEL_ROUNDS]) {
    u32 k = mix32(seed_lo ^ 0x9E3779B9u);
    k = mix32(k ^ seed_hi);
    k = mix32(k ^ epoch);
#pragma unroll
    for (int r = 0; r < FEISTEL_ROUNDS; ++r) keys[r] = mix32(k + (u32)r * 0x632BE5ABu);
}

// half_bits = feistel_bits(n) / 2, computed on the host.
__device__ __forceinline__ u32 permuted_index(const u32 keys[FEISTEL_ROUNDS], u32 half_bits, u32 n, u32 pos) {
    const u32 mask = (1u << half_bits) - 1u;
    u32 x = pos;
    do {
        u32 left = x >> half_bits, right = x & mask;
#pragma unroll
        for (int r = 0; r < FEISTEL_ROUNDS; ++r) {
            u32 t = right;
            right = left ^ (mix32(right ^ keys[r]) & mask);
            left = t;
        }
        x = (left << half_bits) | right;
    } while (x >= n);
    return x;
}
