// many.cu: the many-model GPU engine's step (fastnn/engine/many/gpu/): K models of one MLP architecture, each with
// its own parameters, optimizer hyperparameters, learning rate and rows, trained one step at a time in fp32.
// Every kernel reads the step's shape from a Step record (below): which stream (a mask group at one epoch index,
// fastnn/engine/many/plan.py) each model reads, and how many rows that stream has at this step.
//
// Kernels, in the order of a step (docs/design/many-models.md):
//   many_gather_{u8,f32}  grid (batch, streams), block 256: stream s's batch rows, gathered once for its models
//                         through its group's row table in the shared Feistel order (shuffle.cuh), mapped
//                         x * scale + shift (fastnn/_data.py's input_affine) into xb (streams x batch x d) fp32.
//   many_forward_{x,relu,gelu}  grid (ceil(out/16), ceil(batch/16), K), block (16, 16): per model a 16 x 16-tiled
//                         fp32 GEMM z = a w^T + b; a is its stream's batch (x, layer 0) or the previous layer's z
//                         with the activation applied on load. (With one stream, the engine runs layer 0 of all
//                         models as one cuBLASLt GEMM instead: engine.py's fast path.)
//   many_xent, many_mse   grid K, block 256: per model the loss of its rows as the NumPy engine defines it
//                         (fastnn/engine/numpy_engine.py's loss_and_grad, mse_loss_and_grad), its sums added to the
//                         model's history slots (hist[2k], hist[2k+1]: one block a model, no atomics), and the
//                         gradient of the batch mean into dz.
//   many_wgrad_{x,relu,gelu}  grid (ceil((in+1)/16), ceil(out/16), K), block (16, 16): dW = dZ^T A and db = the
//                         column sums of dZ (A with a column of ones), into the model's gradients.
//   many_dgrad_{relu,gelu}  grid (ceil(in/16), ceil(batch/16), K), block (16, 16): dZ_prev = (dZ W) * act'(z_prev).
//   many_update           grid (x, K), block 256: optim.cuh's optim_update over model k's tensors with its
//                         OptimParams, learning rate lr[k * lr_stride + step] and step counter step0[k] + step + 1.
//   many_check            grid (x, K), block 256: per model, bits of what in the state the epoch left is not trusted
//                         (fastnn/_state.py decides on the host; these bits say which models to ask about).
// Memory plan: everything in global memory (HBM/L2); the GEMMs' tiles in shared memory (2 x 16 x 17 floats).
// Parameters, gradients and optimizer states are tensor-major: tensor t (layer i's weight (out, in) or bias (out),
// torch's layout) of every model in one block, model k's at block + k * size, so layer 0's weights of all K models
// are one (K * out, in) matrix. Activations are (batch, K, width): row r of every model together, so layer 0's
// outputs of all models are one (batch, K * out) matrix. A model whose stream has no row at a step (a shorter
// group, or not training) does nothing in it.
#include "activation.cuh"
#include "common.cuh"
#include "loss.cuh"
#include "optim.cuh"
#include "shuffle.cuh"

#define TILE 16

// The step's shape, one kernel argument (fastnn/engine/many/gpu/kernels.py packs it, field for field).
struct Step {
    u64 model_stream;  // const int*: stream of each model, -1 when it does not train (or is not evaluated)
    u64 stream_group;  // const int*: group of each stream
    u64 stream_epoch;  // const u32*: epoch index of each stream (keys its order)
    u64 group_n;       // const u32*: rows of each group
    u64 group_half;    // const u32*: fastnn/_shuffle.py's feistel_bits(rows) / 2 of each group
    int step;          // this step's index in the epoch
    int batch;         // rows a full batch has
    int drop_last;     // 1: a short last batch has no rows
    int shuffled;      // 0: positions in order (evaluation, prediction)
};

// Rows of a stream of n rows at step s.
__device__ __forceinline__ int rows_at(u32 n, int s, int batch, int drop_last) {
    const long long left = (long long)n - (long long)s * batch;
    if (left <= 0) return 0;
    if (left >= batch) return batch;
    return drop_last ? 0 : (int)left;
}

__device__ __forceinline__ int model_stream(const Step& st, int k) { return ((const int*)st.model_stream)[k]; }

__device__ __forceinline__ int stream_rows(const Step& st, int s) {
    const int g = ((const int*)st.stream_group)[s];
    return rows_at(((const u32*)st.group_n)[g], st.step, st.batch, st.drop_last);
}

