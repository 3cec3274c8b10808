// sm90.cuh: inline-PTX helpers of the sm_90 persistent kernels (grid_fast.cu; fused_logreg.cu still has its own
// copies of the same definitions): shared-memory addresses, mbarriers with transaction counts, the async-proxy fence,
// the m16n8k16 fp16 tensor-core product and fp16 packing. Inline PTX: NVRTC compiles without the toolkit's headers.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u32 a, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ bool mbar_try(u32 a, u32 parity) {
    u32 ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"(a), "r"(parity)
                 : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mbar_arrive(u32 a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_arm_tx(u32 a, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// A wait's watchdog, called once per poll (t0 starts at 0): true once about WATCHDOG_NS of %globaltimer have passed
// since the 4096th poll (the clock is read every 4096 polls), so a lost arrival traps in seconds, not minutes.
#define WATCHDOG_NS 4000000000ull
__device__ __forceinline__ bool wait_expired(u32& polls, u64& t0) {
    if ((++polls & 0xfffu) != 0u) return false;
    const u64 now = global_ns();
    if (polls == 0x1000u) t0 = now;
    return polls != 0x1000u && now - t0 > WATCHDOG_NS;
}
// Generic-proxy accesses of shared memory ordered before later async-proxy ones (a bulk copy into the same bytes).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// d(16x8) += a(16x16) b(16x8), fp16 operands, fp32 accumulation. Fragments (g = lane / 4, t = lane % 4): a = {(g,
// 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, b = {(2t..2t+1, g), (2t+8.., g)}, d = {(g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1)}; the lower half of each 32-bit register holds the lower index.
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 v;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
    return v;
}
__device__ __forceinline__ float rnd16(float x) { return to_f(from_f<half_t>(x)); }
