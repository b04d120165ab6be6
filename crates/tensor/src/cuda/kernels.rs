//! CUDA C sources, compiled by NVRTC once per process and device (see `device.rs`).
//!
//! The sources include no headers: bf16 is a 16-bit struct converted with bit operations and the
//! sm_80+ `cvt.rn.bf16.f32` instruction, so kernels compile wherever `libnvrtc` loads, with no
//! CUDA toolkit include directory to find at run time.
//!
//! Every kernel computes in f32 and rounds once when it stores. Templates are instantiated for the
//! activation type `T` (f32, bf16) and, where an op takes a parameter tensor (norm weights, rows,
//! cos/sin), its type `W`, under `extern "C"` names `<op>_<t>[_<w>]` that `ops.rs` looks up.

/// Shared by every module: the bf16 type, conversions, reductions, instantiation helpers.
pub const COMMON: &str = r#"
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

struct __align__(2) bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(((unsigned int)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float v) {
    bf16_t r;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (unsigned short)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.bits = (unsigned short)(u >> 16);
    }
#endif
    return r;
}

// The elements of a 16-byte chunk as floats: 4 f32 or 8 bf16.
__device__ __forceinline__ void unpack(uint4 r, float* f, float) {
    f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y); f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w);
}
__device__ __forceinline__ void unpack(uint4 r, float* f, bf16_t) {
    unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { f[2 * i] = __uint_as_float(w[i] << 16); f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}

// Activation codes match `Activation` in ops.rs: 0 silu, 1 gelu (erf), 2 gelu (tanh), 3 relu.
__device__ __forceinline__ float activate(int act, float x) {
    switch (act) {
    case 0: return x / (1.f + expf(-x));
    case 1: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case 2: {
        float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.f + tanhf(inner));
    }
    default: return fmaxf(x, 0.f);
    }
}

// Programmatic dependent launch (sm_90+): kernels are launched allowed to start before the
// previous kernel in the stream has finished, so every kernel first waits for its predecessors
// to complete and their writes to be visible. Right after that wait it lets the next kernel
// launch, so that the next one's blocks are resident and waiting when this one ends; as each
// kernel triggers only once it runs, one grid at most waits ahead. Elsewhere both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread gets the total. blockDim.x must be a multiple of 32. The leading barrier lets a
// kernel call these back to back without a reader of the previous result racing the next write.
__device__ float block_sum(float v) {
    __shared__ float buf[32];
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? buf[threadIdx.x & 31] : 0.f;
    return warp_sum(v);
}
__device__ float block_max(float v) {
    __shared__ float buf[32];
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? buf[threadIdx.x & 31] : -INFINITY;
    return warp_max(v);
}

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define FOR_T(M) M(f32, float) M(bf16, bf16_t)
#define FOR_TW(M) M(f32, float, f32, float) M(f32, float, bf16, bf16_t) M(bf16, bf16_t, f32, float) M(bf16, bf16_t, bf16, bf16_t)

// torch.argmax order: NaN is the largest value; among equals the lowest index wins.
__device__ __forceinline__ bool better(float v, unsigned int i, float bv, unsigned int bi) {
    if (isnan(v)) return !isnan(bv) || i < bi;
    if (isnan(bv)) return false;
    return v > bv || (v == bv && i < bi);
}

// Thread 0 writes the block's best index to out_i[o] (and its value to out_v[o] when given).
__device__ void store_best(float bv, unsigned int bi, unsigned int* out_i, float* out_v = nullptr, size_t o = 0) {
    for (int k = 16; k > 0; k >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, k);
        unsigned int oi = __shfl_xor_sync(0xffffffffu, bi, k);
        if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    __shared__ float sv[32];
    __shared__ unsigned int si[32];
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = bv; si[threadIdx.x >> 5] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
        out_i[o] = bi;
        if (out_v) out_v[o] = bv;
    }
}
"#;

/// Elementwise maps, copies and gathers, rotary embeddings, KV-cache writes, argmax.
pub const ELEMENTWISE: &str = r#"
// op: 0 scale by a, 1 softcap a * tanh(x / a), 2 activation code `act`.
template <typename T>
__device__ void unary(const T* __restrict__ x, T* __restrict__ y, size_t n, int op, float a, int act) {
    GRID_STRIDE(i, n) {
        float v = to_f(x[i]);
        float r = op == 0 ? v * a : op == 1 ? tanhf(v / a) * a : activate(act, v);
        y[i] = from_f<T>(r);
    }
}

// op: 0 add, 1 mul, 2 activate(a) * b with activation code `act`.
template <typename T>
__device__ void binary(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, size_t n, int op, int act) {
    GRID_STRIDE(i, n) {
        float u = to_f(a[i]), v = to_f(b[i]);
        float r = op == 0 ? u + v : op == 1 ? u * v : activate(act, u) * v;
        y[i] = from_f<T>(r);
    }
}

template <typename S, typename D>
__device__ void cast(const S* __restrict__ x, D* __restrict__ y, size_t n) {
    GRID_STRIDE(i, n) y[i] = from_f<D>(to_f(x[i]));
}

template <typename T, typename W>
__device__ void mul_row(const T* __restrict__ x, const W* __restrict__ row, T* __restrict__ y, size_t n, int cols) {
    GRID_STRIDE(i, n) y[i] = from_f<T>(to_f(x[i]) * to_f(row[i % cols]));
}

// Fills every row of `y` with `row`: the bias that cuBLAS then accumulates onto (beta = 1).
template <typename T, typename W>
__device__ void broadcast_row(const W* __restrict__ row, T* __restrict__ y, size_t n, int cols) {
    GRID_STRIDE(i, n) y[i] = from_f<T>(to_f(row[i % cols]));
}

// One block per output row. The indices come from the host, so they are read before the wait;
// rows of whole 16-byte chunks are copied a chunk a thread, unrolled so that a thread's loads are
// in flight together (a decode step's embedding row is one block, bound by load latency).
template <typename T>
__device__ void gather_rows(const T* __restrict__ src, const unsigned int* __restrict__ idx, T* __restrict__ dst, int cols) {
    const size_t row = idx[blockIdx.x];
    pdl_wait();
    const T* s = src + row * cols;
    T* d = dst + (size_t)blockIdx.x * cols;
    if ((cols * sizeof(T)) % 16 == 0 && (((size_t)s | (size_t)d) & 15) == 0) {
        const int chunks = cols * sizeof(T) / 16;
#pragma unroll 4
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) ((uint4*)d)[c] = __ldg((const uint4*)s + c);
    } else {
#pragma unroll 4
        for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
    }
}

// dst[r, dst_off + c] = src[r, src_off + c] for c < len: narrow_cols and each part of concat_cols.
template <typename T>
__device__ void copy_cols(const T* __restrict__ src, int src_cols, int src_off, T* __restrict__ dst, int dst_cols,
                          int dst_off, int rows, int len) {
    GRID_STRIDE(i, (size_t)rows * len) {
        size_t r = i / len, c = i % len;
        dst[r * dst_cols + dst_off + c] = src[r * src_cols + src_off + c];
    }
}

// Element `col` of row `row` of x [rows, width] with the first 2 * half dims of each head rotated
// (the rest pass through).
template <typename T, typename W>
__device__ __forceinline__ T rotated(const T* __restrict__ x, size_t row, int width, int col, const W* __restrict__ cosv,
                                     const W* __restrict__ sinv, int head_dim, int half, int interleaved) {
    const size_t idx = row * width + col;
    const int c = col % head_dim;
    if (c >= 2 * half) return x[idx];
    int i, partner;
    float sign;
    if (!interleaved) {
        if (c < half) { i = c; partner = c + half; sign = -1.f; }
        else { i = c - half; partner = c - half; sign = 1.f; }
    } else {
        i = c >> 1;
        if (c & 1) { partner = c - 1; sign = 1.f; } else { partner = c + 1; sign = -1.f; }
    }
    float co = to_f(cosv[row * half + i]), si = to_f(sinv[row * half + i]);
    float xp = to_f(x[idx - c + partner]);
    return from_f<T>(to_f(x[idx]) * co + sign * (xp * si));
}

template <typename T, typename W>
__device__ void rope(const T* __restrict__ x, const W* __restrict__ cosv, const W* __restrict__ sinv, T* __restrict__ y,
                     int rows, int cols, int head_dim, int half, int interleaved) {
    GRID_STRIDE(e, (size_t)rows * cols) y[e] = rotated(x, e / cols, cols, (int)(e % cols), cosv, sinv, head_dim, half, interleaved);
}

