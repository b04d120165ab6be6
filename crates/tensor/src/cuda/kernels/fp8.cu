// FP8 weight products `y[m, n] (+)= x[m, k] w[n, k]^T`, w kept as e4m3 bytes with f32 scales per
// block of `block_rows x block_cols` weights (`scale_cols` blocks across a row; one block across
// for per-tensor and per-channel scales), x in bf16.
//
// `gemv_fp8` and its fused forms follow gemv.cu (one warp per output column, four 16-byte weight
// loads in flight per lane, allocated past L1) but a load holds 16 weights, so a decode step reads
// one byte per weight. Each 16-weight dot is summed in f32 from the e4m3 values; a row with one
// scale is multiplied by it once at the end, a block-scaled row per 16 weights (a block is a
// multiple of 16 inputs). `fp8_dequant_bf16` expands the weight for cuBLAS where m is too large
// for these kernels and the FP8 GEMM does not apply.

// Four e4m3 bytes as floats.
__device__ __forceinline__ void e4m3x4(unsigned int w, float* f) {
#if __CUDA_ARCH__ >= 890
    unsigned int lo, hi;
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(f[0]), "=f"(f[1])
        : "r"(lo));
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(f[2]), "=f"(f[3])
        : "r"(hi));
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int b = (w >> (8 * i)) & 0xffu, e = (b >> 3) & 0xfu, mant = b & 7u;
        const float v = e ? ldexpf(1.f + mant / 8.f, (int)e - 7) : mant * 0.001953125f;
        f[i] = (b & 0x80u) ? -v : v;
    }
#endif
}

__device__ __forceinline__ void e4m3x16(uint4 w, float* f) {
    e4m3x4(w.x, f);
    e4m3x4(w.y, f + 4);
    e4m3x4(w.z, f + 8);
    e4m3x4(w.w, f + 12);
}

// This lane's part of x[i] . w_r over 16-weight chunks, for R weight rows whose scales start at
// sr[r]; rows with one scale (scale_cols == 1) are left unscaled for the caller.
template <int M, int R>
__device__ __forceinline__ void fp8_dots(const bf16_t* __restrict__ x, const uint4* const* wr, const float* const* sr,
                                         int scale_cols, int block_chunks, int chunks, int lane, float (&acc)[R][M]) {
    const uint4* xr = (const uint4*)x;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) acc[r][i] = 0.f;
    int c = lane;
    uint4 wv[R][4];
    if (c + 96 < chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int u = 0; u < 4; ++u) wv[r][u] = ld_stream(wr[r] + c + 32 * u);
    }
    pdl_wait();
    // One 16-weight chunk of every row against every x row.
    auto step = [&](const uint4 (&w)[R], int cu) {
        float wf[R][16], s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            e4m3x16(w[r], wf[r]);
            s[r] = scale_cols > 1 ? __ldg(sr[r] + cu / block_chunks) : 1.f;
        }
#pragma unroll
        for (int i = 0; i < M; ++i) {
            float xf[16];
            unpack(__ldg(xr + ((size_t)i * chunks + cu) * 2), xf, bf16_t());
            unpack(__ldg(xr + ((size_t)i * chunks + cu) * 2 + 1), xf + 8, bf16_t());
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < 16; ++e) d += wf[r][e] * xf[e];
                acc[r][i] += s[r] * d;
            }
        }
    };
    for (; c + 96 < chunks; c += 128) {
        if (c != lane) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int u = 0; u < 4; ++u) wv[r][u] = ld_stream(wr[r] + c + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            uint4 w[R];
#pragma unroll
            for (int r = 0; r < R; ++r) w[r] = wv[r][u];
            step(w, c + 32 * u);
        }
    }
    for (; c < chunks; c += 32) {
        uint4 w[R];
#pragma unroll
        for (int r = 0; r < R; ++r) w[r] = ld_stream(wr[r] + c);
        step(w, c);
    }
    if (scale_cols == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = __ldg(sr[r]);
#pragma unroll
            for (int i = 0; i < M; ++i) acc[r][i] *= s;
        }
    }
}

// The scale layout shared by the products of one launch.
struct Fp8Scales {
    int scale_cols, block_rows, block_chunks;
};

template <int M>
__device__ __forceinline__ void gemv_fp8_column(const bf16_t* __restrict__ x, const unsigned char* __restrict__ w,
                                                const float* __restrict__ sc, bf16_t* __restrict__ y, int n, int k,
                                                int col, int accumulate, Fp8Scales s, int lane) {
    const uint4* wr[1] = {(const uint4*)(w + (size_t)col * k)};
    const float* sr[1] = {sc + (size_t)(col / s.block_rows) * s.scale_cols};
    float acc[1][M];
    fp8_dots<M, 1>(x, wr, sr, s.scale_cols, s.block_chunks, k / 16, lane, acc);
    gemv_store<M>(acc[0], y, n, col, accumulate, lane);
}

