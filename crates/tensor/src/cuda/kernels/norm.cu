// Row-wise reductions: RMSNorm (plain and fused with the residual add), LayerNorm, softmax, FP8
// activation quantization, Gemma 3n's gaussian top-k and AltUp's magnitude matching.
// One block per row. The RMSNorm loops are unrolled so that a thread's loads are in flight
// together: at decode a norm is one or a few blocks, bound by memory latency, not bandwidth.

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

// Gemma 3n's gaussian top-k: relu(x - (mean + std * mult)) with the row's mean and population
// standard deviation (two passes, as torch's CPU std).
template <typename T>
__device__ void gaussian_topk(const T* __restrict__ x, T* __restrict__ y, int cols, float mult) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_f(xr[c]);
    const float mean = block_sum(s) / cols;
    float q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float d = to_f(xr[c]) - mean; q += d * d; }
    const float cutoff = __fadd_rn(mean, __fmul_rn(sqrtf(block_sum(q) / cols), mult));
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_f<T>(fmaxf(to_f(xr[c]) - cutoff, 0.f));
}

// AltUp's magnitude matching: x * rms(ref) / sqrt(max(mean(x^2), floor)), multiplied then divided
// as transformers writes it.
template <typename T>
__device__ void match_rms(const T* __restrict__ x, const T* __restrict__ ref, T* __restrict__ y, int cols, int ref_cols,
                          float floor) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    const T* rr = ref + (size_t)blockIdx.x * ref_cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < ref_cols; c += blockDim.x) { float v = to_f(rr[c]); s += v * v; }
    const float target = sqrtf(block_sum(s) / ref_cols);
    float q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = to_f(xr[c]); q += v * v; }
    const float own = sqrtf(fmaxf(block_sum(q) / cols, floor));
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = from_f<T>(__fdiv_rn(__fmul_rn(to_f(xr[c]), target), own));
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

// The e4m3 scale of the `n` values at x, for the whole block: `static_scale` where positive, else
// amax / 448 (FLT_EPSILON for zero).
template <typename T>
__device__ __forceinline__ float e4m3_scale(const T* __restrict__ x, int n, float static_scale) {
    if (static_scale > 0.f) return static_scale;
    float m = 0.f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, fabsf(to_f(x[c])));
    const float scale = block_max(m) / 448.f;
    return scale == 0.f ? 1.1920929e-07f : scale;
}

// FP8 activation quantization, one block per group of `group` elements (a row, or a 128-wide
// slice of one): the scale is `amax / 448` (FLT_EPSILON for zero), or `static_scale` where positive.
template <typename T>
__device__ void fp8_fake_quant(const T* __restrict__ x, T* __restrict__ y, int group, float static_scale) {
    const T* xg = x + (size_t)blockIdx.x * group;
    T* yg = y + (size_t)blockIdx.x * group;
    const float scale = e4m3_scale(xg, group, static_scale);
    for (int c = threadIdx.x; c < group; c += blockDim.x)
        yg[c] = from_f<T>(round_to_e4m3(fminf(fmaxf(to_f(xg[c]) / scale, -448.f), 448.f)) * scale);
}

// The rows of bf16 x as e4m3 bytes and one f32 scale per row (the FP8 products' inputs): the
// same scale and rounding as fp8_fake_quant per token, or with `static_scale` where positive; one
// block per row.
extern "C" __global__ void fp8_quant_rows_bf16(const bf16_t* __restrict__ x, unsigned char* __restrict__ q,
                                               float* __restrict__ scales, int cols, float static_scale) {
    pdl_wait();
    const bf16_t* xr = x + (size_t)blockIdx.x * cols;
    unsigned char* qr = q + (size_t)blockIdx.x * cols;
    const float scale = e4m3_scale(xr, cols, static_scale);
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        qr[c] = e4m3_byte(round_to_e4m3(fminf(fmaxf(to_f(xr[c]) / scale, -448.f), 448.f)));
}