// Model k's rows at this step (0 when it does not train), and its stream in *s.
__device__ __forceinline__ int model_rows(const Step& st, int k, int* s) {
    *s = model_stream(st, k);
    return *s < 0 ? 0 : stream_rows(st, *s);
}

// ---- gather ---------------------------------------------------------------------------------------------------
template <typename TIn>
__device__ void gather(const TIn* __restrict__ x, const u32* __restrict__ y, int yw, int d, const int* __restrict__ rows,
                       const u64* __restrict__ group_off, const Step st, u32 seed_lo, u32 seed_hi, float scale,
                       float shift, const float* __restrict__ fscale, const float* __restrict__ fshift,
                       float* __restrict__ xb, u32* __restrict__ yb) {
    const int j = blockIdx.x, s = blockIdx.y;
    const int g = ((const int*)st.stream_group)[s];
    const u32 n = ((const u32*)st.group_n)[g];
    if (j >= rows_at(n, st.step, st.batch, st.drop_last)) return;
    __shared__ u32 src;
    if (threadIdx.x == 0) {
        const u32 pos = (u32)((long long)st.step * st.batch + j);
        u32 idx = pos;
        if (st.shuffled) {
            u32 keys[FEISTEL_ROUNDS];
            round_keys(seed_lo, seed_hi, ((const u32*)st.stream_epoch)[s], keys);
            idx = permuted_index(keys, ((const u32*)st.group_half)[g], n, pos);
        }
        src = (u32)rows[group_off[g] + idx];
    }
    __syncthreads();
    const u64 out_row = (u64)s * st.batch + j;
    for (int i = threadIdx.x; i < yw; i += blockDim.x) yb[out_row * yw + i] = y[(u64)src * yw + i];
    const TIn* row = x + (u64)src * d;
    float* dst = xb + out_row * d;
    if (fscale) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = to_f(row[i]) * fscale[i] + fshift[i];
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = to_f(row[i]) * scale + shift;
    }
}

#define GATHER(name, TIn)                                                                                           \
    extern "C" __global__ void name(const TIn* x, const u32* y, int yw, int d, const int* rows, const u64* group_off, \
                                    const Step st, u32 seed_lo, u32 seed_hi, float scale, float shift,               \
                                    const float* fscale, const float* fshift, float* xb, u32* yb) {                  \
        gather<TIn>(x, y, yw, d, rows, group_off, st, seed_lo, seed_hi, scale, shift, fscale, fshift, xb, yb);        \
    }
GATHER(many_gather_u8, u8)
GATHER(many_gather_f32, float)

// ---- forward: z = a w^T + b -------------------------------------------------------------------------------
// The layer's input a: layer 0 (act_in < 0) reads its stream's rows of xb; a later layer reads the previous layer's
// pre-activations zin and applies the activation on load (no activation buffer is kept).
template <int act_in>
__device__ __forceinline__ float input_at(const float* __restrict__ xb, const float* __restrict__ zin, int s, int k,
                                          int r, int i, int in, int models, int batch) {
    if (act_in < 0) return xb[((u64)s * batch + r) * in + i];
    return activation<act_in < 0 ? 0 : act_in>(zin[((u64)r * models + k) * in + i]);
}

template <int act_in>
__device__ void forward(const float* __restrict__ xb, const float* __restrict__ zin, int in, int out, int models,
                        const float* __restrict__ params, u64 w_off, u64 b_off, float* __restrict__ z, const Step st) {
    __shared__ float as[TILE][TILE + 1], ws[TILE][TILE + 1];
    const int k = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    int s;
    const int rows = model_rows(st, k, &s);
    const int r0 = blockIdx.y * TILE, o0 = blockIdx.x * TILE;
    if (r0 >= rows) return;  // the whole block: no barrier is skipped by part of it
    const float* w = params + w_off + (u64)k * out * in;
    float acc = 0.f;
    for (int i0 = 0; i0 < in; i0 += TILE) {
        const int ra = r0 + ty, ia = i0 + tx, ow = o0 + ty;
        as[ty][tx] = (ra < rows && ia < in) ? input_at<act_in>(xb, zin, s, k, ra, ia, in, models, st.batch) : 0.f;
        ws[ty][tx] = (ow < out && ia < in) ? w[(u64)ow * in + ia] : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc = fmaf(as[ty][kk], ws[tx][kk], acc);
        __syncthreads();
    }
    const int r = r0 + ty, o = o0 + tx;
    if (r < rows && o < out) z[((u64)r * models + k) * out + o] = acc + params[b_off + (u64)k * out + o];
}

