// Elementwise maps, copies and gathers, the mixture-of-experts combine, AltUp's stream mixing, argmax.

// op: UNARY_SCALE by a, UNARY_SOFTCAP a * tanh(x / a), UNARY_ACTIVATION with activation code `act`.
template <typename T>
__device__ void unary(const T* __restrict__ x, T* __restrict__ y, size_t n, int op, float a, int act) {
    GRID_STRIDE(i, n) {
        float v = to_f(x[i]);
        float r = op == UNARY_SCALE ? v * a : op == UNARY_SOFTCAP ? tanhf(v / a) * a : activate(act, v);
        y[i] = from_f<T>(r);
    }
}

// xIELU (Apertus). The explicit-rounding intrinsics keep NVRTC from contracting the products
// and sums into FMAs, so each step rounds as torch's separate ops do.
template <typename T>
__device__ void xielu(const T* __restrict__ x, T* __restrict__ y, size_t n, float ap, float an, float beta, float eps) {
    GRID_STRIDE(i, n) {
        float v = to_f(x[i]);
        float r = v > 0.f ? __fadd_rn(__fmul_rn(__fmul_rn(ap, v), v), __fmul_rn(beta, v))
                          : __fadd_rn(__fmul_rn(__fsub_rn(expm1f(fminf(v, eps)), v), an), __fmul_rn(beta, v));
        y[i] = from_f<T>(r);
    }
}

// gpt-oss's clamped SwiGLU: gate clamped above, up on both sides at `limit`,
// (up + 1) * gate * sigmoid(gate * alpha). Explicit rounding keeps each step one torch op.
template <typename T>
__device__ void clamped_swiglu(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y, size_t n,
                               float alpha, float limit) {
    GRID_STRIDE(i, n) {
        const float gv = fminf(to_f(g[i]), limit);
        const float uv = fminf(fmaxf(to_f(u[i]), -limit), limit);
        const float sig = __frcp_rn(__fadd_rn(1.f, expf(-__fmul_rn(gv, alpha))));
        y[i] = from_f<T>(__fmul_rn(__fadd_rn(uv, 1.f), __fmul_rn(gv, sig)));
    }
}

// op: BINARY_ADD, BINARY_MUL, BINARY_ACT_MUL activate(a) * b with activation code `act`.
template <typename T>
__device__ void binary(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, size_t n, int op, int act) {
    GRID_STRIDE(i, n) {
        float u = to_f(a[i]), v = to_f(b[i]);
        float r = op == BINARY_ADD ? u + v : op == BINARY_MUL ? u * v : activate(act, u) * v;
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

// out[r, i * d + c] = sum_j coefs[r, i * m + j] * x[r, j * d + c] for i < n, added in j order with
// each product rounded (AltUp's stream mixing).
template <typename T>
__device__ void mix_streams(const T* __restrict__ x, const T* __restrict__ coefs, T* __restrict__ y, size_t total,
                            int n, int m, int d) {
    GRID_STRIDE(k, total) {
        const size_t r = k / ((size_t)n * d);
        const int i = (int)(k / d % n), c = (int)(k % d);
        const T* w = coefs + (r * n + i) * m;
        const T* xr = x + r * m * d + c;
        float a = __fmul_rn(to_f(w[0]), to_f(xr[0]));
        for (int j = 1; j < m; ++j) a = __fadd_rn(a, __fmul_rn(to_f(w[j]), to_f(xr[(size_t)j * d])));
        y[k] = from_f<T>(a);
    }
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
    extern "C" __global__ void xielu_##TN(const T* x, T* y, size_t n, float ap, float an, float beta, float eps) { \
        pdl_wait();                                                                                                \
        xielu<T>(x, y, n, ap, an, beta, eps);                                                                      \
    }                                                                                                              \
    extern "C" __global__ void binary_##TN(const T* a, const T* b, T* y, size_t n, int op, int act) { pdl_wait();  \
        binary<T>(a, b, y, n, op, act);                                                                            \
    }                                                                                                              \
    extern "C" __global__ void clamped_swiglu_##TN(const T* g, const T* u, T* y, size_t n, float alpha,           \
                                                   float limit) {                                                  \
        pdl_wait();                                                                                                \
        clamped_swiglu<T>(g, u, y, n, alpha, limit);                                                               \
    }                                                                                                              \
    extern "C" __global__ void gather_rows_##TN(const T* s, const unsigned int* idx, T* d, int cols) {             \
        gather_rows<T>(s, idx, d, cols);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void copy_cols_##TN(const T* s, int sc, int so, T* d, int dc, int dof, int rows, int len) {\
        pdl_wait();                                                                                                \
        copy_cols<T>(s, sc, so, d, dc, dof, rows, len);                                                            \
    }                                                                                                              \
    extern "C" __global__ void argmax_parts_##TN(const T* x, float* pv, unsigned int* pi, int cols, int per_part) {\
        pdl_wait();                                                                                                \
        argmax_parts<T>(x, pv, pi, cols, per_part);                                                                \
    }                                                                                                              \
    extern "C" __global__ void combine_rows_##TN(const T* y, const unsigned int* rows, const float* w, T* out, int cols, \
                                                 int per_row) { pdl_wait();                                        \
        combine_rows<T>(y, rows, w, out, cols, per_row);                                                           \
    }                                                                                                              \
    extern "C" __global__ void mix_streams_##TN(const T* x, const T* coefs, T* y, size_t total, int n, int m, int d) {\
        pdl_wait();                                                                                                \
        mix_streams<T>(x, coefs, y, total, n, m, d);                                                               \
    }
FOR_T(INST_T)

// out[r, c] = src[r, cols[c]], or `fill` where cols[c] is negative: f32 rows into a wider layout
// (EAGLE-3's draft-vocabulary logits into the target's vocabulary). The column map is f32 holding
// exact integers (vocabularies are far below 2^24), so that it lives in an ordinary tensor.
extern "C" __global__ void gather_cols_f32(const float* __restrict__ src, const float* __restrict__ cols,
                                           float* __restrict__ out, int src_cols, int out_cols, size_t n, float fill) {
    pdl_wait();
    GRID_STRIDE(i, n) {
        const int c = (int)cols[i % out_cols];
        out[i] = c < 0 ? fill : src[(i / out_cols) * src_cols + c];
    }
}

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
    }
FOR_TW(INST_TW)