// The attention input of a step in one launch: rotated queries into qo, and the rotated keys
// and the values straight into their cache slots (write_kv's layout; none for padding rows).
template <typename T, typename W>
__device__ void rope_write_kv(const T* __restrict__ q, T* __restrict__ qo, int qcols, const T* __restrict__ k,
                              const T* __restrict__ v, const unsigned int* __restrict__ slots, T* __restrict__ kc,
                              T* __restrict__ vc, int kcols, int vcols, const W* __restrict__ cosv,
                              const W* __restrict__ sinv, int rows, int head_dim, int half, int interleaved) {
    const int cols = qcols + kcols + vcols;
    GRID_STRIDE(e, (size_t)rows * cols) {
        const size_t row = e / cols;
        int col = (int)(e % cols);
        if (col < qcols) {
            qo[row * qcols + col] = rotated(q, row, qcols, col, cosv, sinv, head_dim, half, interleaved);
            continue;
        }
        const unsigned int slot = slots[row];
        if (slot == 0xffffffffu) continue;
        col -= qcols;
        if (col < kcols) kc[(size_t)slot * kcols + col] = rotated(k, row, kcols, col, cosv, sinv, head_dim, half, interleaved);
        else vc[(size_t)slot * vcols + col - kcols] = v[row * vcols + col - kcols];
    }
}

// out[i] = sum_j weights[i * per_row + j] * y[rows[i * per_row + j]], added in j order (the
// mixture-of-experts combine). One block per output row.
template <typename T>
__device__ void combine_rows(const T* __restrict__ y, const unsigned int* __restrict__ rows,
                             const float* __restrict__ weights, T* __restrict__ out, int cols, int per_row) {
    const size_t i = blockIdx.x;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float a = 0.f;
        for (int j = 0; j < per_row; ++j)
            a += weights[i * per_row + j] * to_f(y[(size_t)rows[i * per_row + j] * cols + c]);
        out[i * cols + c] = from_f<T>(a);
    }
}

// One block per token: copies its key and value rows into their cache slot (none for padding).
template <typename T>
__device__ void write_kv(const T* __restrict__ k, const T* __restrict__ v, const unsigned int* __restrict__ slots,
                         T* __restrict__ kc, T* __restrict__ vc, int kw, int vw) {
    if (slots[blockIdx.x] == 0xffffffffu) return;
    size_t slot = slots[blockIdx.x];
    const T* ks = k + (size_t)blockIdx.x * kw;
    const T* vs = v + (size_t)blockIdx.x * vw;
    for (int c = threadIdx.x; c < kw; c += blockDim.x) kc[slot * kw + c] = ks[c];
    for (int c = threadIdx.x; c < vw; c += blockDim.x) vc[slot * vw + c] = vs[c];
}

// Block (part, row) takes columns [part * per_part, (part + 1) * per_part) of its row: one block
// per row would leave a vocabulary-sized row (128k logits) to a single multiprocessor.
template <typename T>
__device__ void argmax_parts(const T* __restrict__ x, float* __restrict__ part_v, unsigned int* __restrict__ part_i,
                             int cols, int per_part) {
    const T* xr = x + (size_t)blockIdx.y * cols;
    const int hi = min(cols, (blockIdx.x + 1) * per_part);
    float bv = -INFINITY;
    unsigned int bi = 0xffffffffu;
    for (int c = blockIdx.x * per_part + threadIdx.x; c < hi; c += blockDim.x) {
        float v = to_f(xr[c]);
        if (better(v, c, bv, bi)) { bv = v; bi = c; }
    }
    store_best(bv, bi, part_i, part_v, (size_t)blockIdx.y * gridDim.x + blockIdx.x);
}

#define INST_T(TN, T)                                                                                              \
    extern "C" __global__ void unary_##TN(const T* x, T* y, size_t n, int op, float a, int act) { pdl_wait();      \
        unary<T>(x, y, n, op, a, act);                                                                             \
    }                                                                                                              \
    extern "C" __global__ void binary_##TN(const T* a, const T* b, T* y, size_t n, int op, int act) { pdl_wait();  \
        binary<T>(a, b, y, n, op, act);                                                                            \
    }                                                                                                              \
    extern "C" __global__ void gather_rows_##TN(const T* s, const unsigned int* idx, T* d, int cols) {             \
        gather_rows<T>(s, idx, d, cols);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void copy_cols_##TN(const T* s, int sc, int so, T* d, int dc, int dof, int rows, int len) {\
        pdl_wait();                                                                                                \
        copy_cols<T>(s, sc, so, d, dc, dof, rows, len);                                                            \
    }                                                                                                              \
    extern "C" __global__ void write_kv_##TN(const T* k, const T* v, const unsigned int* slots, T* kc, T* vc, int kw, \
                                             int vw) { pdl_wait();                                                 \
        write_kv<T>(k, v, slots, kc, vc, kw, vw);                                                                  \
    }                                                                                                              \
    extern "C" __global__ void argmax_parts_##TN(const T* x, float* pv, unsigned int* pi, int cols, int per_part) {\
        pdl_wait();                                                                                                \
        argmax_parts<T>(x, pv, pi, cols, per_part);                                                                \
    }                                                                                                              \
    extern "C" __global__ void combine_rows_##TN(const T* y, const unsigned int* rows, const float* w, T* out, int cols, \
                                                 int per_row) { pdl_wait();                                        \
        combine_rows<T>(y, rows, w, out, cols, per_row);                                                           \
    }
FOR_T(INST_T)

// One block per row over that row's `parts` best (value, index) pairs from argmax_parts.
extern "C" __global__ void argmax_merge(const float* part_v, const unsigned int* part_i, unsigned int* out, int parts) {
    pdl_wait();
    float bv = -INFINITY;
    unsigned int bi = 0xffffffffu;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) {
        size_t o = (size_t)blockIdx.x * parts + p;
        if (better(part_v[o], part_i[o], bv, bi)) { bv = part_v[o]; bi = part_i[o]; }
    }
    store_best(bv, bi, out, nullptr, blockIdx.x);
}

#define INST_TW(TN, T, WN, W)                                                                                      \
    extern "C" __global__ void cast_##WN##_##TN(const W* x, T* y, size_t n) { pdl_wait(); cast<W, T>(x, y, n); }   \
    extern "C" __global__ void mul_row_##TN##_##WN(const T* x, const W* row, T* y, size_t n, int cols) {           \
        pdl_wait();                                                                                                \
        mul_row<T, W>(x, row, y, n, cols);                                                                         \
    }                                                                                                              \
    extern "C" __global__ void broadcast_row_##TN##_##WN(const W* row, T* y, size_t n, int cols) { pdl_wait();     \
        broadcast_row<T, W>(row, y, n, cols);                                                                      \
    }                                                                                                              \
    extern "C" __global__ void rope_##TN##_##WN(const T* x, const W* c, const W* s, T* y, int rows, int cols, int hd, \
                                                int half, int il) { pdl_wait();                                    \
        rope<T, W>(x, c, s, y, rows, cols, hd, half, il);                                                          \
    }                                                                                                              \
    extern "C" __global__ void rope_write_kv_##TN##_##WN(const T* q, T* qo, int qcols, const T* k, const T* v,     \
                                                         const unsigned int* slots, T* kc, T* vc, int kcols,       \
                                                         int vcols, const W* c, const W* s, int rows, int hd,      \
                                                         int half, int il) { pdl_wait();                           \
        rope_write_kv<T, W>(q, qo, qcols, k, v, slots, kc, vc, kcols, vcols, c, s, rows, hd, half, il);            \
    }
FOR_TW(INST_TW)
"#;

/// `y[m, n] (+)= x[m, k] w[n, k]^T` in bf16 for decode-sized m (1 to `GEMV_MAX_ROWS`): one warp
/// per output column streams its weight row in 16-byte loads, four in flight per lane and
/// allocated past L1 so that the x rows, read for every weight row, stay there.
///
/// Two fused forms save launches at decode, where a step is hundreds of short kernels:
/// `gemv3` computes up to three products of the same x (q/k/v) in one grid, and `gemv_gated`
/// computes `act(x wg^T) * (x wu^T)` with each warp streaming its gate and up rows together.
/// Every output is summed in the same order as by `gemv_bf16` and rounded to bf16 where the
/// unfused ops would round it, so the fused and unfused paths give the same bits.
pub const GEMV: &str = r#"
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    float af[8], bf[8];
    unpack(a, af, bf16_t());
    unpack(b, bf, bf16_t());
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) s += af[e] * bf[e];
    return s;
}

