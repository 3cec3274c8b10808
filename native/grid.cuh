// grid.cuh: what the grid engine's two kernels (grid_fast.cu, grid_stream.cu) share beyond ptx.cuh's
// inline PTX: the watchdog of their waits (a lost arrival traps in seconds, not minutes) and fp16 rounding of a
// float.
#pragma once
#include "ptx.cuh"

// A wait's watchdog, called once per poll (t0 starts at 0): true once about WATCHDOG_NS of %globaltimer have passed
// since the 4096th poll (the clock is read every 4096 polls).
#define WATCHDOG_NS 4000000000ull
__device__ __forceinline__ bool wait_expired(u32& polls, u64& t0) {
    if ((++polls & 0xfffu) != 0u) return false;
    const u64 now = global_ns();
    if (polls == 0x1000u) t0 = now;
    return polls != 0x1000u && now - t0 > WATCHDOG_NS;
}
__device__ __forceinline__ float rnd16(float x) { return to_f(from_f<half_t>(x)); }
