// batch_probe.cu: the hardware costs that decide the partition of a persistent MLP kernel at batch 64-512
// (issue 38; docs/design/batch.md has the budget these numbers feed and says how to read each table).
// A probe, not product code: no model, no training, only the four kinds of work a step is made of, each timed in
// isolation on one GPU with one CTA per SM (256 threads, > 114 KB of shared memory, as the grid kernels run).
//
//   round   : the 1-D partition's exchange round at batch B: every CTA writes its 1/P share of an activation of
//             `bytes`, a monotone counter barrier (fence.acq_rel.gpu + red.add, ld.acquire poll: grid.md 7.3), then
//             EVERY CTA streams the whole activation from L2 into shared memory through a ring of 4 x 32-KB stages
//             (one thread issues cp.async.bulk; all threads wait on each stage, read it, and release it).
//             Also without the barrier ("bcast": the read alone), with each CTA reading a 1/G row block
//             ("rows/G": the 2-D partition's read), and each CTA its own region ("distinct": no sharing at all).
//   mcast   : the same read in clusters of S = 2/4/8 with TMA multicast: each CTA of a cluster fetches 1/S of
//             every chunk from L2 and the copy lands in all S CTAs' shared memory (cluster-wide empty barriers
//             guard the ring). With and without the grid barrier. Decides whether L2 or the SM's inbound port
//             bounds the broadcast (partition C).
//   dsmem   : a reduction of fp32 partials inside a cluster through distributed shared memory (bulk copies
//             shared::cta -> shared::cluster completing on the receiver's mbarrier, double-buffered by parity,
//             then the fixed-order sum): all-reduce (every CTA sends its whole partial to every peer) and
//             reduce-scatter (slice q to CTA q). The 2-D partition's weight-gradient reduction (partition B).
//   mma     : mma.sync m16n8k16 (fp16 -> fp32) tile loops from shared memory (ldmatrix), the shapes a CTA's
//             product takes at batch 64-512: out[R x N] += A[R x K] W[N x K]^T, 8 warps, warp tiles of MT x NT
//             m16n8 tiles, K split across warps when the tiles are fewer than the warps. Decides the compute part
//             of each phase (the 1-D partition's 8 units a CTA reuse each activation fragment once).
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o batch_probe batch_probe.cu
// Run:   ./batch_probe all | round | mcast | dsmem | mma      (one JSON object a line; run_probe.py builds, runs and makes tables)
// Every wait has a watchdog (2^24 polls: print where, then trap) so a lost arrival costs seconds, not the device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