// acc[r][i] = this lane's part of x[i] . w_r for R weight rows of k = 8 * chunks elements; the
// rows' loads are issued together and share each x load.
template <int M, int R>
__device__ __forceinline__ void gemv_dots(const bf16_t* __restrict__ x, const uint4* const* wr, int chunks, int lane,
                                          float (&acc)[R][M]) {
    const uint4* xr = (const uint4*)x;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) acc[r][i] = 0.f;
    int c = lane;
    // The first group of weight loads is issued before waiting on the previous kernel (weights
    // are no kernel's output), so that their latency overlaps its end.
    uint4 wv[R][4];
    if (c + 96 < chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < 4; ++u) wv[r][u] = ld_stream(wr[r] + c + 32 * u);
    }
    pdl_wait();
    for (; c + 96 < chunks; c += 128) {
        if (c != lane) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < 4; ++u) wv[r][u] = ld_stream(wr[r] + c + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int i = 0; i < M; ++i) {
                uint4 xv = __ldg(xr + (size_t)i * chunks + c + 32 * u);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][i] += dot8(wv[r][u], xv);
            }
    }
    for (; c < chunks; c += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = ld_stream(wr[r] + c);
#pragma unroll
        for (int i = 0; i < M; ++i) {
            uint4 xv = __ldg(xr + (size_t)i * chunks + c);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][i] += dot8(wv[r], xv);
        }
    }
}

// Column `col` of y[m, n]: the warp's sums, plus y's old value where it holds a bias.
template <int M>
__device__ __forceinline__ void gemv_store(float (&acc)[M], bf16_t* __restrict__ y, int n, int col, int accumulate,
                                           int lane) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
        float v = warp_sum(acc[i]);
        if (lane == 0) {
            size_t o = (size_t)i * n + col;
            if (accumulate) v += to_f(y[o]);
            y[o] = from_f<bf16_t>(v);
        }
    }
}

// Column `col` of one product y[m, n] (+)= x w^T: this warp's whole share of the work.
template <int M>
__device__ __forceinline__ void gemv_column(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                            bf16_t* __restrict__ y, int n, int k, int col, int accumulate, int lane) {
    const uint4* wr[1] = {(const uint4*)(w + (size_t)col * k)};
    float acc[1][M];
    gemv_dots<M, 1>(x, wr, k / 8, lane, acc);
    gemv_store<M>(acc[0], y, n, col, accumulate, lane);
}

template <int M>
__device__ void gemv_bf16(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y, int n,
                          int k, int accumulate) {
    const int col = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (col < n) {
        gemv_column<M>(x, w, y, n, k, col, accumulate, threadIdx.x & 31);
    } else {
        pdl_wait();
    }
}

// The grid covers n0 + n1 + n2 columns; a product with n = 0 is absent.
template <int M>
__device__ void gemv3_bf16(const bf16_t* __restrict__ x, int k, const bf16_t* w0, bf16_t* y0, int n0, int a0,
                           const bf16_t* w1, bf16_t* y1, int n1, int a1, const bf16_t* w2, bf16_t* y2, int n2, int a2) {
    int col = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const bf16_t* w = w0;
    bf16_t* y = y0;
    int n = n0, a = a0;
    if (col >= n0) {
        col -= n0;
        w = w1; y = y1; n = n1; a = a1;
        if (col >= n1) {
            col -= n1;
            w = w2; y = y2; n = n2; a = a2;
            if (col >= n2) {
                pdl_wait();
                return;
            }
        }
    }
    gemv_column<M>(x, w, y, n, k, col, a, threadIdx.x & 31);
}

template <int M>
__device__ void gemv_gated_bf16(const bf16_t* __restrict__ x, const bf16_t* __restrict__ wg,
                                const bf16_t* __restrict__ wu, bf16_t* __restrict__ y, int n, int k, int act) {
    const int col = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (col >= n) {
        pdl_wait();
        return;
    }
    const uint4* wr[2] = {(const uint4*)(wg + (size_t)col * k), (const uint4*)(wu + (size_t)col * k)};
    float acc[2][M];
    gemv_dots<M, 2>(x, wr, k / 8, lane, acc);
#pragma unroll
    for (int i = 0; i < M; ++i) {
        float g = to_f(from_f<bf16_t>(warp_sum(acc[0][i])));
        float u = to_f(from_f<bf16_t>(warp_sum(acc[1][i])));
        if (lane == 0) y[(size_t)i * n + col] = from_f<bf16_t>(activate(act, g) * u);
    }
}

#define INST_GEMV(M)                                                                                               \
    extern "C" __global__ void gemv_bf16_m##M(const bf16_t* x, const bf16_t* w, bf16_t* y, int n, int k, int acc) { \
        gemv_bf16<M>(x, w, y, n, k, acc);                                                                          \
    }                                                                                                              \
    extern "C" __global__ void gemv3_bf16_m##M(const bf16_t* x, int k, const bf16_t* w0, bf16_t* y0, int n0, int a0, \
                                               const bf16_t* w1, bf16_t* y1, int n1, int a1, const bf16_t* w2,     \
                                               bf16_t* y2, int n2, int a2) {                                       \
        gemv3_bf16<M>(x, k, w0, y0, n0, a0, w1, y1, n1, a1, w2, y2, n2, a2);                                       \
    }                                                                                                              \
    extern "C" __global__ void gemv_gated_bf16_m##M(const bf16_t* x, const bf16_t* wg, const bf16_t* wu, bf16_t* y, \
                                                    int n, int k, int act) {                                       \
        gemv_gated_bf16<M>(x, wg, wu, y, n, k, act);                                                               \
    }
INST_GEMV(1) INST_GEMV(2) INST_GEMV(3) INST_GEMV(4)
"#;

/// Row-wise reductions: RMSNorm (plain and fused with the residual add), LayerNorm, softmax.
/// One block per row. The RMSNorm loops are unrolled so that a thread's loads are in flight
/// together: at decode a norm is one or a few blocks, bound by memory latency, not bandwidth.
pub const NORM: &str = r#"
template <typename T, typename W>
__device__ void rms_norm(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y, int cols, float eps,
                         float offset) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = to_f(xr[c]); s += v * v; }
    s = block_sum(s);
    float inv = 1.f / sqrtf(s / cols + eps);
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_f<T>(to_f(xr[c]) * inv * (to_f(w[c]) + offset));
}

// The residual stream is rounded to T before it is normalised, as a model running in T would
// store it; each thread re-reads only the elements it wrote itself.
template <typename T, typename W>
__device__ void add_rms_norm(const T* __restrict__ x, const T* __restrict__ res, const W* __restrict__ w,
                             T* __restrict__ y, T* __restrict__ res_out, int cols, float eps, float offset) {
    size_t base = (size_t)blockIdx.x * cols;
    float s = 0.f;
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        T h = from_f<T>(to_f(x[base + c]) + to_f(res[base + c]));
        res_out[base + c] = h;
        float v = to_f(h);
        s += v * v;
    }
    s = block_sum(s);
    float inv = 1.f / sqrtf(s / cols + eps);
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[base + c] = from_f<T>(to_f(res_out[base + c]) * inv * (to_f(w[c]) + offset));
}

// bf16 rows of up to 8 * blockDim.x elements, cols a multiple of 8: each thread holds one
// 16-byte chunk in registers, so the row is read once, in one round of loads, and the weights
// load while the block reduces. With `res` the residual add of add_rms_norm comes first.
template <typename W>
__device__ void rms_norm_vec8(const bf16_t* __restrict__ x, const bf16_t* __restrict__ res, const W* __restrict__ w,
                              bf16_t* __restrict__ y, bf16_t* __restrict__ res_out, int cols, float eps, float offset) {
    const size_t base = (size_t)blockIdx.x * cols;
    const int c0 = threadIdx.x * 8;
    const bool mine = c0 < cols;
    float h[8], wf[8];
    float s = 0.f;
    if (mine) {
        unpack(*(const uint4*)(x + base + c0), h, bf16_t());
        if (res) {
            float r[8];
            unpack(*(const uint4*)(res + base + c0), r, bf16_t());
            unsigned short out[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                bf16_t b = from_f<bf16_t>(h[e] + r[e]);
                out[e] = b.bits;
                h[e] = to_f(b);
            }
            *(uint4*)(res_out + base + c0) = *(const uint4*)out;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) { wf[e] = to_f(w[c0 + e]) + offset; s += h[e] * h[e]; }
    }
    s = block_sum(s);
    const float inv = 1.f / sqrtf(s / cols + eps);
    if (mine) {
        unsigned short out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = from_f<bf16_t>(h[e] * inv * wf[e]).bits;
        *(uint4*)(y + base + c0) = *(const uint4*)out;
    }
}