#define FORWARD(name, ACT)                                                                                          \
    extern "C" __global__ void name(const float* xb, const float* zin, int in, int out, int models,                \
                                    const float* params, u64 w_off, u64 b_off, float* z, const Step st) {            \
        forward<ACT>(xb, zin, in, out, models, params, w_off, b_off, z, st);                                         \
    }
FORWARD(many_forward_x, -1)
FORWARD(many_forward_relu, 0)
FORWARD(many_forward_gelu, 1)

// ---- losses: one block per model ------------------------------------------------------------------------------
// Adds a block's per-thread sums: v[0..n) of every thread, summed by thread 0 in warp order (the same sums on every
// run). Called by every thread.
__device__ __forceinline__ void block_sums(float* v, int n, double* out) {
    __shared__ float part[32][2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int i = 0; i < n; ++i) {
        const float w = warp_sum(v[i]);
        if (lane == 0) part[warp][i] = w;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < n; ++i) {
            double t = 0.0;
            for (int w = 0; w < warps; ++w) t += part[w][i];
            out[i] += t;
        }
    }
}

// Cross-entropy from the logits (log-sum-exp after subtracting the row max, as numpy_engine.log_softmax), the
// correct count (argmax, first maximum and first NaN win, as numpy.argmax), and with dz the gradient of the
// batch-mean loss (softmax - onehot) / rows. Labels: yb's first word of each row (int32).
extern "C" __global__ void many_xent(const float* __restrict__ z, const u32* __restrict__ yb, int c, int models,
                                     float* __restrict__ dz, double* __restrict__ hist, const Step st) {
    const int k = blockIdx.x;
    int s;
    const int rows = model_rows(st, k, &s);
    if (rows == 0) return;
    const float inv_rows = 1.f / (float)rows;
    float sums[2] = {0.f, 0.f};
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const float* zr = z + ((u64)r * models + k) * c;
        const int label = (int)yb[(u64)s * st.batch + r];
        int best = 0;
        float zmax = zr[0];
        for (int j = 1; j < c; ++j)
            if (argmax_takes(zr[j], zmax)) { zmax = zr[j]; best = j; }
        float sum = 0.f;
        for (int j = 0; j < c; ++j) sum = xent_add(sum, xent_exp(zr[j], zmax));
        sums[0] += xent_row_loss(sum, zr[label], zmax);
        sums[1] += best == label ? 1.f : 0.f;
        if (dz) {
            float* d = dz + ((u64)r * models + k) * c;
            const float inv = xent_inv(sum);
            for (int j = 0; j < c; ++j) d[j] = xent_grad(xent_exp(zr[j], zmax), inv, j == label ? 1.f : 0.f, inv_rows);
        }
    }
    block_sums(sums, 2, hist + 2 * (u64)k);
}

// ---- cross-entropy, tiled: a block a tile of neighbouring models (Tuning.many_loss_kernel = "tiled") ------------
// many_xent's lanes read rows K c floats apart (40 KB at K = 1,024, c = 10): 32 lines an instruction, each row read
// three times (docs/design/many-models.md, "Next kernels"). Here row r of the m models k0 .. k0 + m - 1 is one
// contiguous run of m c floats, so a block of LOSS_SLOTS threads takes those m models and all their rows: a chunk of
// rows at a time it copies the tile into shared memory with coalesced loads (eight in flight a thread), computes each
// (row, model) pair there with loss.cuh's functions in many_xent's order, and writes the gradients back with coalesced
// stores. Each model's sums are added in many_xent's order: row r's terms into slot r % LOSS_SLOTS (float, rows in
// increasing order, as many_xent's thread r % 256 does), each warp's 32 slots by warp_sum, then the LOSS_SLOTS / 32
// partials in double in warp order: hist and dz are many_xent's bit for bit. A variant until a device measurement
// makes it the default (fastnn/engine/tuning.py); the host (kernels.py's xent_tile) picks m <= XENT_TILE_MODELS with
// m c <= XENT_TILE_FLOATS, and launches ceil(K / m) blocks of LOSS_SLOTS threads.
#define LOSS_SLOTS 256         // many_xent's block size (kernels.py's LOSS_THREADS): its slots and its warps' order
#define XENT_TILE_MODELS 4     // the most models a block (kernels.py's XENT_TILE_MODELS)
#define XENT_TILE_FLOATS 5120  // the shared tile of logits, 20 KB: 128 rows of 4 models of 10 classes in one chunk
#define XENT_LOADS 8           // loads in flight a thread while a chunk is copied

