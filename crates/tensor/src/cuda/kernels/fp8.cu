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

// W8A8 products of up to 8 input rows on FP8 tensor cores (sm_89+): x quantized to e4m3 bytes
// with a scale per row (fp8_quant_rows_bf16), weights with one scale per row. A block of 8 warps
// takes 16 weight rows; warp w takes the 64-input steps w, w + 8, ... of k, and each step is two
// m16n8k32 MMAs (16 weight rows by 8 input rows). The sum over k is blind to the order of k, so a
// lane loads 16 contiguous bytes of its rows and of its input row per step, and the same bytes
// stand for the MMA fragments' k indices in A and in B (the fragments' own k order would need
// 4-byte loads). The warps' partial sums meet in shared memory in a fixed order.
#define FP8_MMA_WARPS 8
#define FP8_MMA_ROWS 16

__device__ __forceinline__ void mma_e4m3(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();  // the host launches these kernels only on compute capability 8.9 and above
#endif
}

// This warp's part of the dots of R groups of 16 weight rows (this lane's rows g and g + 8 start
// at lo[r] and hi[r], null past the matrix) with input row g of qx (none past m); c as the MMA's
// accumulator fragment: rows g (c[0], c[1]) and g + 8 (c[2], c[3]), inputs 2t and 2t + 1.
template <int R, int U>
__device__ __forceinline__ void fp8_mma_dots(const unsigned char* __restrict__ qx, int m, int k,
                                             const unsigned char* const (&lo)[R], const unsigned char* const (&hi)[R],
                                             float (&c)[R][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const unsigned char* xr = g < m ? qx + (size_t)g * k : nullptr;
    const int steps = (k + 63) >> 6;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[r][i] = 0.f;
    for (int s0 = warp; s0 < steps; s0 += FP8_MMA_WARPS * U) {
        uint4 a[R][U][2], b[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            // A step past the last one starts past k.
            const int off = (s0 + u * FP8_MMA_WARPS) * 64 + 16 * t;
            const bool in = off < k;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                a[r][u][0] = in && lo[r] ? ld_stream(lo[r] + off) : zero;
                a[r][u][1] = in && hi[r] ? ld_stream(hi[r] + off) : zero;
            }
            b[u] = in && xr ? __ldg((const uint4*)(xr + off)) : zero;
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                mma_e4m3(c[r], a[r][u][0].x, a[r][u][1].x, a[r][u][0].y, a[r][u][1].y, b[u].x, b[u].y);
                mma_e4m3(c[r], a[r][u][0].z, a[r][u][1].z, a[r][u][0].w, a[r][u][1].w, b[u].z, b[u].w);
            }
    }
}

// The block's sums of this lane's fragment, in warp 0 (which returns true; the others false).
template <int R>
__device__ __forceinline__ bool fp8_mma_reduce(float (&c)[R][4]) {
    __shared__ float part[FP8_MMA_WARPS - 1][R * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp > 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[warp - 1][r * 4 + i][lane] = c[r][i];
    }
    __syncthreads();
    if (warp > 0) return false;
    for (int w = 0; w < FP8_MMA_WARPS - 1; ++w)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[r][i] += part[w][r * 4 + i][lane];
    return true;
}

// The grid covers n0, n1 and n2 rows in blocks of 16 (a product with n = 0 is absent);
// y_p[i, j] (+)= sum * sx[i] * s_p[j].
extern "C" __global__ void fp8_mma3(const unsigned char* __restrict__ qx, const float* __restrict__ sx, int m, int k,
                                    const unsigned char* w0, const float* s0, bf16_t* y0, int n0, int a0,
                                    const unsigned char* w1, const float* s1, bf16_t* y1, int n1, int a1,
                                    const unsigned char* w2, const float* s2, bf16_t* y2, int n2, int a2) {
    pdl_wait();
    int row0 = blockIdx.x * FP8_MMA_ROWS;
    const unsigned char* w = w0;
    const float* sw = s0;
    bf16_t* y = y0;
    int n = n0, a = a0;
    const int blocks0 = (n0 + FP8_MMA_ROWS - 1) / FP8_MMA_ROWS, blocks1 = (n1 + FP8_MMA_ROWS - 1) / FP8_MMA_ROWS;
    if ((int)blockIdx.x >= blocks0) {
        row0 -= blocks0 * FP8_MMA_ROWS;
        w = w1; sw = s1; y = y1; n = n1; a = a1;
        if ((int)blockIdx.x >= blocks0 + blocks1) {
            row0 -= blocks1 * FP8_MMA_ROWS;
            w = w2; sw = s2; y = y2; n = n2; a = a2;
        }
    }
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned char* const lo[1] = {row0 + g < n ? w + (size_t)(row0 + g) * k : nullptr};
    const unsigned char* const hi[1] = {row0 + g + 8 < n ? w + (size_t)(row0 + g + 8) * k : nullptr};
    float c[1][4];
    fp8_mma_dots<1, 4>(qx, m, k, lo, hi, c);
    if (!fp8_mma_reduce<1>(c)) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = row0 + g + (i >> 1) * 8, in = 2 * t + (i & 1);
        if (row < n && in < m) {
            float v = c[0][i] * (sx[in] * sw[row]);
            const size_t o = (size_t)in * n + row;
            if (a) v += to_f(y[o]);
            y[o] = from_f<bf16_t>(v);
        }
    }
}

// y[i, j] = act(x wg^T) * (x wu^T), each product rounded to bf16 first (as two products would be).
extern "C" __global__ void fp8_mma_gated(const unsigned char* __restrict__ qx, const float* __restrict__ sx, int m,
                                         int k, const unsigned char* __restrict__ wg, const float* __restrict__ sg,
                                         const unsigned char* __restrict__ wu, const float* __restrict__ su,
                                         bf16_t* __restrict__ y, int n, int act) {
    pdl_wait();
    const int row0 = blockIdx.x * FP8_MMA_ROWS;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool lo_in = row0 + g < n, hi_in = row0 + g + 8 < n;
    const size_t lo_off = (size_t)(row0 + g) * k, hi_off = (size_t)(row0 + g + 8) * k;
    const unsigned char* const lo[2] = {lo_in ? wg + lo_off : nullptr, lo_in ? wu + lo_off : nullptr};
    const unsigned char* const hi[2] = {hi_in ? wg + hi_off : nullptr, hi_in ? wu + hi_off : nullptr};
    float c[2][4];
    fp8_mma_dots<2, 2>(qx, m, k, lo, hi, c);
    if (!fp8_mma_reduce<2>(c)) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = row0 + g + (i >> 1) * 8, in = 2 * t + (i & 1);
        if (row < n && in < m) {
            const float gate = to_f(from_f<bf16_t>(c[0][i] * (sx[in] * sg[row])));
            const float up = to_f(from_f<bf16_t>(c[1][i] * (sx[in] * su[row])));
            y[(size_t)in * n + row] = from_f<bf16_t>(activate(act, gate) * up);
        }
    }
}