// w and b may be null.
template <typename T, typename W>
__device__ void layer_norm(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b, T* __restrict__ y,
                           int cols, float eps) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_f(xr[c]);
    float mean = block_sum(s) / cols;
    float q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float d = to_f(xr[c]) - mean; q += d * d; }
    float inv = 1.f / sqrtf(block_sum(q) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = (to_f(xr[c]) - mean) * inv;
        if (w) v *= to_f(w[c]);
        if (b) v += to_f(b[c]);
        yr[c] = from_f<T>(v);
    }
}

template <typename T>
__device__ void softmax(const T* __restrict__ x, T* __restrict__ y, int cols) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f(xr[c]));
    m = block_max(m);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(to_f(xr[c]) - m);
    float inv = 1.f / block_sum(s);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_f<T>(expf(to_f(xr[c]) - m) * inv);
}

#define INST_T(TN, T) \
    extern "C" __global__ void softmax_##TN(const T* x, T* y, int cols) { pdl_wait(); softmax<T>(x, y, cols); }
FOR_T(INST_T)

#define INST_TW(TN, T, WN, W)                                                                                      \
    extern "C" __global__ void rms_norm_##TN##_##WN(const T* x, const W* w, T* y, int cols, float eps, float off) {\
        pdl_wait();                                                                                                \
        rms_norm<T, W>(x, w, y, cols, eps, off);                                                                   \
    }                                                                                                              \
    extern "C" __global__ void add_rms_norm_##TN##_##WN(const T* x, const T* r, const W* w, T* y, T* ro, int cols, \
                                                        float eps, float off) { pdl_wait();                        \
        add_rms_norm<T, W>(x, r, w, y, ro, cols, eps, off);                                                        \
    }                                                                                                              \
    extern "C" __global__ void layer_norm_##TN##_##WN(const T* x, const W* w, const W* b, T* y, int cols, float eps) {\
        pdl_wait();                                                                                                \
        layer_norm<T, W>(x, w, b, y, cols, eps);                                                                   \
    }
FOR_TW(INST_TW)

#define INST_VEC8(WN, W)                                                                                           \
    extern "C" __global__ void rms_norm_vec8_bf16_##WN(const bf16_t* x, const bf16_t* r, const W* w, bf16_t* y,    \
                                                       bf16_t* ro, int cols, float eps, float off) { pdl_wait();   \
        rms_norm_vec8<W>(x, r, w, y, ro, cols, eps, off);                                                          \
    }
INST_VEC8(f32, float) INST_VEC8(bf16, bf16_t)
"#;

/// Paged attention over block tables for a flattened batch of prefill chunks and decode tokens.
///
/// `paged_attn` serves rows of multi-token chunks (prefill). A work item is up to 16 query
/// vectors (rows x heads of one sequence, all reading one KV head) that share every key/value
/// tile the block stages in shared memory. Tiles hold 32 keys, one per lane when scoring; each
/// of the 4 warps owns up to 4 query vectors and keeps an online softmax for them. It runs on
/// CUDA cores (no tensor-core MMA yet).
///
/// `paged_decode` serves single-token rows (decode), which are bound by reading the cache: a
/// block takes one row, up to 8 query heads of one KV group and a range of keys, and walks it 128
/// keys at a time: every thread scores one key (the whole K row in 16-byte loads, eight in
/// flight), the block takes the softmax statistics of the 128 scores, then each warp accumulates
/// a quarter of the V rows (lanes across the head dimension, coalesced).
///
/// When a batch has too few work items to fill the GPU, both split the key range across blocks
/// (flash-decoding) and `attn_combine` merges the partial results, except where the decode
/// kernel has a few splits: then the last block of each work item to finish merges them.
pub const ATTENTION: &str = r#"
#define QV_MAX 16
#define TILE 32
#define NWARPS 4
#define QPW 4
#define DV_REGS 8
#define DEC_SUB 128
#define DEC_WARPS 4
#define DEC_UNROLL 8

// Mirror `AttnItem` and `DecodeItem` in attention.rs.
struct AttnItem { int row0, nrows, pos0, h0, nheads, bt_off, k_lo, k_hi, local0; };
struct DecodeItem { int row, local, h0, nheads, bt_off, k_lo, k_hi, pad; };