extern "C" __global__ void __launch_bounds__(LOSS_SLOTS)
    many_xent_tiled(const float* __restrict__ z, const u32* __restrict__ yb, int c, int models, int m,
                    float* __restrict__ dz, double* __restrict__ hist, const Step st) {
    __shared__ float zs[XENT_TILE_FLOATS];
    __shared__ float acc[2][XENT_TILE_MODELS][LOSS_SLOTS];  // per model: each slot's loss and correct-count sums
    __shared__ int rows_of[XENT_TILE_MODELS], stream_of[XENT_TILE_MODELS];
    const int tid = threadIdx.x, k0 = blockIdx.x * m;
    const int mm = min(m, models - k0);  // models of this tile
    const int width = mm * c;            // floats of one row of the tile
    const int chunk = min(LOSS_SLOTS, XENT_TILE_FLOATS / width);  // rows a chunk: one row a slot at most
    if (tid < mm) {  // (the other threads start copying the first chunk meanwhile)
        int s;
        rows_of[tid] = model_rows(st, k0 + tid, &s);
        stream_of[tid] = s;
    }
    for (int i = tid; i < 2 * XENT_TILE_MODELS * LOSS_SLOTS; i += LOSS_SLOTS) (&acc[0][0][0])[i] = 0.f;
    int most = 0;  // the most rows a model of the tile has (known after the first barrier)
    for (int r0 = 0; r0 < st.batch; r0 += chunk) {
        if (r0 > 0 && r0 >= most) break;  // uniform: `most` is every thread's
        const int n = min(chunk, st.batch - r0) * width;
        for (int e0 = tid; e0 < n; e0 += XENT_LOADS * LOSS_SLOTS) {
            float v[XENT_LOADS];
#pragma unroll
            for (int u = 0; u < XENT_LOADS; ++u) {
                const int e = e0 + u * LOSS_SLOTS, rr = e / width;
                if (e < n) v[u] = z[((u64)(r0 + rr) * models + k0) * c + (e - rr * width)];
            }
#pragma unroll
            for (int u = 0; u < XENT_LOADS; ++u)
                if (e0 + u * LOSS_SLOTS < n) zs[e0 + u * LOSS_SLOTS] = v[u];
        }
        __syncthreads();
        most = 0;
        for (int kk = 0; kk < mm; ++kk) most = max(most, rows_of[kk]);
        const int pairs = min(chunk, max(most - r0, 0)) * mm;
        for (int p = tid; p < pairs; p += LOSS_SLOTS) {
            const int rr = p / mm, kk = p - rr * mm, r = r0 + rr, rows = rows_of[kk];
            if (r >= rows) continue;
            float* zr = zs + rr * width + kk * c;
            const int label = (int)yb[(u64)stream_of[kk] * st.batch + r];
            int best = 0;
            float zmax = zr[0];
            for (int j = 1; j < c; ++j)
                if (argmax_takes(zr[j], zmax)) { zmax = zr[j]; best = j; }
            float sum = 0.f;
            for (int j = 0; j < c; ++j) sum = xent_add(sum, xent_exp(zr[j], zmax));
            const int slot = r % LOSS_SLOTS;
            acc[0][kk][slot] += xent_row_loss(sum, zr[label], zmax);
            acc[1][kk][slot] += best == label ? 1.f : 0.f;
            if (dz) {  // in place: zr[j] is read before its gradient replaces it
                const float inv_rows = 1.f / (float)rows, inv = xent_inv(sum);
                for (int j = 0; j < c; ++j)
                    zr[j] = xent_grad(xent_exp(zr[j], zmax), inv, j == label ? 1.f : 0.f, inv_rows);
            }
        }
        __syncthreads();
        if (dz) {
            for (int e = tid; e < pairs * c; e += LOSS_SLOTS) {  // the chunk's rows below `most`, every model
                const int rr = e / width, col = e - rr * width;
                if (r0 + rr < rows_of[col / c]) dz[((u64)(r0 + rr) * models + k0) * c + col] = zs[e];
            }
            __syncthreads();  // the stores read zs before the next chunk overwrites it
        }
    }
    const int lane = tid & 31;
    for (int kk = tid >> 5; kk < mm; kk += LOSS_SLOTS >> 5) {  // a warp a model: many_xent's block_sums, in order
        if (rows_of[kk] == 0) continue;  // many_xent returns before its sums
        for (int i = 0; i < 2; ++i) {
            double t = 0.0;
            for (int w = 0; w < LOSS_SLOTS >> 5; ++w) t += warp_sum(acc[i][kk][32 * w + lane]);
            if (lane == 0) hist[2 * (u64)(k0 + kk) + i] += t;
        }
    }
}