// fp8_quant_rows_bf16 and fp8_fake_quant_bf16 per token for rows of whole 16-byte chunks (up to
// QUANT_CHUNKS a thread, norm.rs's quant_chunks_cfg), with
// the same scale and rounding. At decode a row is one block, bound by load latency: each thread
// issues all its loads at once and keeps the chunks in registers from the maximum to the write,
// where the loops above wait on one load per step and read the row twice. Writes e4m3 bytes to
// `q` (and the scale to `scales`) when `q` is given, else the quantized values in bf16 to `y`.
__device__ void fp8_quant_row_chunks(const bf16_t* __restrict__ x, bf16_t* __restrict__ y, unsigned char* __restrict__ q,
                                     float* __restrict__ scales, int cols, float static_scale) {
    const int chunks = cols / 8;
    const uint4* xr = (const uint4*)(x + (size_t)blockIdx.x * cols);
    uint4 v[QUANT_CHUNKS];
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < QUANT_CHUNKS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < chunks) v[i] = xr[c];
    }
#pragma unroll
    for (int i = 0; i < QUANT_CHUNKS; ++i) {
        if (threadIdx.x + i * blockDim.x < chunks) {
            float f[8];
            unpack(v[i], f, bf16_t());
#pragma unroll
            for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(f[e]));
        }
    }
    float scale = static_scale;
    if (!(static_scale > 0.f)) {
        scale = block_max(m) / 448.f;
        if (scale == 0.f) scale = 1.1920929e-07f;
    }
    if (q && threadIdx.x == 0) scales[blockIdx.x] = scale;
#pragma unroll
    for (int i = 0; i < QUANT_CHUNKS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c >= chunks) continue;
        float f[8];
        unpack(v[i], f, bf16_t());
        __align__(16) bf16_t out[8];
        __align__(8) unsigned char bytes[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float r = round_to_e4m3(fminf(fmaxf(f[e] / scale, -448.f), 448.f));
            bytes[e] = e4m3_byte(r);
            out[e] = from_f<bf16_t>(r * scale);
        }
        if (q) ((uint2*)(q + (size_t)blockIdx.x * cols))[c] = *(const uint2*)bytes;
        else ((uint4*)(y + (size_t)blockIdx.x * cols))[c] = *(const uint4*)out;
    }
}

extern "C" __global__ void fp8_quant_row_chunks_bf16(const bf16_t* __restrict__ x, unsigned char* __restrict__ q,
                                                     float* __restrict__ scales, int cols, float static_scale) {
    pdl_wait();
    fp8_quant_row_chunks(x, nullptr, q, scales, cols, static_scale);
}

extern "C" __global__ void fp8_fake_quant_row_chunks_bf16(const bf16_t* __restrict__ x, bf16_t* __restrict__ y,
                                                          int cols, float static_scale) {
    pdl_wait();
    fp8_quant_row_chunks(x, y, nullptr, nullptr, cols, static_scale);
}

#define INST_T(TN, T) \
    extern "C" __global__ void softmax_##TN(const T* x, T* y, int cols) { pdl_wait(); softmax<T>(x, y, cols); } \
    extern "C" __global__ void fp8_fake_quant_##TN(const T* x, T* y, int group, float static_scale) {          \
        pdl_wait();                                                                                          \
        fp8_fake_quant<T>(x, y, group, static_scale);                                                        \
    }                                                                                                        \
    extern "C" __global__ void gaussian_topk_##TN(const T* x, T* y, int cols, float mult) {                 \
        pdl_wait();                                                                                          \
        gaussian_topk<T>(x, y, cols, mult);                                                                  \
    }                                                                                                        \
    extern "C" __global__ void match_rms_##TN(const T* x, const T* r, T* y, int cols, int rc, float floor) {\
        pdl_wait();                                                                                          \
        match_rms<T>(x, r, y, cols, rc, floor);                                                              \
    }
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