__device__ __forceinline__ float2 load2(const float* p) { return make_float2(p[0], p[1]); }
__device__ __forceinline__ float2 load2(const bf16_t* p) {
    unsigned int u = *(const unsigned int*)p;
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Stages TILE rows of `width` elements (row j from `src + slot[j] * stride`) into `dst` with row
// pitch `pitch`; rows without a key are zero so that p = 0 never meets a NaN.
template <typename T>
__device__ __forceinline__ void load_tile(T* dst, int pitch, const T* __restrict__ src, size_t stride, const int* slot,
                                          int width, int vec) {
    if (vec) {
        constexpr int CH = 16 / sizeof(T);
        const int cpr = width / CH;
        for (int e = threadIdx.x; e < TILE * cpr; e += blockDim.x) {
            int j = e / cpr, c = (e % cpr) * CH;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (slot[j] >= 0) val = __ldg((const uint4*)(src + (size_t)slot[j] * stride + c));
            unsigned int* d = (unsigned int*)(dst + j * pitch + c);
            d[0] = val.x; d[1] = val.y; d[2] = val.z; d[3] = val.w;
        }
    } else {
        for (int e = threadIdx.x; e < TILE * width; e += blockDim.x) {
            int j = e / width, c = e % width;
            dst[j * pitch + c] = slot[j] >= 0 ? src[(size_t)slot[j] * stride + c] : from_f<T>(0.f);
        }
    }
}

// Writes one query vector's result: directly when the keys were not split, else as a partial
// (unnormalised accumulator, running max, sum) at index `ph` for the merge of the splits.
__device__ __forceinline__ void store_partial(float* part_acc, float* part_ml, size_t ph, int c, float a, int dv,
                                              float m, float l, bool write_ml) {
    if (c < dv) part_acc[ph * dv + c] = a;
    if (write_ml) { part_ml[ph * 2] = m; part_ml[ph * 2 + 1] = l; }
}

template <typename T>
__device__ void paged_attn(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                           const unsigned int* __restrict__ tables, const AttnItem* __restrict__ items,
                           T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                           int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size, float scale,
                           float softcap, int window, int causal, int splits, int n_rows, int kpitch, int vpitch,
                           int vec) {
    extern __shared__ float smem[];
    float* q_s = smem;                                    // [QV_MAX][d]
    float* p_s = q_s + QV_MAX * d;                        // [NWARPS][QPW][TILE]
    int* slot_s = (int*)(p_s + NWARPS * QPW * TILE);      // [TILE]
    T* k_s = (T*)(slot_s + TILE);                         // [TILE][kpitch]
    T* v_s = k_s + TILE * kpitch;                         // [TILE][vpitch]

    const AttnItem it = items[blockIdx.x];
    const int split = blockIdx.y;
    const int g = it.h0 / (hq / hkv);
    const int nqv = it.nrows * it.nheads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nu = nqv > warp ? min(QPW, (nqv - warp + NWARPS - 1) / NWARPS) : 0;

    const int len = it.k_hi - it.k_lo;
    const int chunk = ((len + splits - 1) / splits + TILE - 1) / TILE * TILE;
    const int kbeg = it.k_lo + split * chunk;
    const int kend = min(kbeg + chunk, it.k_hi);

    for (int e = threadIdx.x; e < nqv * d; e += blockDim.x) {
        int qv = e / d, c = e % d;
        int r = qv / it.nheads, h = it.h0 + qv % it.nheads;
        q_s[e] = to_f(q[((size_t)(it.row0 + r) * hq + h) * d + c]);
    }

    float m_[QPW], l_[QPW], acc[QPW][DV_REGS];
    int pos[QPW];
#pragma unroll
    for (int u = 0; u < QPW; ++u) {
        m_[u] = -INFINITY;
        l_[u] = 0.f;
        pos[u] = it.pos0 + (warp + NWARPS * u) / it.nheads;
#pragma unroll
        for (int i = 0; i < DV_REGS; ++i) acc[u][i] = 0.f;
    }
    const size_t kstride = (size_t)hkv * k_dim, vstride = (size_t)hkv * v_dim;
    const T* kbase = kc + (size_t)g * k_dim;
    const T* vbase = vc + (size_t)g * v_dim;

    for (int t0 = kbeg; t0 < kend; t0 += TILE) {
        __syncthreads();  // the previous tile's readers are done (and q_s is written, the first time)
        if (threadIdx.x < TILE) {
            int kp = t0 + threadIdx.x;
            slot_s[threadIdx.x] = kp < kend ? (int)(tables[it.bt_off + kp / block_size] * block_size + kp % block_size) : -1;
        }
        __syncthreads();
        load_tile<T>(k_s, kpitch, kbase, kstride, slot_s, d, vec);
        load_tile<T>(v_s, vpitch, vbase, vstride, slot_s, dv, vec);
        __syncthreads();
        if (nu == 0) continue;

        float s[QPW];
#pragma unroll
        for (int u = 0; u < QPW; ++u) s[u] = 0.f;
        const T* kr = k_s + lane * kpitch;
        for (int c = 0; c < d; c += 2) {
            float2 kv = load2(kr + c);
#pragma unroll
            for (int u = 0; u < QPW; ++u) {
                if (u < nu) {
                    const float* qr = q_s + (warp + NWARPS * u) * d + c;
                    s[u] += qr[0] * kv.x + qr[1] * kv.y;
                }
            }
        }
        const int kp = t0 + lane;
#pragma unroll
        for (int u = 0; u < QPW; ++u) {
            if (u < nu) {
                float x = s[u] * scale;
                if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
                bool valid = kp < kend && (!causal || (kp <= pos[u] && (window == 0 || kp > pos[u] - window)));
                x = valid ? x : -INFINITY;
                float m_new = fmaxf(m_[u], warp_max(x));
                float p = m_new == -INFINITY ? 0.f : expf(x - m_new);
                float corr = m_[u] == -INFINITY ? 0.f : expf(m_[u] - m_new);
                l_[u] = l_[u] * corr + warp_sum(p);
                m_[u] = m_new;
#pragma unroll
                for (int i = 0; i < DV_REGS; ++i) acc[u][i] *= corr;
                p_s[(warp * QPW + u) * TILE + lane] = p;
            }
        }
        __syncwarp();
        for (int j = 0; j < TILE; ++j) {
            const T* vr = v_s + j * vpitch;
#pragma unroll
            for (int i = 0; i < DV_REGS; ++i) {
                int c = lane + 32 * i;
                if (c < dv) {
                    float vv = to_f(vr[c]);
#pragma unroll
                    for (int u = 0; u < QPW; ++u)
                        if (u < nu) acc[u][i] += p_s[(warp * QPW + u) * TILE + j] * vv;
                }
            }
        }
        __syncwarp();
    }

#pragma unroll
    for (int u = 0; u < QPW; ++u) {
        if (u >= nu) break;
        int qv = warp + NWARPS * u;
        int row = it.row0 + qv / it.nheads, h = it.h0 + qv % it.nheads;
        size_t oh = (size_t)row * hq + h;
        float inv = l_[u] > 0.f ? 1.f / l_[u] : 0.f;
#pragma unroll
        for (int i = 0; i < DV_REGS; ++i) {
            int c = lane + 32 * i;
            if (splits == 1) {
                if (c < dv) out[oh * dv + c] = from_f<T>(acc[u][i] * inv);
            } else {
                size_t ph = ((size_t)split * n_rows + it.local0 + qv / it.nheads) * hq + h;
                store_partial(part_acc, part_ml, ph, c, acc[u][i], dv, m_[u], l_[u], lane == 0 && i == 0);
            }
        }
    }
}

__device__ __forceinline__ int decode_slot(const unsigned int* __restrict__ tables, int bt_off, int kp, int block_size) {
    return (int)(tables[bt_off + kp / block_size] * block_size + kp % block_size);
}

template <typename T, int HM, int DVR>
__device__ void paged_decode(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                             const unsigned int* __restrict__ tables, const DecodeItem* __restrict__ items,
                             T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml, int hq,
                             int hkv, int d, int dv, int k_dim, int v_dim, int block_size, float scale, float softcap,
                             int splits, int n_rows, int vec, unsigned int* __restrict__ done) {
    extern __shared__ float smem[];
    float* q_s = smem;                             // [HM][d]
    float* s_s = q_s + HM * d;               // [HM][DEC_SUB]: scores, then probabilities
    float* m_s = s_s + HM * DEC_SUB;         // [HM] running max
    float* l_s = m_s + HM;                   // [HM] running sum
    float* corr_s = l_s + HM;                // [HM] rescale of the accumulators this round
    int* slot_s = (int*)(corr_s + HM);       // [DEC_SUB]
    float* red_s = (float*)(slot_s + DEC_SUB);     // [DEC_WARPS][HM][dv]

    const DecodeItem it = items[blockIdx.x];
    const int split = blockIdx.y;
    const int g = it.h0 / (hq / hkv);
    const int H = it.nheads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int len = it.k_hi - it.k_lo;
    const int chunk = (len + splits - 1) / splits;
    const int kbeg = it.k_lo + split * chunk;
    const int kend = min(kbeg + chunk, it.k_hi);
    // The work item and the block tables come from the host, not from the kernel before: the
    // first round's slots are looked up before the wait, off the critical path.
    const int slot0 = kbeg + tid < kend ? decode_slot(tables, it.bt_off, kbeg + tid, block_size) : -1;
    pdl_wait();

    for (int e = tid; e < H * d; e += blockDim.x) q_s[e] = to_f(q[((size_t)it.row * hq + it.h0) * d + e]);
    if (tid < HM) { m_s[tid] = -INFINITY; l_s[tid] = 0.f; }

    float acc[HM][DVR];
#pragma unroll
    for (int h = 0; h < HM; ++h)
#pragma unroll
        for (int i = 0; i < DVR; ++i) acc[h][i] = 0.f;
    const size_t kstride = (size_t)hkv * k_dim, vstride = (size_t)hkv * v_dim;
    const T* kbase = kc + (size_t)g * k_dim;
    const T* vbase = vc + (size_t)g * v_dim;
    __syncthreads();

    for (int s0 = kbeg; s0 < kend; s0 += DEC_SUB) {
        // Scores: one key per thread.
        const int kp = s0 + tid;
        float sc[HM];
#pragma unroll
        for (int h = 0; h < HM; ++h) sc[h] = 0.f;
        int slot = -1;
        if (kp < kend) {
            slot = s0 == kbeg ? slot0 : decode_slot(tables, it.bt_off, kp, block_size);
            const T* kr = kbase + (size_t)slot * kstride;
            if (vec) {
                constexpr int CH = 16 / sizeof(T);
                for (int c0 = 0; c0 < d; c0 += DEC_UNROLL * CH) {
                    uint4 raw[DEC_UNROLL];
#pragma unroll
                    for (int u = 0; u < DEC_UNROLL; ++u)
                        raw[u] = c0 + u * CH < d ? __ldg((const uint4*)(kr + c0 + u * CH)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                    for (int u = 0; u < DEC_UNROLL; ++u) {
                        if (c0 + u * CH < d) {
                            float kf[CH];
                            unpack(raw[u], kf, T());
#pragma unroll
                            for (int h = 0; h < HM; ++h) {
                                if (h < H) {
                                    const float* qr = q_s + h * d + c0 + u * CH;
#pragma unroll
                                    for (int e = 0; e < CH; ++e) sc[h] += qr[e] * kf[e];
                                }
                            }
                        }
                    }
                }
            } else {
                for (int c = 0; c < d; ++c) {
                    float kf = to_f(kr[c]);
#pragma unroll
                    for (int h = 0; h < HM; ++h)
                        if (h < H) sc[h] += q_s[h * d + c] * kf;
                }
            }
        }
        slot_s[tid] = slot;
#pragma unroll
        for (int h = 0; h < HM; ++h) {
            if (h < H) {
                float x = sc[h] * scale;
                if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
                s_s[h * DEC_SUB + tid] = kp < kend ? x : -INFINITY;
            }
        }
        __syncthreads();
        // Softmax statistics of this round: warp w owns heads w, w + 4.
        for (int h = warp; h < H; h += DEC_WARPS) {
            float v[DEC_SUB / 32];
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < DEC_SUB / 32; ++i) { v[i] = s_s[h * DEC_SUB + lane + 32 * i]; mx = fmaxf(mx, v[i]); }
            const float m_old = m_s[h];
            const float m_new = fmaxf(m_old, warp_max(mx));  // finite: the round has a valid key
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < DEC_SUB / 32; ++i) {
                float p = expf(v[i] - m_new);
                s_s[h * DEC_SUB + lane + 32 * i] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float corr = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
                m_s[h] = m_new;
                l_s[h] = l_s[h] * corr + sum;
                corr_s[h] = corr;
            }
        }
        __syncthreads();
        // Values: warp w takes keys w, w + 4, ... of the round; lanes across the head dimension.
#pragma unroll
        for (int h = 0; h < HM; ++h) {
            if (h < H) {
                const float cr = corr_s[h];
#pragma unroll
                for (int i = 0; i < DVR; ++i) acc[h][i] *= cr;
            }
        }
        const int nk = min(DEC_SUB, kend - s0);
#pragma unroll 8
        for (int j = warp; j < nk; j += DEC_WARPS) {
            const T* vr = vbase + (size_t)slot_s[j] * vstride;
            float vv[DVR];
#pragma unroll
            for (int i = 0; i < DVR; ++i) vv[i] = lane + 32 * i < dv ? to_f(vr[lane + 32 * i]) : 0.f;
#pragma unroll
            for (int h = 0; h < HM; ++h) {
                if (h < H) {
                    const float p = s_s[h * DEC_SUB + j];
#pragma unroll
                    for (int i = 0; i < DVR; ++i) acc[h][i] += p * vv[i];
                }
            }
        }
        __syncthreads();  // s_s and slot_s are rewritten by the next round
    }

#pragma unroll
    for (int h = 0; h < HM; ++h) {
        if (h < H) {
#pragma unroll
            for (int i = 0; i < DVR; ++i)
                if (lane + 32 * i < dv) red_s[(warp * HM + h) * dv + lane + 32 * i] = acc[h][i];
        }
    }
    __syncthreads();
    for (int e = tid; e < H * dv; e += blockDim.x) {
        const int h = e / dv, c = e % dv;
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) a += red_s[(w * HM + h) * dv + c];
        if (splits == 1) {
            out[((size_t)it.row * hq + it.h0 + h) * dv + c] = from_f<T>(a / l_s[h]);
        } else {
            store_partial(part_acc, part_ml, ((size_t)split * n_rows + it.local) * hq + it.h0 + h, c, a, dv, m_s[h],
                          l_s[h], c == 0);
        }
    }
    if (done == nullptr) return;  // not split, or merged by attn_combine

    // The item's last block to finish merges the splits (the threadfence-reduction pattern): a
    // separate merge kernel would wait for the whole grid to drain and pay its own launch, which
    // at one sequence cost as much as the decode kernel's key reads.
    __shared__ unsigned int ticket;
    __threadfence();
    __syncthreads();
    if (tid == 0) ticket = atomicAdd(&done[blockIdx.x], 1u);
    __syncthreads();
    if (ticket != (unsigned int)splits - 1) return;
    __threadfence();
    if (tid == 0) done[blockIdx.x] = 0u;  // zero again for the next launch (graph replays reuse it)
    // The first `live` splits hold keys; the rest (a capture-sized split count) are empty.
    const int live = len > 0 ? (len + chunk - 1) / chunk : 0;
    float* w_s = red_s + DEC_WARPS * HM * dv;  // [HM][splits] exp(m_s - m)
    const size_t per_split = (size_t)n_rows * hq;
    const size_t ph0 = (size_t)it.local * hq + it.h0;
    for (int h = warp; h < H; h += DEC_WARPS) {
        float m = -INFINITY;
        for (int s = lane; s < live; s += 32) m = fmaxf(m, __ldcg(part_ml + (s * per_split + ph0 + h) * 2));
        m = warp_max(m);
        float l = 0.f;
        for (int s = lane; s < live; s += 32) {
            const float ms = __ldcg(part_ml + (s * per_split + ph0 + h) * 2);
            const float e = expf(ms - m);
            w_s[h * splits + s] = e;
            l += __ldcg(part_ml + (s * per_split + ph0 + h) * 2 + 1) * e;
        }
        l = warp_sum(l);
        if (lane == 0) l_s[h] = l > 0.f ? 1.f / l : 0.f;
    }
    __syncthreads();
    T* o = out + ((size_t)it.row * hq + it.h0) * dv;
    if (dv % 4 == 0) {
        // Four channels a thread in 16-byte loads, sixteen splits in flight.
        for (int e = tid * 4; e < H * dv; e += blockDim.x * 4) {
            const int h = e / dv;
            const float* w = w_s + h * splits;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
            for (int s = 0; s < live; ++s) {
                const float4 v = __ldcg((const float4*)(part_acc + (s * per_split + ph0) * dv + e));
                a.x += v.x * w[s]; a.y += v.y * w[s]; a.z += v.z * w[s]; a.w += v.w * w[s];
            }
            const float inv = l_s[h];
            o[e] = from_f<T>(a.x * inv); o[e + 1] = from_f<T>(a.y * inv);
            o[e + 2] = from_f<T>(a.z * inv); o[e + 3] = from_f<T>(a.w * inv);
        }
    } else {
        for (int e = tid; e < H * dv; e += blockDim.x) {
            const int h = e / dv;
            float a = 0.f;
#pragma unroll 8
            for (int s = 0; s < live; ++s) a += __ldcg(part_acc + (s * per_split + ph0) * dv + e) * w_s[h * splits + s];
            o[e] = from_f<T>(a * l_s[h]);
        }
    }
}