// Squared error averaged over the k outputs of each row (no factor 1/2), and with dz the gradient of the batch mean
// over rows and outputs, 2 (z - y) / (rows k). Targets: yb's c float32 words of each row. With sse (evaluation),
// each output's sum of squared errors into sse[k * c + j].
extern "C" __global__ void many_mse(const float* __restrict__ z, const u32* __restrict__ yb, int c, int models,
                                    float* __restrict__ dz, double* __restrict__ hist, double* __restrict__ sse,
                                    const Step st) {
    const int k = blockIdx.x;
    int s;
    const int rows = model_rows(st, k, &s);
    if (rows == 0) return;
    const float scale = 2.f / ((float)rows * (float)c);
    float sums[2] = {0.f, 0.f};
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const float* zr = z + ((u64)r * models + k) * c;
        const float* yr = (const float*)yb + ((u64)s * st.batch + r) * c;
        float sq = 0.f;
        for (int j = 0; j < c; ++j) {
            const float d = mse_diff(zr[j], yr[j]);
            sq = mse_add_sq(sq, d);
            if (dz) dz[((u64)r * models + k) * c + j] = mse_grad(d, scale);
        }
        sums[0] += mse_row_loss(sq, c);
    }
    block_sums(sums, 1, hist + 2 * (u64)k);
    if (sse) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        for (int j = warp; j < c; j += warps) {
            float t = 0.f;
            for (int r = lane; r < rows; r += 32) {
                t = mse_add_sq(t, mse_diff(z[((u64)r * models + k) * c + j],
                                           ((const float*)yb)[((u64)s * st.batch + r) * c + j]));
            }
            t = warp_sum(t);
            if (lane == 0) sse[(u64)k * c + j] += (double)t;
        }
    }
}

// ---- backward -------------------------------------------------------------------------------------------------
// dW[o][i] = sum_r dz[r][o] a[r][i]; db[o] = sum_r dz[r][o] (column i == in of a is taken as ones).
template <int act_in>
__device__ void wgrad(const float* __restrict__ xb, const float* __restrict__ zin, int in, int out, int models,
                      const float* __restrict__ dz, float* __restrict__ grads, u64 w_off, u64 b_off, const Step st) {
    __shared__ float ds[TILE][TILE + 1], as[TILE][TILE + 1];
    const int k = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    int s;
    const int rows = model_rows(st, k, &s);
    if (rows == 0) return;
    const int i0 = blockIdx.x * TILE, o0 = blockIdx.y * TILE;
    float acc = 0.f;
    for (int r0 = 0; r0 < rows; r0 += TILE) {
        const int r = r0 + ty, od = o0 + tx, ia = i0 + tx;
        ds[ty][tx] = (r < rows && od < out) ? dz[((u64)r * models + k) * out + od] : 0.f;
        as[ty][tx] = r < rows ? (ia < in ? input_at<act_in>(xb, zin, s, k, r, ia, in, models, st.batch)
                                         : (ia == in ? 1.f : 0.f))
                              : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc = fmaf(ds[kk][ty], as[kk][tx], acc);
        __syncthreads();
    }
    const int o = o0 + ty, i = i0 + tx;
    if (o < out) {
        if (i < in) grads[w_off + (u64)k * out * in + (u64)o * in + i] = acc;
        else if (i == in) grads[b_off + (u64)k * out + o] = acc;
    }
}

#define WGRAD(name, ACT)                                                                                            \
    extern "C" __global__ void name(const float* xb, const float* zin, int in, int out, int models, const float* dz, \
                                    float* grads, u64 w_off, u64 b_off, const Step st) {                            \
        wgrad<ACT>(xb, zin, in, out, models, dz, grads, w_off, b_off, st);                                           \
    }
WGRAD(many_wgrad_x, -1)
WGRAD(many_wgrad_relu, 0)
WGRAD(many_wgrad_gelu, 1)