namespace {
constexpr int NT = 256;           // threads a CTA, as the grid kernels
constexpr int CH = 32768;         // bytes a ring stage
constexpr int NST = 4;            // ring stages
constexpr int SMEM_ONE_PER_SM = 140 * 1024;  // forces one CTA per SM, as the grid kernels' 118-218 KB do
constexpr uint32_t SPIN_LIMIT = 1u << 24;

// ---- PTX helpers (the shared probes' own, sm_90) -----------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void cluster_sync_full() {  // start and end only (MEMBAR.GPU in SASS)
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t a, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t a, uint32_t parity) {
    uint32_t ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"(a), "r"(parity)
                 : "memory");
    return ok != 0;
}
__device__ __forceinline__ bool mbar_try_cluster(uint32_t a, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(a), "r"(parity)
        : "memory");
    return ok != 0;
}
__device__ __noinline__ void stuck(const char* what, uint32_t a, uint32_t parity, int it) {
    printf("batch_probe: stuck on %s 0x%x parity/target %u iteration %d block %d thread %d\n", what, a, parity, it,
           (int)blockIdx.x, (int)threadIdx.x);
    __trap();
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity, int it) {
    uint32_t spins = 0;
    while (!mbar_try(a, parity))
        if (++spins == SPIN_LIMIT) stuck("mbarrier", a, parity, it);
}
__device__ __forceinline__ void mbar_wait_cluster(uint32_t a, uint32_t parity, int it) {
    uint32_t spins = 0;
    while (!mbar_try_cluster(a, parity))
        if (++spins == SPIN_LIMIT) stuck("cluster mbarrier", a, parity, it);
}
__device__ __forceinline__ void mbar_arm_tx(uint32_t a, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
                 : "memory");
}
// an arrival on the mbarrier at shared::cluster address `ra` (a peer's, from mapa) after this CTA's reads of a ring
// stage: the default .release.cta, as CUTLASS's ClusterBarrier::arrive(cta) (.release.cluster compiles to a
// MEMBAR.ALL.GPU, ~850 cycles: fused-v2.md 5.1, which a chunk's release must not pay)
__device__ __forceinline__ void mbar_arrive_remote(uint32_t ra) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(ra) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// the same copy delivered to every CTA of the cluster in `mask`, at the same offsets, on their own mbarriers
__device__ __forceinline__ void bulk_g2s_mcast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                               uint16_t mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "h"(mask)
        : "memory");
}
__device__ __forceinline__ void bulk_s2cluster(uint32_t rdst, uint32_t lsrc, uint32_t bytes, uint32_t rbar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     rdst),
                 "r"(lsrc), "r"(bytes), "r"(rbar)
                 : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void arrive_fence_red(unsigned* p) {
    asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ void counter_wait(const unsigned* p, unsigned target, int it) {
    uint32_t spins = 0;
    while (ld_acquire(p) < target)
        if (++spins == SPIN_LIMIT) stuck("round counter", 0, target, it);
}
__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t (&d)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x2(uint32_t a, uint32_t& d0, uint32_t& d1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(d0), "=r"(d1) : "r"(a) : "memory");
}
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- round / bcast / rows / distinct: every CTA streams `bytes` from L2 through the ring -------------------------
// region: 0 = all CTAs read the same `bytes` (the 1-D partition's broadcast), 1 = CTA p reads row block p % G of
// G x `bytes` (the 2-D partition), 2 = CTA p reads its own `bytes` (no sharing). barrier = 1: first every CTA
// writes its 1/P share of the region it reads (by step parity) and waits on the grid counter (an exchange round).
// consume = 1: every thread reads each stage from shared memory (16-B loads) before it is released.
struct StreamArgs {
    unsigned* cnt;
    uint8_t* buf;
    long long* cyc;  // [gridDim.x] cycles of each CTA
    int iters, bytes, region, groups, barrier, consume;
};