// Tensor-core prefill (bf16, head dims D and DV multiples of 16 and 8): the work item of
// `paged_attn` (16 query vectors of one KV head) as the M = 16 side of `mma.m16n8k16`. Each of
// the 4 warps takes 16 keys of every 64-key tile and keeps its own online softmax (scores, row
// statistics and the output accumulator stay in the MMA fragments' registers; a thread holds
// rows g and g + 8 of its fragments, g = lane / 4); the warps' states merge at the end as split
// partials do. Probabilities are rounded to bf16 for the P.V product, as flash attention does.
#define MMA_TK 64

__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_bf16_16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int DV>
__device__ void paged_attn_mma(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,
                               const unsigned int* __restrict__ tables, const AttnItem* __restrict__ items,
                               bf16_t* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                               int hq, int hkv, int k_dim, int v_dim, int block_size, float scale, float softcap,
                               int window, int causal, int splits, int n_rows) {
    constexpr int KP = D + 8, VP = DV + 8;  // row pitches: 16-byte rows, conflict-free fragment reads
    extern __shared__ float smem[];
    unsigned short* k_s = (unsigned short*)smem;           // [MMA_TK][KP]
    unsigned short* v_s = k_s + MMA_TK * KP;               // [MMA_TK][VP]
    int* slot_s = (int*)(v_s + MMA_TK * VP);               // [MMA_TK]
    float* m_s = (float*)(slot_s + MMA_TK);                // [NWARPS][16]
    float* l_s = m_s + NWARPS * 16;                        // [16]
    float* o_s = l_s + 16;                                 // [16][DV]

    const AttnItem it = items[blockIdx.x];
    const int split = blockIdx.y;
    const int kvh = it.h0 / (hq / hkv);
    const int nqv = it.nrows * it.nheads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int len = it.k_hi - it.k_lo;
    const int chunk = ((len + splits - 1) / splits + MMA_TK - 1) / MMA_TK * MMA_TK;
    const int kbeg = it.k_lo + split * chunk;
    const int kend = min(kbeg + chunk, it.k_hi);

    // This thread's query rows (fragment rows g and g + 8) and their positions.
    int qrow[2], pos[2];
    bool qok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int qv = g + 8 * i;
        qok[i] = qv < nqv;
        qrow[i] = qok[i] ? (it.row0 + qv / it.nheads) * hq + it.h0 + qv % it.nheads : 0;
        pos[i] = it.pos0 + qv / it.nheads;
    }
    unsigned int qa[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            int i = r & 1, c = ks * 16 + t * 2 + (r >> 1) * 8;
            qa[ks][r] = qok[i] ? *(const unsigned int*)(q + (size_t)qrow[i] * D + c) : 0u;
        }
    }
    float o[DV / 8][4];
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_[2] = {-INFINITY, -INFINITY}, l_[2] = {0.f, 0.f};

    const size_t kstride = (size_t)hkv * k_dim, vstride = (size_t)hkv * v_dim;
    const bf16_t* kbase = kc + (size_t)kvh * k_dim;
    const bf16_t* vbase = vc + (size_t)kvh * v_dim;
    for (int t0 = kbeg; t0 < kend; t0 += MMA_TK) {
        __syncthreads();  // the previous tile's readers are done
        if (threadIdx.x < MMA_TK) {
            int kp = t0 + threadIdx.x;
            slot_s[threadIdx.x] = kp < kend ? (int)(tables[it.bt_off + kp / block_size] * block_size + kp % block_size) : -1;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < MMA_TK * (D / 8); e += blockDim.x) {
            int j = e / (D / 8), c = (e % (D / 8)) * 8;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (slot_s[j] >= 0) val = __ldg((const uint4*)(kbase + (size_t)slot_s[j] * kstride + c));
            *(uint4*)(k_s + j * KP + c) = val;
        }
        for (int e = threadIdx.x; e < MMA_TK * (DV / 8); e += blockDim.x) {
            int j = e / (DV / 8), c = (e % (DV / 8)) * 8;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (slot_s[j] >= 0) val = __ldg((const uint4*)(vbase + (size_t)slot_s[j] * vstride + c));
            *(uint4*)(v_s + j * VP + c) = val;
        }
        __syncthreads();
        const int kw0 = warp * 16;  // this warp's keys within the tile
        if (t0 + kw0 >= kend) continue;

        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const unsigned short* kr = k_s + (kw0 + nt * 8 + g) * KP + ks * 16 + t * 2;
                mma_bf16_16816(s[nt], qa[ks], *(const unsigned int*)kr, *(const unsigned int*)(kr + 8));
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int i = e >> 1;
                int kp = t0 + kw0 + nt * 8 + t * 2 + (e & 1);
                float x = s[nt][e] * scale;
                if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
                bool valid = qok[i] && kp < kend && (!causal || (kp <= pos[i] && (window == 0 || kp > pos[i] - window)));
                x = valid ? x : -INFINITY;
                s[nt][e] = x;
                mx[i] = fmaxf(mx[i], x);
            }
        }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            float m_new = fmaxf(m_[i], mx[i]);
            corr[i] = m_[i] == -INFINITY ? 0.f : expf(m_[i] - m_new);
            m_[i] = m_new;
            l_[i] *= corr[i];
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int i = e >> 1;
                float p = m_[i] == -INFINITY ? 0.f : expf(s[nt][e] - m_[i]);
                s[nt][e] = p;
                l_[i] += p;
            }
        }
        unsigned int pa[4] = {pack_bf16x2(s[0][0], s[0][1]), pack_bf16x2(s[0][2], s[0][3]),
                              pack_bf16x2(s[1][0], s[1][1]), pack_bf16x2(s[1][2], s[1][3])};
        const unsigned short* v0 = v_s + (kw0 + t * 2) * VP + g;
