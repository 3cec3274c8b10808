// ptx.cuh: the fused kernels' inline PTX (fused.cu, fused_logreg.cu, fused_mlp.cu; NVRTC needs no toolkit headers):
// the cluster (rank, peer addresses, the release/acquire barrier, remote loads and stores), mbarriers (init, arrive,
// transaction counts), the copies that complete on them (cp.async, with a noinc arrival; bulk copies into a peer CTA),
// named barriers, mma.sync m16n8k16 and fp16 packing, and the waits the cluster kernels use: warp-uniform, with a
// watchdog that prints where it is stuck and traps (a lost arrival costs seconds, not the device). sm_90.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// The address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ u32 mapa(u32 a, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
// All threads of every CTA of the cluster; orders shared and distributed-shared memory (release/acquire). A GPU-scope
// MEMBAR in SASS (850 cycles on an H100): the cluster kernels use it at the start and the end only.
__device__ __forceinline__ void cluster_sync_full() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Stores and loads of a peer CTA's shared memory, one lane at a time (~1 a cycle through the SM-to-SM network).
__device__ __forceinline__ void st_remote(u32 addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void st_remote4(u32 addr, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ void st_remote2(u32 addr, float v0, float v1) {
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
}
__device__ __forceinline__ double ld_remote_d(u32 addr) {
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(addr) : "memory");
    return v;
}
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
__device__ __forceinline__ bool mbar_try_cluster(u32 a, u32 parity) {
    u32 ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
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

// The watchdog: a wait that has not completed after 2^26 polls or ~4 seconds prints where it is and traps, so a lost
// arrival costs seconds, not the device.
__device__ __noinline__ void fused_stuck(int what, u32 bar, u32 parity, int s) {
    if (what < 2)
        printf("fastnn fused kernel: stuck on the %s mbarrier 0x%x parity %u at step %d, block %d, warp %d\n",
               what == 0 ? "full (rows of a stage)" : "empty (stage released)", bar, parity, s, (int)blockIdx.x,
               (int)(threadIdx.x >> 5));
    else
        printf("fastnn fused kernel: stuck on exchange round %d's mbarrier 0x%x parity %u at step %d, block %d, "
               "warp %d\n", what - 2, bar, parity, s, (int)blockIdx.x, (int)(threadIdx.x >> 5));
    __trap();
}
// What a wait waits for (the watchdog's message): a stage's rows, a stage's release, exchange round k (W_XCHG + k).
enum { W_FULL = 0, W_EMPTY = 1, W_XCHG = 2 };
// Warp-uniform: every lane tests (each with the barrier's acquire), the loop condition is a vote, so the code after
// it stays on the converged path (per-lane loops made the compiler emit divergence-safe shuffles in the probe).
template <bool CLUSTER_SCOPE>
__device__ __forceinline__ void wait_warp(u32 bar, u32 parity, int s, int what) {
    u32 polls = 0;
    u64 t0 = 0;
    while (!__all_sync(0xffffffffu, CLUSTER_SCOPE ? mbar_try_cluster(bar, parity) : mbar_try(bar, parity))) {
        if ((++polls & 0xfffu) == 0u) {
            const u64 now = global_ns();
            if (polls == 0x1000u) t0 = now;
            else if (now - t0 > 4000000000ull || polls >= (1u << 26)) fused_stuck(what, bar, parity, s);
        }
    }
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async8(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// This thread's arrival on `bar`, triggered when all its earlier cp.async have landed (counted in the init count).
__device__ __forceinline__ void cp_async_arrive_noinc(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_s2cluster(u32 rdst, u32 lsrc, u32 bytes, u32 rbar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     rdst),
                 "r"(lsrc), "r"(bytes), "r"(rbar)
                 : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void bar_consumers() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
// Named barriers: 1 = the 8 consumer warps (256 threads), 2 = fused_logreg.cu's 4 producer warps.
__device__ __forceinline__ void bar_producers() { asm volatile("bar.sync 2, 128;" ::: "memory"); }
// d(16x8) += a(16x16) b(16x8), fp16 operands, fp32 accumulation. Fragments (g = lane / 4, t = lane % 4): a = {(g,
// 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, b = {(2t..2t+1, g), (2t+8.., g)}, d = {(g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1)}; the lower half of each 32-bit register holds the lower index.
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with the fragments as arrays (fused.cu, fused_mlp.cu).
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 v;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
    return v;
}