__global__ void __launch_bounds__(NT, 1) l2_stream(StreamArgs a) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x;
    const unsigned P = gridDim.x, p = blockIdx.x;
    const uint32_t full = smem_u32(sm), ring = smem_u32(sm + 128);
    if (tid == 0) {
        for (int s = 0; s < NST; ++s) mbar_init(full + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int ch = a.bytes < CH ? a.bytes : CH, nch = a.bytes / ch;
    const size_t span = a.region == 0 ? (size_t)a.bytes : a.region == 1 ? (size_t)a.groups * a.bytes
                                                                         : (size_t)P * a.bytes;
    const size_t mine = a.region == 0 ? 0 : a.region == 1 ? (size_t)(p % a.groups) * a.bytes : (size_t)p * a.bytes;
    uint32_t acc = 0;
    unsigned g = 0;  // chunks consumed so far: stage g % NST, phase (g / NST) & 1
    long long t0 = 0;
    for (int it = -2; it < a.iters; ++it) {  // two untimed iterations warm L2 and the code
        if (it == 0) {
            __syncthreads();
            t0 = clock64();
        }
        const uint8_t* src = a.buf + (a.barrier ? (size_t)((it + 2) & 1) * span : 0) + mine;
        if (a.barrier) {
            // this CTA's share of what it will read (of the region it belongs to), then the round
            const int writers = a.region == 1 ? (int)(P + a.groups - 1) / a.groups : a.region == 0 ? (int)P : 1;
            const int share = (a.bytes / writers) & ~15;
            const int lo = a.region == 0 ? (int)p * share : a.region == 1 ? (int)(p / a.groups) * share : 0;
            uint8_t* dst = const_cast<uint8_t*>(src) + lo;
            for (int o = tid * 16; o < share; o += NT * 16)
                __stcg(reinterpret_cast<uint4*>(dst + o), make_uint4(it, p, o, 7));
            __syncthreads();
            if (tid == 0) {
                arrive_fence_red(a.cnt);
                counter_wait(a.cnt, P * (unsigned)(it + 3), it);
                fence_proxy_async_global();
            }
        }
        if (tid == 0)
            for (int c = 0; c < NST && c < nch; ++c) {
                const uint32_t s = (g + c) % NST;
                mbar_arm_tx(full + 8 * s, (uint32_t)ch);
                bulk_g2s(ring + s * CH, src + (size_t)c * ch, (uint32_t)ch, full + 8 * s);
            }
        for (int c = 0; c < nch; ++c, ++g) {
            const uint32_t s = g % NST;
            if (a.consume || tid == 0) mbar_wait(full + 8 * s, (g / NST) & 1, it);
            if (a.consume) {
                for (int o = tid * 16; o < ch; o += NT * 16) {
                    const uint4 v = *reinterpret_cast<const uint4*>(sm + 128 + s * CH + o);
                    acc ^= v.x ^ v.y ^ v.z ^ v.w;
                }
                __syncthreads();  // every reader done before the stage is refilled
            }
            if (tid == 0 && c + NST < nch) {
                mbar_arm_tx(full + 8 * s, (uint32_t)ch);
                bulk_g2s(ring + s * CH, src + (size_t)(c + NST) * ch, (uint32_t)ch, full + 8 * s);
            }
        }
        __syncthreads();
    }
    const long long t1 = clock64();
    if (tid == 0) a.cyc[p] = t1 - t0;
    if (acc == 0x9E3779B9u) a.cyc[P] = acc;  // keeps the reads
}

// ---- mcast: the same read in clusters of S, each chunk fetched 1/S by each CTA and multicast to all -------------
template <int S>
__global__ void __launch_bounds__(NT, 1) mcast_stream(StreamArgs a) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x;
    const unsigned P = gridDim.x, p = blockIdx.x;
    const uint32_t rank = cluster_rank();
    const uint32_t full = smem_u32(sm), empty = full + 8 * NST, ring = smem_u32(sm + 128);
    if (tid == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, S);  // every CTA of the cluster has read the stage
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    cluster_sync_full();  // every CTA's barriers exist before anyone multicasts into it
    const int ch = a.bytes < CH ? a.bytes : CH, nch = a.bytes / ch, slice = ch / S;
    const uint16_t mask = (uint16_t)((1u << S) - 1u);
    uint32_t acc = 0;
    unsigned g = 0;
    long long t0 = 0;
    for (int it = -2; it < a.iters; ++it) {
        if (it == 0) {
            __syncthreads();
            t0 = clock64();
        }
        const uint8_t* src = a.buf + (a.barrier ? (size_t)((it + 2) & 1) * a.bytes : 0);
        if (a.barrier) {
            const int share = (a.bytes / (int)P) & ~15;
            uint8_t* dst = const_cast<uint8_t*>(src) + (size_t)p * share;
            for (int o = tid * 16; o < share; o += NT * 16)
                __stcg(reinterpret_cast<uint4*>(dst + o), make_uint4(it, p, o, 7));
            __syncthreads();
            if (tid == 0) {
                arrive_fence_red(a.cnt);
                counter_wait(a.cnt, P * (unsigned)(it + 3), it);
                fence_proxy_async_global();
            }
        }
        for (int c = 0; c < nch + NST; ++c) {
            // issue chunk c (after every CTA of the cluster released its stage), then consume chunk c - NST + 1..
            if (tid == 0 && c < nch) {
                const unsigned gc = g + c;
                const uint32_t s = gc % NST;
                if (gc >= NST) mbar_wait(empty + 8 * s, ((gc / NST) - 1) & 1, it);
                mbar_arm_tx(full + 8 * s, (uint32_t)ch);
                bulk_g2s_mcast(ring + s * CH + rank * slice, src + (size_t)c * ch + rank * slice, (uint32_t)slice,
                               full + 8 * s, mask);
            }
            const int k = c - (NST - 1);  // the chunk consumed now: the ring keeps NST - 1 chunks in flight ahead
            if (k >= 0 && k < nch) {
                const unsigned gk = g + k;
                const uint32_t s = gk % NST;
                mbar_wait(full + 8 * s, (gk / NST) & 1, it);
                if (a.consume)
                    for (int o = tid * 16; o < ch; o += NT * 16) {
                        const uint4 v = *reinterpret_cast<const uint4*>(sm + 128 + s * CH + o);
                        acc ^= v.x ^ v.y ^ v.z ^ v.w;
                    }
                __syncthreads();
                if (tid < S) mbar_arrive_remote(mapa(empty + 8 * s, (uint32_t)tid));
            }
        }
        g += nch;
        __syncthreads();
    }
    const long long t1 = clock64();
    if (tid == 0) a.cyc[p] = t1 - t0;
    if (acc == 0x9E3779B9u) a.cyc[P] = acc;
    cluster_sync_full();  // no CTA leaves while a peer may still multicast into it or arrive on its barriers
}