// dz_prev[r][i] = (sum_o dz[r][o] w[o][i]) * act'(z_prev[r][i]).
template <int act>
__device__ void dgrad(const float* __restrict__ dz, int in, int out, int models, const float* __restrict__ params,
                      u64 w_off, const float* __restrict__ zprev, float* __restrict__ dprev, const Step st) {
    __shared__ float ds[TILE][TILE + 1], ws[TILE][TILE + 1];
    const int k = blockIdx.z, tx = threadIdx.x, ty = threadIdx.y;
    int s;
    const int rows = model_rows(st, k, &s);
    const int r0 = blockIdx.y * TILE, i0 = blockIdx.x * TILE;
    if (r0 >= rows) return;
    const float* w = params + w_off + (u64)k * out * in;
    float acc = 0.f;
    for (int o0 = 0; o0 < out; o0 += TILE) {
        const int r = r0 + ty, od = o0 + tx, ow = o0 + ty, i = i0 + tx;
        ds[ty][tx] = (r < rows && od < out) ? dz[((u64)r * models + k) * out + od] : 0.f;
        ws[ty][tx] = (ow < out && i < in) ? w[(u64)ow * in + i] : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc = fmaf(ds[ty][kk], ws[kk][tx], acc);
        __syncthreads();
    }
    const int r = r0 + ty, i = i0 + tx;
    if (r < rows && i < in) {
        const u64 at = ((u64)r * models + k) * in + i;
        dprev[at] = acc * activation_grad<act>(zprev[at]);
    }
}

#define DGRAD(name, ACT)                                                                                            \
    extern "C" __global__ void name(const float* dz, int in, int out, int models, const float* params, u64 w_off,  \
                                    const float* zprev, float* dprev, const Step st) {                               \
        dgrad<ACT>(dz, in, out, models, params, w_off, zprev, dprev, st);                                            \
    }
DGRAD(many_dgrad_relu, 0)
DGRAD(many_dgrad_gelu, 1)

// ---- update ---------------------------------------------------------------------------------------------------
// The training state is tensor-major (fastnn/engine/many/gpu/layout.py): tensor t of every model in one block,
// model k's copy at starts[t] + k * sizes[t]; tensors whose bit is set in `skip` are left alone. Grid (x, K):
// blockIdx.y is the model, so its rows, optimizer, rate
// and step constants are read once per thread; the x blocks stride over each of its tensors (contiguous: coalesced).
extern "C" __global__ void many_update(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ s1,
                                       float* __restrict__ s2, const u64* __restrict__ starts,
                                       const u32* __restrict__ sizes, int tensors, u32 skip,
                                       const OptimParams* __restrict__ opt, const float* __restrict__ lr,
                                       int lr_stride, const u64* __restrict__ step0, const Step st) {
    const int k = blockIdx.y;
    int s;
    if (model_rows(st, k, &s) == 0) return;
    const OptimParams p = opt[k];
    const float rate = lr[(u64)k * lr_stride + st.step];
    const u64 t = step0[k] + (u64)st.step + 1;
    const bool adamw = p.kind == OPTIM_ADAMW;
    const OptimStep os = adamw ? optim_step<OPTIM_ADAMW>(p, rate, t) : optim_step<OPTIM_SGD>(p, rate, t);
    const int states = adamw ? 2 : optim_states<OPTIM_SGD>(p);
    for (int ti = 0; ti < tensors; ++ti) {
        if (skip >> ti & 1u) continue;  // updated elsewhere (the folded SGD of layer 0)
        const u64 base = starts[ti] + (u64)k * sizes[ti];
        const OptimParams pt = ti & 1 ? optim_bias(p) : p;  // the tensors alternate weight, bias (param_names' order)
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < sizes[ti]; j += (u64)gridDim.x * blockDim.x) {
            const u64 i = base + j;
            float wv = w[i], m = s1 ? s1[i] : 0.f, v = s2 ? s2[i] : 0.f;
            if (adamw) optim_update<OPTIM_ADAMW>(pt, os, 2, g[i], wv, m, v);
            else optim_update<OPTIM_SGD>(pt, os, states, g[i], wv, m, v);
            w[i] = wv;
            if (s1) s1[i] = m;
            if (s2) s2[i] = v;
        }
    }
}