// The grid covers n0 + n1 + n2 columns; a product with n = 0 is absent.
template <int M>
__device__ void gemv3_fp8(const bf16_t* __restrict__ x, int k, Fp8Scales s, const unsigned char* w0, const float* s0,
                          bf16_t* y0, int n0, int a0, const unsigned char* w1, const float* s1, bf16_t* y1, int n1,
                          int a1, const unsigned char* w2, const float* s2, bf16_t* y2, int n2, int a2) {
    int col = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const unsigned char* w = w0;
    const float* sc = s0;
    bf16_t* y = y0;
    int n = n0, a = a0;
    if (col >= n0) {
        col -= n0;
        w = w1; sc = s1; y = y1; n = n1; a = a1;
        if (col >= n1) {
            col -= n1;
            w = w2; sc = s2; y = y2; n = n2; a = a2;
            if (col >= n2) {
                pdl_wait();
                return;
            }
        }
    }
    gemv_fp8_column<M>(x, w, sc, y, n, k, col, a, s, threadIdx.x & 31);
}

template <int M>
__device__ void gemv_gated_fp8(const bf16_t* __restrict__ x, const unsigned char* __restrict__ wg,
                               const float* __restrict__ sg, const unsigned char* __restrict__ wu,
                               const float* __restrict__ su, bf16_t* __restrict__ y, int n, int k, Fp8Scales s,
                               int act) {
    const int col = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (col >= n) {
        pdl_wait();
        return;
    }
    const size_t srow = (size_t)(col / s.block_rows) * s.scale_cols;
    const uint4* wr[2] = {(const uint4*)(wg + (size_t)col * k), (const uint4*)(wu + (size_t)col * k)};
    const float* sr[2] = {sg + srow, su + srow};
    float acc[2][M];
    fp8_dots<M, 2>(x, wr, sr, s.scale_cols, s.block_chunks, k / 16, lane, acc);
#pragma unroll
    for (int i = 0; i < M; ++i) {
        float g = to_f(from_f<bf16_t>(warp_sum(acc[0][i])));
        float u = to_f(from_f<bf16_t>(warp_sum(acc[1][i])));
        if (lane == 0) y[(size_t)i * n + col] = from_f<bf16_t>(activate(act, g) * u);
    }
}

#define INST_GEMV_FP8(M)                                                                                          \
    extern "C" __global__ void gemv3_fp8_m##M(const bf16_t* x, int k, int scale_cols, int block_rows,             \
                                              int block_chunks, const unsigned char* w0, const float* s0,         \
                                              bf16_t* y0, int n0, int a0, const unsigned char* w1,                \
                                              const float* s1, bf16_t* y1, int n1, int a1,                        \
                                              const unsigned char* w2, const float* s2, bf16_t* y2, int n2,       \
                                              int a2) {                                                           \
        const Fp8Scales s = {scale_cols, block_rows, block_chunks};                                               \
        gemv3_fp8<M>(x, k, s, w0, s0, y0, n0, a0, w1, s1, y1, n1, a1, w2, s2, y2, n2, a2);                        \
    }                                                                                                             \
    extern "C" __global__ void gemv_gated_fp8_m##M(const bf16_t* x, const unsigned char* wg, const float* sg,      \
                                                   const unsigned char* wu, const float* su, bf16_t* y, int n,    \
                                                   int k, int scale_cols, int block_rows, int block_chunks,       \
                                                   int act) {                                                     \
        const Fp8Scales s = {scale_cols, block_rows, block_chunks};                                               \
        gemv_gated_fp8<M>(x, wg, sg, wu, su, y, n, k, s, act);                                                    \
    }
INST_GEMV_FP8(1) INST_GEMV_FP8(2) INST_GEMV_FP8(3) INST_GEMV_FP8(4)

// w[n, k] in bf16: each thread expands four bytes.
extern "C" __global__ void fp8_dequant_bf16(const unsigned int* __restrict__ wq, const float* __restrict__ sc,
                                            bf16_t* __restrict__ w, int n, int k, int scale_cols, int block_rows,
                                            int block_cols) {
    pdl_wait();
    GRID_STRIDE(i, (size_t)n * k / 4) {
        const size_t row = i * 4 / k, col = i * 4 % k;
        const float s = sc[(row / block_rows) * scale_cols + col / block_cols];
        float f[4];
        e4m3x4(wq[i], f);
        unsigned int lo = (unsigned int)from_f<bf16_t>(f[0] * s).bits | ((unsigned int)from_f<bf16_t>(f[1] * s).bits << 16);
        unsigned int hi = (unsigned int)from_f<bf16_t>(f[2] * s).bits | ((unsigned int)from_f<bf16_t>(f[3] * s).bits << 16);
        *(uint2*)(w + i * 4) = make_uint2(lo, hi);
    }
}

// The FP8 GEMM's epilogue: cuBLASLt wrote the unscaled product of the e4m3 codes to y[m, n];
// each entry takes its input row's scale, its weight row's scale and the bias.
extern "C" __global__ void fp8_gemm_scale(bf16_t* __restrict__ y, const float* __restrict__ sx,
                                          const float* __restrict__ sw, const bf16_t* __restrict__ bias, int m,
                                          int n) {
    pdl_wait();
    GRID_STRIDE(i, (size_t)m * n) {
        const size_t row = i / n, col = i % n;
        float v = to_f(y[i]) * (sx[row] * sw[col]);
        if (bias) v += to_f(bias[col]);
        y[i] = from_f<bf16_t>(v);
    }
}