// ---- dsmem: reduction of fp32 partials of `bytes` inside a cluster of S ----------------------------------------
// rs = 0: all-reduce (every CTA sends its whole partial to each peer, sums all S in rank order);
// rs = 1: reduce-scatter (CTA q receives slice q of every peer's partial and sums its slice).
// Layout: bar[2] | own[2][bytes] | recv[2][S-1][piece] with piece = bytes (all-reduce) or bytes / S.
template <int S>
__global__ void __launch_bounds__(NT, 1) dsmem_reduce(StreamArgs a) {
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x;
    const uint32_t rank = cluster_rank();
    const bool rs = a.region == 1;
    const int bytes = a.bytes, piece = rs ? bytes / S : bytes;
    const uint32_t bars = smem_u32(sm), own0 = smem_u32(sm + 128), recv0 = own0 + 2 * bytes;
    float* ownf = reinterpret_cast<float*>(sm + 128);
    float* recvf = reinterpret_cast<float*>(sm + 128 + 2 * bytes);
    if (tid == 0) {
        mbar_init(bars, 1);
        mbar_init(bars + 8, 1);
        mbar_arm_tx(bars, (uint32_t)((S - 1) * piece));
        mbar_arm_tx(bars + 8, (uint32_t)((S - 1) * piece));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    for (int i = tid; i < 2 * bytes / 4; i += NT) ownf[i] = (float)(i & 255) * 0.5f + (float)rank;
    __syncthreads();
    cluster_sync_full();
    long long t0 = 0;
    for (int it = -2; it < a.iters; ++it) {
        if (it == 0) {
            __syncthreads();
            t0 = clock64();
        }
        const int xb = (it + 2) & 1;
        const uint32_t own = own0 + (uint32_t)(xb * bytes);
        fence_proxy_async_smem();  // this step's partial (written by the threads) visible to the bulk copies
        __syncthreads();
        if (tid < S - 1) {  // one lane a peer: q = the tid-th other rank; my slot in q's recv is my rank below q
            const uint32_t q = (uint32_t)tid < rank ? (uint32_t)tid : (uint32_t)tid + 1u;
            const uint32_t slot = rank < q ? rank : rank - 1u;
            const uint32_t dst = recv0 + (uint32_t)((xb * (S - 1) + (int)slot) * piece);
            const uint32_t srcoff = rs ? q * (uint32_t)piece : 0u;
            bulk_s2cluster(mapa(dst, q), own + srcoff, (uint32_t)piece, mapa(bars + 8u * (uint32_t)xb, q));
        }
        mbar_wait_cluster(bars + 8u * (uint32_t)xb, (uint32_t)(((it + 2) >> 1) & 1), it);
        if (tid == 0 && it + 2 < a.iters) mbar_arm_tx(bars + 8u * (uint32_t)xb, (uint32_t)((S - 1) * piece));
        // fixed-order sum of the S partials (ranks 0..S-1) into next step's partial own[1 - xb]
        const int lo = rs ? (int)rank * piece : 0;
        const float4* mine = reinterpret_cast<const float4*>(ownf + xb * bytes / 4 + lo / 4);
        float4* next = reinterpret_cast<float4*>(ownf + (1 - xb) * bytes / 4 + lo / 4);
        for (int i = tid; i < piece / 16; i += NT) {
            float4 s4 = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int r = 0; r < S; ++r) {
                const float4 v = r == (int)rank
                                     ? mine[i]
                                     : reinterpret_cast<const float4*>(
                                           recvf + (xb * (S - 1) + (r < (int)rank ? r : r - 1)) * piece / 4)[i];
                s4.x += v.x;
                s4.y += v.y;
                s4.z += v.z;
                s4.w += v.w;
            }
            next[i] = make_float4(s4.x * 0.25f, s4.y * 0.25f, s4.z * 0.25f, s4.w * 0.25f);
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    if (tid == 0) a.cyc[blockIdx.x] = t1 - t0;
    cluster_sync_full();
}

// ---- mma: out[R x N] += A[R x K] W[N x K]^T from shared memory ---------------------------------------------------
// A and W hold one KC-wide chunk of K (rows padded by 16 B: conflict-free ldmatrix), reused K / KC times (the
// streamed chunks' arrival is the round's and the ring's cost, timed above). Warp tiles of MT x NT m16n8 tiles;
// when there are fewer tiles than warps, K is split across warps (the cross-warp sum is not timed here: the
// budget adds it). Every CTA of the grid runs the same loop (all SMs busy, so the clock is the loaded one).
constexpr int KC = 64, LDK = KC + 8;  // halves a row in shared memory
template <int MT, int NT8>
__global__ void __launch_bounds__(NT, 1) mma_tiles(int R, int N, int K, int reps, float* out, long long* cyc) {
    extern __shared__ __align__(128) uint8_t sm[];
    __half* A = reinterpret_cast<__half*>(sm);
    __half* W = A + (size_t)R * LDK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < (R + N) * LDK; i += NT) A[i] = __float2half((float)((i * 7) & 15) * 0.0625f);
    __syncthreads();
    const int mb = R / (16 * MT), nb = N / (8 * NT8), blocks = mb * nb;
    const int ksplit = blocks >= 8 ? 1 : 8 / blocks, kw = K / ksplit;  // K per warp
    const uint32_t a0 = smem_u32(A), w0 = smem_u32(W);
    float acc[MT][NT8][4];
    float keep = 0.f;
    __syncthreads();
    const long long t0 = clock64();
    for (int rep = 0; rep < reps; ++rep)
        for (int task = warp; task < blocks * ksplit; task += 8) {
            const int blk = task % blocks, kpart = task / blocks;
            const int m0 = (blk % mb) * 16 * MT, n0 = (blk / mb) * 8 * NT8;
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT8; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
            for (int k = kpart * kw; k < kpart * kw + kw; k += 16) {
                const int kk = k % KC;  // position inside the resident chunk
                uint32_t af[MT][4], bf[NT8][2];
#pragma unroll
                for (int i = 0; i < MT; ++i)
                    ldsm_x4(a0 + (uint32_t)(((m0 + i * 16 + (lane & 15)) * LDK + kk + (lane >> 4) * 8) * 2), af[i]);
#pragma unroll
                for (int j = 0; j < NT8; j += 2) {
                    if (j + 1 < NT8) {
                        uint32_t b[4];
                        ldsm_x4(w0 + (uint32_t)(((n0 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * LDK + kk +
                                                 ((lane >> 3) & 1) * 8) *
                                                2),
                                b);
                        bf[j][0] = b[0];
                        bf[j][1] = b[1];
                        bf[j + 1][0] = b[2];
                        bf[j + 1][1] = b[3];
                    } else {
                        ldsm_x2(w0 + (uint32_t)(((n0 + j * 8 + (lane & 7)) * LDK + kk + ((lane >> 3) & 1) * 8) * 2),
                                bf[j][0], bf[j][1]);
                    }
                }
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int j = 0; j < NT8; ++j) mma16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT8; ++j) keep += acc[i][j][0] + acc[i][j][3];
        }
    __syncthreads();
    const long long t1 = clock64();
    out[blockIdx.x * NT + tid] = keep;
    if (tid == 0) cyc[blockIdx.x] = t1 - t0;
}

// ---- host ----------------------------------------------------------------------------------------------------------
struct Dev {
    int sms = 0;
    unsigned* cnt = nullptr;
    uint8_t* buf = nullptr;
    long long* cyc = nullptr;
    size_t buf_bytes = 0;
};

void stats(const std::vector<long long>& c, int iters, double& mean, double& mx) {
    double s = 0, m = 0;
    for (long long v : c) {
        s += (double)v;
        m = std::max(m, (double)v);
    }
    mean = s / c.size() / iters;
    mx = m / iters;
}

std::vector<long long> fetch_cycles(const Dev& d, int n) {
    std::vector<long long> c(n);
    CK(cudaMemcpy(c.data(), d.cyc, n * sizeof(long long), cudaMemcpyDeviceToHost));
    return c;
}

// one timed launch; returns the elapsed ms (events) so that cycles / ns gives the clock under this load
template <typename Launch>
float timed(Launch&& launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms;
}

void run_stream(Dev& d, const char* kind, int ctas, int bytes, int region, int groups, int barrier, int consume) {
    const int iters = bytes >= (512 << 10) ? 200 : 1000;
    const size_t span = region == 0 ? (size_t)bytes : region == 1 ? (size_t)groups * bytes : (size_t)ctas * bytes;
    if (2 * span > d.buf_bytes) return;
    const int smem = SMEM_ONE_PER_SM;
    CK(cudaFuncSetAttribute(l2_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    StreamArgs a{d.cnt, d.buf, d.cyc, iters, bytes, region, groups, barrier, consume};
    CK(cudaMemset(d.cnt, 0, 64));
    void* args[] = {&a};
    const float ms = timed([&] {
        CK(cudaLaunchCooperativeKernel((void*)l2_stream, dim3(ctas), dim3(NT), args, smem, 0));
    });
    double mean, mx;
    const auto c = fetch_cycles(d, ctas);
    stats(c, iters, mean, mx);
    const double ghz = (double)c[0] / ((double)ms * 1e6 * iters / (iters + 2));
    printf("{\"probe\": \"%s\", \"ctas\": %d, \"bytes\": %d, \"groups\": %d, \"barrier\": %d, \"consume\": %d, "
           "\"cycles\": %.0f, \"cycles_max\": %.0f, \"ns\": %.0f, \"ghz\": %.3f, \"bytes_per_clk_per_sm\": %.1f}\n",
           kind, ctas, bytes, groups, barrier, consume, mean, mx, ms * 1e6 / (iters + 2), ghz, bytes / mean);
    fflush(stdout);
}

template <typename K>
int max_clusters(K kernel, int S, int smem) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(S * 32);
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, (void*)kernel, &cfg));
    return n;
}