// The same update four elements a thread an iteration (Tuning.many_update_kernel = "vec4"): many_update moves one
// element a thread an iteration, ~8 B of loads in flight a thread, ~12 KB an SM where Little's law asks ~20 KB (H100)
// to ~29 KB (H200) to keep HBM busy (docs/design/many-models.md, "Next kernels"). Where a model's copy of a tensor and
// every array are 16-B aligned (the layout starts each block at a multiple of 64 floats: a tensor whose size is a
// multiple of 4), w, g and the states move as float4; the rest (a bias of 10) as many_update does. Each element goes
// through optim_update as in many_update, so the state is many_update's bit for bit. Grid and arguments as
// many_update's. A variant until a device measurement makes it the default (fastnn/engine/tuning.py).
template <int K>
__device__ __forceinline__ void update4(const OptimParams& p, const OptimStep& os, int states, float4& w, float4 g,
                                        float4& m, float4& v) {
    optim_update<K>(p, os, states, g.x, w.x, m.x, v.x);
    optim_update<K>(p, os, states, g.y, w.y, m.y, v.y);
    optim_update<K>(p, os, states, g.z, w.z, m.z, v.z);
    optim_update<K>(p, os, states, g.w, w.w, m.w, v.w);
}

extern "C" __global__ void many_update_vec(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ s1,
                                           float* __restrict__ s2, const u64* __restrict__ starts,
                                           const u32* __restrict__ sizes, int tensors, u32 skip,
                                           const OptimParams* __restrict__ opt, const float* __restrict__ lr,
                                           int lr_stride, const u64* __restrict__ step0, const Step st) {
    const int k = blockIdx.y;
    int s;
    if (model_rows(st, k, &s) == 0) return;
    const OptimParams p = opt[k];
    const float rate = lr[(u64)k * lr_stride + st.step];
    const u64 t = step0[k] + (u64)st.step + 1;
    const bool adamw = p.kind == OPTIM_ADAMW;
    const OptimStep os = adamw ? optim_step<OPTIM_ADAMW>(p, rate, t) : optim_step<OPTIM_SGD>(p, rate, t);
    const int states = adamw ? 2 : optim_states<OPTIM_SGD>(p);
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    const bool aligned = (((unsigned long long)w | (unsigned long long)g | (unsigned long long)s1 |
                           (unsigned long long)s2) & 15) == 0;
    for (int ti = 0; ti < tensors; ++ti) {
        if (skip >> ti & 1u) continue;  // updated elsewhere (the folded SGD of layer 0)
        const u64 size = sizes[ti], base = starts[ti] + (u64)k * size;
        const u64 quads = aligned && ((base | size) & 3) == 0 ? size / 4 : 0;
        const OptimParams pt = ti & 1 ? optim_bias(p) : p;  // the tensors alternate weight, bias (param_names' order)
        for (u64 q = first; q < quads; q += stride) {
            const u64 i = base + 4 * q;
            float4 wv = *(const float4*)(w + i);
            const float4 gv = *(const float4*)(g + i);
            float4 m = s1 ? *(const float4*)(s1 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 v = s2 ? *(const float4*)(s2 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (adamw) update4<OPTIM_ADAMW>(pt, os, 2, wv, gv, m, v);
            else update4<OPTIM_SGD>(pt, os, states, wv, gv, m, v);
            *(float4*)(w + i) = wv;
            if (s1) *(float4*)(s1 + i) = m;
            if (s2) *(float4*)(s2 + i) = v;
        }
        for (u64 j = 4 * quads + first; j < size; j += stride) {  // what is not in float4s: as many_update
            const u64 i = base + j;
            float wv = w[i], m = s1 ? s1[i] : 0.f, v = s2 ? s2[i] : 0.f;
            if (adamw) optim_update<OPTIM_ADAMW>(pt, os, 2, g[i], wv, m, v);
            else optim_update<OPTIM_SGD>(pt, os, states, g[i], wv, m, v);
            w[i] = wv;
            if (s1) s1[i] = m;
            if (s2) s2[i] = v;
        }
    }
}

// ---- the state an epoch left ---------------------------------------------------------------------------------
// bad[k] |= 1: a parameter is not finite, or (half != 0) beyond float16's range; 2: an optimizer state is not
// finite; 4: a second moment (s2) is negative. Grid (x, K) as many_update. The host asks fastnn/_state.py about
// flagged models only.
extern "C" __global__ void many_check(const float* __restrict__ w, const float* __restrict__ s1,
                                      const float* __restrict__ s2, const u64* __restrict__ starts,
                                      const u32* __restrict__ sizes, int tensors, int half, u32* __restrict__ bad) {
    const int k = blockIdx.y;
    u32 flags = 0;
    for (int ti = 0; ti < tensors; ++ti) {
        const u64 base = starts[ti] + (u64)k * sizes[ti];
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < sizes[ti]; j += (u64)gridDim.x * blockDim.x) {
            const u64 i = base + j;
            if (!(fabsf(w[i]) <= (half ? 65504.f : 3.402823466e38f))) flags |= 1u;
            if (s1 && !(fabsf(s1[i]) <= 3.402823466e38f)) flags |= 2u;
            if (s2) {
                const float v = s2[i];
                if (!(fabsf(v) <= 3.402823466e38f)) flags |= 2u;
                if (v < 0.f) flags |= 4u;
            }
        }
    }
    if (flags) atomicOr(bad + k, flags);
}

// ---- folded SGD of layer 0 (engine.py's fold_sgd: plain SGD, every model, one stream) ---------------------------
// Layer 0's weights of model k are held as wscale[k] * V_k during an epoch. Plain SGD with L2,
// w' = (1 - lr wd) w - lr g, is then V' = V - (lr / wscale') g with wscale' = (1 - lr wd) wscale: the weight-
// gradient GEMM adds -(dZ')^T X into V in place (beta = 1), dZ' being dZ with model k's columns scaled by
// lr_k / wscale'_k, so the weights are read and written once a step and no gradient array is stored. The forward
// GEMM makes X V^T; many_scale_bias turns it into z = wscale X V^T + b. many_unscale folds wscale back into the
// weights at the epoch's end, so outside an epoch the state holds the weights themselves.

// z[r][k][o] = wscale[k] * z[r][k][o] + b0[k][o] for the rows of stream 0. Grid (ceil(K out / 256), batch), block 256.
extern "C" __global__ void many_scale_bias(float* __restrict__ z, const float* __restrict__ params, u64 b_off, int out,
                                           int models, const float* __restrict__ wscale, const Step st) {
    const int r = blockIdx.y;
    if (r >= stream_rows(st, 0)) return;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= models * out) return;
    const u64 at = (u64)r * models * out + j;
    z[at] = fmaf(wscale[j / out], z[at], params[b_off + j]);
}