#pragma unroll
        for (int j = 0; j < DV / 8; ++j) {
            o[j][0] *= corr[0]; o[j][1] *= corr[0]; o[j][2] *= corr[1]; o[j][3] *= corr[1];
            const unsigned short* vr = v0 + j * 8;
            unsigned int b0 = (unsigned int)vr[0] | ((unsigned int)vr[VP] << 16);
            unsigned int b1 = (unsigned int)vr[8 * VP] | ((unsigned int)vr[9 * VP] << 16);
            mma_bf16_16816(o[j], pa, b0, b1);
        }
    }

    // Merge the warps: scale each to the block's row maximum and add them up in shared memory,
    // one warp after another so that the sum's order (and rounding) is the same on every run.
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * DV; e += blockDim.x) o_s[e] = 0.f;
    if (threadIdx.x < 16) l_s[threadIdx.x] = 0.f;
    if (t == 0) { m_s[warp * 16 + g] = m_[0]; m_s[warp * 16 + g + 8] = m_[1]; }
    __syncthreads();
    float f[2], lsum[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float mb = -INFINITY;
        for (int w = 0; w < NWARPS; ++w) mb = fmaxf(mb, m_s[w * 16 + g + 8 * i]);
        f[i] = m_[i] == -INFINITY ? 0.f : expf(m_[i] - mb);
        lsum[i] = l_[i];
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 1);
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 2);
    }
    for (int w = 0; w < NWARPS; ++w) {
        if (warp == w) {
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if (t == 0 && f[i] > 0.f) l_s[g + 8 * i] += lsum[i] * f[i];
#pragma unroll
            for (int j = 0; j < DV / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int i = e >> 1;
                    if (f[i] > 0.f) o_s[(g + 8 * i) * DV + j * 8 + t * 2 + (e & 1)] += o[j][e] * f[i];
                }
            }
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < nqv * DV; e += blockDim.x) {
        int qv = e / DV, c = e % DV;
        int row = it.row0 + qv / it.nheads, h = it.h0 + qv % it.nheads;
        float l = l_s[qv];
        if (splits == 1) {
            out[((size_t)row * hq + h) * DV + c] = from_f<bf16_t>(l > 0.f ? o_s[e] / l : 0.f);
        } else {
            float mb = -INFINITY;
            for (int w = 0; w < NWARPS; ++w) mb = fmaxf(mb, m_s[w * 16 + qv]);
            size_t ph = ((size_t)split * n_rows + it.local0 + qv / it.nheads) * hq + h;
            store_partial(part_acc, part_ml, ph, c, o_s[e], DV, mb, l, c == 0);
        }
    }
}

#define INST_MMA(D, DV)                                                                                            \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32) paged_attn_mma_bf16_d##D##_v##DV(                    \
        const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const unsigned int* tables, const AttnItem* items,    \
        bf16_t* out, float* part_acc, float* part_ml, int hq, int hkv, int k_dim, int v_dim, int block_size,       \
        float scale, float softcap, int window, int causal, int splits, int n_rows) { pdl_wait();                  \
        paged_attn_mma<D, DV>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, k_dim, v_dim, block_size, \
                              scale, softcap, window, causal, splits, n_rows);                                     \
    }
INST_MMA(64, 64) INST_MMA(128, 128) INST_MMA(256, 256)

// One block per (row, head) of `n_rows` rows: merges the splits' partial results. Partial row i
// belongs to output row rows[i]. The splits' statistics are read by all threads at once and the
// empty splits (key ranges past the context) are dropped before the per-channel sums, which run
// over the remaining splits in order: at decode most of a capture-sized split count is empty,
// and a merge that walked every split a thread at a time was bound by those dependent loads.
// Dynamic shared memory: `splits` floats and `splits` ints.
template <typename T>
__device__ void attn_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml, T* __restrict__ out,
                             const unsigned int* __restrict__ rows, int splits, int n_rows, int hq, int dv) {
    extern __shared__ float comb_s[];
    float* scale_s = comb_s;                  // [splits] exp(m_s - m)
    int* live_s = (int*)(comb_s + splits);    // [splits] the non-empty splits, in order
    __shared__ int n_live;
    const size_t local = blockIdx.x / hq, h = blockIdx.x % hq;
    const size_t oh = (size_t)rows[local] * hq + h;
    const size_t per_split = (size_t)n_rows * hq;
    const size_t ph = local * hq + h;
    const int tid = threadIdx.x, lane = tid & 31;
    float m = -INFINITY;
    for (int s = tid; s < splits; s += blockDim.x) m = fmaxf(m, part_ml[(s * per_split + ph) * 2]);
    m = block_max(m);
    float l = 0.f;
    for (int s = tid; s < splits; s += blockDim.x) {
        const float ms = part_ml[(s * per_split + ph) * 2];
        const float e = ms == -INFINITY ? 0.f : expf(ms - m);
        scale_s[s] = e;
        if (ms != -INFINITY) l += part_ml[(s * per_split + ph) * 2 + 1] * e;
    }
    l = block_sum(l);
    if (tid < 32) {
        int n = 0;
        for (int s0 = 0; s0 < splits; s0 += 32) {
            const int s = s0 + lane;
            const bool live = s < splits && part_ml[(s * per_split + ph) * 2] != -INFINITY;
            const unsigned int ballot = __ballot_sync(0xffffffffu, live);
            if (live) live_s[n + __popc(ballot & ((1u << lane) - 1u))] = s;
            n += __popc(ballot);
        }
        if (lane == 0) n_live = n;
    }
    __syncthreads();
    const int live = n_live;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = tid; c < dv; c += blockDim.x) {
        float a = 0.f;
#pragma unroll 8
        for (int j = 0; j < live; ++j) {
            const int s = live_s[j];
            a += part_acc[(s * per_split + ph) * dv + c] * scale_s[s];
        }
        out[oh * dv + c] = from_f<T>(a * inv);
    }
}