template <typename K>
float launch_cluster(K kernel, int S, int clusters, int smem, StreamArgs a) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (S > 8) CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(S * clusters);
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return timed([&] { CK(cudaLaunchKernelEx(&cfg, kernel, a)); });
}

template <int S>
void run_mcast(Dev& d, int bytes, int barrier, int consume) {
    const int smem = SMEM_ONE_PER_SM;
    CK(cudaFuncSetAttribute(mcast_stream<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int clusters = max_clusters(mcast_stream<S>, S, smem);  // all resident: the grid counter needs it
    const int ctas = clusters * S, iters = bytes >= (512 << 10) ? 200 : 1000;
    if (clusters < 1 || 2 * (size_t)bytes > d.buf_bytes) return;
    StreamArgs a{d.cnt, d.buf, d.cyc, iters, bytes, 0, 1, barrier, consume};
    CK(cudaMemset(d.cnt, 0, 64));
    const float ms = launch_cluster(mcast_stream<S>, S, clusters, smem, a);
    double mean, mx;
    const auto c = fetch_cycles(d, ctas);
    stats(c, iters, mean, mx);
    const double ghz = (double)c[0] / ((double)ms * 1e6 * iters / (iters + 2));
    printf("{\"probe\": \"mcast\", \"cluster\": %d, \"ctas\": %d, \"bytes\": %d, \"barrier\": %d, \"consume\": %d, "
           "\"cycles\": %.0f, \"cycles_max\": %.0f, \"ns\": %.0f, \"ghz\": %.3f, \"bytes_per_clk_per_sm\": %.1f}\n",
           S, ctas, bytes, barrier, consume, mean, mx, ms * 1e6 / (iters + 2), ghz, bytes / mean);
    fflush(stdout);
}

template <int S>
void run_dsmem(Dev& d, int bytes, int rs) {
    const int piece = rs ? bytes / S : bytes;
    const int smem = 128 + 2 * bytes + 2 * (S - 1) * piece;
    if (smem > 227 * 1024 || piece % 16) return;
    const int smem_alloc = std::max(smem, SMEM_ONE_PER_SM);
    CK(cudaFuncSetAttribute(dsmem_reduce<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_alloc));
    const int clusters = max_clusters(dsmem_reduce<S>, S, smem_alloc);
    if (clusters < 1) return;
    const int iters = 1000;
    StreamArgs a{d.cnt, d.buf, d.cyc, iters, bytes, rs, 1, 0, 0};
    const float ms = launch_cluster(dsmem_reduce<S>, S, clusters, smem_alloc, a);
    double mean, mx;
    const auto c = fetch_cycles(d, clusters * S);
    stats(c, iters, mean, mx);
    const double ghz = (double)c[0] / ((double)ms * 1e6 * iters / (iters + 2));
    printf("{\"probe\": \"dsmem\", \"op\": \"%s\", \"cluster\": %d, \"ctas\": %d, \"bytes\": %d, \"inbound\": %d, "
           "\"cycles\": %.0f, \"cycles_max\": %.0f, \"ghz\": %.3f, \"inbound_bytes_per_clk\": %.1f}\n",
           rs ? "reduce-scatter" : "all-reduce", S, clusters * S, bytes, (S - 1) * piece, mean, mx, ghz,
           (S - 1) * piece / mean);
    fflush(stdout);
}

template <int MT, int NT8>
void run_mma(Dev& d, const char* what, int R, int N, int K) {
    const int smem = std::max((R + N) * LDK * 2, SMEM_ONE_PER_SM);
    if ((R + N) * LDK * 2 > 227 * 1024 || R % (16 * MT) || N % (8 * NT8) || K % (16 * 8)) return;
    CK(cudaFuncSetAttribute(mma_tiles<MT, NT8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    float* dout;
    CK(cudaMalloc(&dout, (size_t)d.sms * NT * 4));
    const int reps = std::max(4, (int)(200000000.0 / ((double)R * N * K)));
    mma_tiles<MT, NT8><<<d.sms, NT, smem>>>(R, N, K, 2, dout, d.cyc);
    CK(cudaGetLastError());
    const float ms = timed([&] { mma_tiles<MT, NT8><<<d.sms, NT, smem>>>(R, N, K, reps, dout, d.cyc); });
    double mean, mx;
    const auto c = fetch_cycles(d, d.sms);
    stats(c, reps, mean, mx);
    const double fma = (double)R * N * K;
    printf("{\"probe\": \"mma\", \"what\": \"%s\", \"R\": %d, \"N\": %d, \"K\": %d, \"MT\": %d, \"NT\": %d, "
           "\"cycles\": %.0f, \"cycles_max\": %.0f, \"ghz\": %.3f, \"fma_per_clk_per_sm\": %.0f, "
           "\"smem_bytes_per_clk\": %.1f}\n",
           what, R, N, K, MT, NT8, mean, mx, (double)c[0] / ((double)ms * 1e6), fma / mean,
           // ldmatrix bytes a CTA reads per cycle: A once per n-block, W once per m-block
           ((double)R * K * 2 * (N / (8 * NT8)) + (double)N * K * 2 * (R / (16 * MT))) / mean);
    fflush(stdout);
    CK(cudaFree(dout));
}

void probe_round(Dev& d) {
    // the exchange round and the broadcast read at the activations of batch 32..512 x h 256..1024 (fp16):
    // 16 KB (b32 h256) .. 1 MB (b512 h1024); at 132 CTAs (the whole GPU), 128 (h = 1024's 1-D plan) and 32
    for (int bytes : {16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20}) {
        run_stream(d, "round", d.sms, bytes, 0, 1, 1, 1);
        run_stream(d, "bcast", d.sms, bytes, 0, 1, 0, 1);
        run_stream(d, "bcast-noconsume", d.sms, bytes, 0, 1, 0, 0);
    }
    for (int bytes : {64 << 10, 256 << 10, 1 << 20}) {
        run_stream(d, "round", 128, bytes, 0, 1, 1, 1);
        run_stream(d, "round", 32, bytes, 0, 1, 1, 1);
    }
    // the 2-D partition's row blocks: every CTA reads 1/G of a 1-MB activation (G copies' worth of distinct data)
    for (int groups : {2, 4, 8}) {
        run_stream(d, "rows", d.sms, (1 << 20) / groups, 1, groups, 0, 1);
        run_stream(d, "rows-round", d.sms, (1 << 20) / groups, 1, groups, 1, 1);
    }
    // no sharing at all: each CTA its own region (132 x 256 KB = 33 MB, L2-resident after the warm-up)
    for (int bytes : {64 << 10, 256 << 10}) run_stream(d, "distinct", d.sms, bytes, 2, 1, 0, 1);
}

void probe_mcast(Dev& d) {
    for (int bytes : {64 << 10, 256 << 10, 1 << 20}) {
        for (int barrier : {0, 1}) {
            run_mcast<2>(d, bytes, barrier, 1);
            run_mcast<4>(d, bytes, barrier, 1);
            run_mcast<8>(d, bytes, barrier, 1);
        }
    }
}

void probe_dsmem(Dev& d) {
    for (int rs : {0, 1})
        for (int bytes : {8 << 10, 16 << 10, 32 << 10, 48 << 10}) {
            run_dsmem<2>(d, bytes, rs);
            run_dsmem<4>(d, bytes, rs);
            run_dsmem<8>(d, bytes, rs);
        }
}

void probe_mma(Dev& d) {
    // forward / dgrad of the 1-D partition: out [B x 8 units], K = h (activation fragments reused once)
    for (int R : {64, 128, 256, 512}) {
        run_mma<1, 1>(d, "1-D fwd: B x 8, K = h", R, 8, 1024);
        run_mma<2, 1>(d, "1-D fwd: B x 8, K = h", R, 8, 1024);
        run_mma<4, 1>(d, "1-D fwd: B x 8, K = h", R, 8, 1024);
    }
    // the same product with wider unit blocks (2-D partition: B/Pb rows x NB units)
    for (int R : {64, 128, 256, 512})
        for (int N : {16, 32, 64}) {
            run_mma<2, 2>(d, "2-D fwd: rows x NB, K = h", R, N, 1024);
            run_mma<2, 4>(d, "2-D fwd: rows x NB, K = h", R, N, 1024);
            run_mma<4, 4>(d, "2-D fwd: rows x NB, K = h", R, N, 1024);
        }
    // weight gradient of the 1-D partition: out [h x 16 (8 units padded to m16... as n: 8)], K = batch
    for (int K : {128, 256, 512}) {
        run_mma<2, 1>(d, "wgrad: h x 8, K = B", 1024, 8, K);
        run_mma<4, 1>(d, "wgrad: h x 8, K = B", 1024, 8, K);
        run_mma<4, 2>(d, "wgrad: h x 16, K = B", 1024, 16, K);
        run_mma<4, 4>(d, "wgrad: h x 32, K = B", 1024, 32, K);
    }
}
}  // namespace

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "all";
    Dev d;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    d.sms = prop.multiProcessorCount;
    d.buf_bytes = (size_t)2 * d.sms * (256 << 10) + (8 << 20);
    CK(cudaMalloc(&d.cnt, 64));
    CK(cudaMalloc(&d.buf, d.buf_bytes));
    CK(cudaMemset(d.buf, 1, d.buf_bytes));
    CK(cudaMalloc(&d.cyc, (d.sms + 1) * sizeof(long long)));
    printf("{\"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, \"smem_per_block_optin\": %zu}\n", prop.name,
           d.sms, prop.l2CacheSize, prop.sharedMemPerBlockOptin);
    fflush(stdout);
    if (what == "all" || what == "round") probe_round(d);
    if (what == "all" || what == "mcast") probe_mcast(d);
    if (what == "all" || what == "dsmem") probe_dsmem(d);
    if (what == "all" || what == "mma") probe_mma(d);
    CK(cudaFree(d.cnt));
    CK(cudaFree(d.buf));
    CK(cudaFree(d.cyc));
    return 0;
}
