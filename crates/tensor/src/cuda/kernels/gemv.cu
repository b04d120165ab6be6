// `y[m, n] (+)= x[m, k] w[n, k]^T` in bf16 for decode-sized m (1 to `GEMV_MAX_ROWS` in matmul.rs):
// one warp per output column streams its weight row in 16-byte loads, four in flight per lane and
// allocated past L1 so that the x rows, read for every weight row, stay there.
//
// Two fused forms save launches at decode, where a step is hundreds of short kernels:
// `gemv3` computes up to three products of the same x (q/k/v) in one grid, and `gemv_gated`
// computes `act(x wg^T) * (x wu^T)` with each warp streaming its gate and up rows together.
// Every output is summed in the same order as by `gemv_bf16` and rounded to bf16 where the
// unfused ops would round it, so the fused and unfused paths give the same bits.

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
// Instantiated by the gemv module only (kernels.rs): the int4 and FP8 modules include this file for its helpers.