// Decode kernels for up to HM heads a block and values of up to 32 * DVR elements: sized
// register arrays instead of predicated-off work for the common GQA groups and head dims.
#define INST_DECODE(TN, T, HM, DVR)                                                                                \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) paged_decode_##TN##_h##HM##_v##DVR(               \
        const T* q, const T* kc, const T* vc, const unsigned int* tables, const DecodeItem* items, T* out,         \
        float* part_acc, float* part_ml, int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size,     \
        float scale, float softcap, int splits, int n_rows, int vec, unsigned int* done) {                         \
        paged_decode<T, HM, DVR>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, d, dv, k_dim, v_dim,   \
                                 block_size, scale, softcap, splits, n_rows, vec, done);                           \
    }
#define INST_T(TN, T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32) paged_attn_##TN(                                     \
        const T* q, const T* kc, const T* vc, const unsigned int* tables, const AttnItem* items, T* out,           \
        float* part_acc, float* part_ml, int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size,     \
        float scale, float softcap, int window, int causal, int splits, int n_rows, int kpitch, int vpitch,        \
        int vec) { pdl_wait();                                                                                     \
        paged_attn<T>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, d, dv, k_dim, v_dim, block_size,  \
                      scale, softcap, window, causal, splits, n_rows, kpitch, vpitch, vec);                        \
    }                                                                                                              \
    INST_DECODE(TN, T, 1, 4) INST_DECODE(TN, T, 2, 4) INST_DECODE(TN, T, 4, 4) INST_DECODE(TN, T, 8, 4)            \
    INST_DECODE(TN, T, 1, 8) INST_DECODE(TN, T, 2, 8) INST_DECODE(TN, T, 4, 8) INST_DECODE(TN, T, 8, 8)            \
    extern "C" __global__ void attn_combine_##TN(const float* pa, const float* pm, T* out, const unsigned int* rows, \
                                                 int splits, int n_rows, int hq, int dv) { pdl_wait();             \
        attn_combine<T>(pa, pm, out, rows, splits, n_rows, hq, dv);                                                \
    }
FOR_T(INST_T)
"#;

/// Sampling, `cpu::sampling` step for step (its module doc has the semantics): one block of
/// 1024 threads per row reads the row a pass at a time (the max; per filter eight radix passes;
/// the top-p mass; the race) and writes one token id.
///
/// The filters' thresholds are order keys of the scaled logits found by a radix select, 4 bits a
/// pass from the top: each pass histograms into 16 bins the survivors that share the digits
/// chosen so far, weighing each by 1 (top-k: exact counts, so the exact k-th value) or by its
/// unnormalised probability (top-p). The bins are summed in a fixed order rather than with
/// float atomics, so a row samples the same token on every run. Products and differences that
/// the CPU computes separately use `__fmul_rn`/`__fsub_rn`, which NVRTC never fuses into an FMA.
pub const SAMPLING: &str = r#"
// Mirrors `plan_words` in sampling.rs.
struct SamplePlan {
    unsigned int greedy;
    float inv_t, log_min_p, top_p;
    unsigned int top_k, seed_lo, seed_hi, step_lo, step_hi;
};

// The first word of Philox4x32-10 (Salmon et al., SC'11) of counter c under key k.
__device__ __forceinline__ unsigned int philox_first(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                                                     unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return c0;
}

// In (0, 1) strictly: the top 23 bits, centred in their interval (exact in f32).
__device__ __forceinline__ float draw_uniform(const SamplePlan& p, unsigned int i) {
    unsigned int w = philox_first(p.step_lo, p.step_hi, i, 0u, p.seed_lo, p.seed_hi);
    return ((float)(w >> 9) + 0.5f) * 1.1920928955078125e-7f;
}

__device__ __forceinline__ unsigned int order_key(float x) {
    unsigned int b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float scaled(float l, float inv_t) {
    float x = __fmul_rn(l, inv_t);
    if (isnan(x)) return -INFINITY;
    return x == 0.f ? 0.f : x;
}

// Whether x survives min-p and has an order key of at least floor_key; d = x - m either way.
__device__ __forceinline__ bool survivor(float x, float m, float log_min_p, unsigned int floor_key, float& d) {
    d = x == m ? 0.f : __fsub_rn(x, m);
    return d > -INFINITY && d >= log_min_p && order_key(x) >= floor_key;
}

// The largest order key t such that the survivors with key >= t weigh at least `target` (each
// 1, or exp(d) when `mass`); 0, keeping every survivor, when all of them together fall short.
template <typename T>
__device__ unsigned int radix_floor(const T* __restrict__ row, int cols, const SamplePlan& p, float m,
                                    unsigned int floor_key, bool mass, float target) {
    __shared__ float part[32][16];
    __shared__ float bins[16];
    __shared__ unsigned int s_prefix;
    __shared__ float s_above;
    __shared__ int s_done;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // readers of a previous call's s_prefix are done
    if (threadIdx.x == 0) { s_prefix = 0u; s_above = 0.f; s_done = 0; }
    __syncthreads();
    for (int shift = 28; shift >= 0; shift -= 4) {
        const unsigned int prefix = s_prefix;
        const unsigned int high = shift == 28 ? 0u : 0xffffffffu << (shift + 4);
        float acc[16];
#pragma unroll
        for (int b = 0; b < 16; ++b) acc[b] = 0.f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float x = scaled(to_f(row[c]), p.inv_t), d;
            unsigned int k = order_key(x);
            if ((k & high) != prefix || !survivor(x, m, p.log_min_p, floor_key, d)) continue;
            float w = mass ? expf(d) : 1.f;
            unsigned int digit = (k >> shift) & 15u;
#pragma unroll
            for (int b = 0; b < 16; ++b) acc[b] += digit == (unsigned int)b ? w : 0.f;
        }
#pragma unroll
        for (int b = 0; b < 16; ++b) {
            float v = warp_sum(acc[b]);
            if (lane == 0) part[warp][b] = v;
        }
        __syncthreads();
        if (threadIdx.x < 16) {
            float s = 0.f;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += part[w][threadIdx.x];
            bins[threadIdx.x] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float above = s_above, higher = 0.f;
            int pick = -1;
            for (int b = 15; b >= 0; --b) {
                float with = higher + bins[b];
                if (above + with >= target) { pick = b; break; }
                higher = with;
            }
            if (pick < 0 && shift == 28) {
                s_done = 1;
            } else {
                // Below the top digit the bins add up to the bin chosen before only up to
                // rounding: a shortfall keeps the whole of that bin.
                if (pick < 0) pick = 0;
                s_prefix = prefix | ((unsigned int)pick << shift);
                s_above = above + higher;
            }
        }
        __syncthreads();
        if (s_done) break;
    }
    return s_prefix;
}

template <typename T>
__device__ void sample_rows(const T* __restrict__ logits, const SamplePlan* __restrict__ plans,
                            unsigned int* __restrict__ out, int cols) {
    const T* row = logits + (size_t)blockIdx.x * cols;
    const SamplePlan p = plans[blockIdx.x];
    float m = -INFINITY;
    if (!p.greedy) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, scaled(to_f(row[c]), p.inv_t));
        m = block_max(m);
    }
    float bv = -INFINITY;
    unsigned int bi = 0xffffffffu;
    // Greedy rows, and sampled rows without a token of any probability, take the argmax.
    if (m == -INFINITY) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = to_f(row[c]);
            if (better(v, c, bv, bi)) { bv = v; bi = c; }
        }
        store_best(bv, bi, out, nullptr, blockIdx.x);
        return;
    }
    unsigned int floor_key = 0u;
    if (p.top_k) floor_key = radix_floor(row, cols, p, m, 0u, false, (float)p.top_k);
    if (p.top_p < 1.f) {
        float z = 0.f, d;
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            if (survivor(scaled(to_f(row[c]), p.inv_t), m, p.log_min_p, floor_key, d)) z += expf(d);
        const float target = __fmul_rn(p.top_p, block_sum(z));
        unsigned int t = radix_floor(row, cols, p, m, floor_key, true, target);
        // A target of 0 leaves t above every key: the best token always stays.
        const unsigned int best_key = order_key(m);
        t = t < best_key ? t : best_key;
        floor_key = t > floor_key ? t : floor_key;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d;
        if (survivor(scaled(to_f(row[c]), p.inv_t), m, p.log_min_p, floor_key, d)) {
            float s = __fsub_rn(d, logf(-logf(draw_uniform(p, c))));
            if (better(s, c, bv, bi)) { bv = s; bi = c; }
        }
    }
    store_best(bv, bi, out, nullptr, blockIdx.x);
}

#define INST_T(TN, T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(1024) sample_rows_##TN(const T* x, const SamplePlan* plans,       \
                                                                        unsigned int* out, int cols) { pdl_wait(); \
        sample_rows<T>(x, plans, out, cols);                                                                       \
    }
FOR_T(INST_T)
"#;