// Per model (grid K, block 256): the bias gradient (dZ's column sums) and its SGD update with L2 (bias_decay), then
// dZ's columns scaled by lr / wscale' for the accumulating GEMM, and wscale' stored. A model that does not train has
// its dZ columns zeroed (they may hold anything: a diverged model's NaN), so the GEMM leaves its weights alone.
extern "C" __global__ void many_fold_sgd(float* __restrict__ dz, int out, int models, float* __restrict__ params,
                                         u64 b_off, float* __restrict__ wscale, const OptimParams* __restrict__ opt,
                                         const float* __restrict__ lr, int lr_stride, const Step st) {
    const int k = blockIdx.x;
    int s;
    const int rows = model_rows(st, k, &s);
    if (rows == 0) {
        for (int i = threadIdx.x; i < st.batch * out; i += blockDim.x)
            dz[((u64)(i / out) * models + k) * out + i % out] = 0.f;
        return;
    }
    const OptimParams p = opt[k];
    const float rate = lr[(u64)k * lr_stride + st.step];
    const OptimStep os = optim_step<OPTIM_SGD>(p, rate, 1);
    for (int o = threadIdx.x; o < out; o += blockDim.x) {
        float g = 0.f;
        for (int r = 0; r < rows; ++r) g += dz[((u64)r * models + k) * out + o];
        float b = params[b_off + (u64)k * out + o], m = 0.f, v = 0.f;
        optim_update<OPTIM_SGD>(optim_bias(p), os, 0, g, b, m, v);  // a bias: its decay is bias_decay
        params[b_off + (u64)k * out + o] = b;
    }
    __syncthreads();  // every column sum read dZ before it is scaled
    const float scale_new = wscale[k] * __fmaf_rn(-rate, p.weight_decay, 1.f);
    const float c = rate / scale_new;
    for (int i = threadIdx.x; i < rows * out; i += blockDim.x) dz[((u64)(i / out) * models + k) * out + i % out] *= c;
    if (threadIdx.x == 0) wscale[k] = scale_new;
}

// W0_k *= wscale[k] at the epoch's end (the host sets wscale back to 1 before the next). Grid (x, K), block 256.
extern "C" __global__ void many_unscale(float* __restrict__ params, u64 w_off, u64 size,
                                        const float* __restrict__ wscale) {
    const int k = blockIdx.y;
    const float sk = wscale[k];
    float* w = params + w_off + (u64)k * size;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < size; j += (u64)gridDim.x * blockDim.x) w[j] *= sk;
}
