// W4A16 products `y[m, n] (+)= x[m, k] w[n, k]^T`, w kept as 4-bit integers with a bf16 scale per
// group of inputs, in the order `int4.rs` (`kernel_layout`) repacks it to.
//
// `w4a16x3_mt<MT>` takes m <= 16 * MT rows (decode and small batches) on tensor cores: each warp
// streams 16-byte words of packed weights, turns each nibble pair into a bf16x2 with one lop3
// ((nibble | 0x4300) is 128 + nibble in bf16), subtracts 136 and multiplies by the scale in bf16
// (so the weight is q * scale rounded to bf16, as transformers' dequantized weight is), and feeds
// the pairs to `mma.m16n8k16` as B fragments; a lane's A fragment for two 16-input steps is one
// 16-byte load, as the layout permutes the inputs to make it so. Larger m is dequantized to bf16
// (`int4_dequant_bf16`) for cuBLAS.
//
// A block's INT4_WARPS warps take every INT4_WARPS-th 64-input chunk of one 16-row strip of w;
// the grid's y dimension splits the inputs among blocks (how many depends on k alone, int4.rs).
// The warps sum in shared memory; split blocks leave f32 partials, and the last block of a strip
// to finish (counted in `counters`, zero at launch) adds them in split order. Every sum has a
// fixed order, so a row's result depends neither on m nor on the products launched with it.

__device__ __forceinline__ unsigned int nibble_pair(unsigned int w) {
    unsigned int r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(0x000F000Fu), "r"(0x43004300u));
    return r;
}

// The low nibbles of w's two halves as weights: (128 + nibble) * 1 - 136 is exact, and the
// product with the scale pair is rounded once (adding -0 keeps it a plain product).
__device__ __forceinline__ unsigned int dequant_pair(unsigned int w, unsigned int scale2) {
    unsigned int q, r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(nibble_pair(w)), "r"(0x3F803F80u), "r"(0xC308C308u));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(q), "r"(scale2), "r"(0x80008000u));
    return r;
}

// Scale word (row g low, row g + 8 high) as the pair for each row.
__device__ __forceinline__ unsigned int low_pair(unsigned int s2) { return __byte_perm(s2, 0, 0x1010); }
__device__ __forceinline__ unsigned int high_pair(unsigned int s2) { return __byte_perm(s2, 0, 0x3232); }

template <int MT>
__device__ __forceinline__ void w4a16_batch(const bf16_t* __restrict__ x, const uint4 (&wv)[INT4_UNROLL],
                                            const unsigned int* __restrict__ ss, int c, int c1, int m, int k,
                                            int group, int g, int t, float (&acc)[MT][2][4]) {
#pragma unroll
    for (int u = 0; u < INT4_UNROLL; ++u) {
        const int cu = c + u * INT4_WARPS;
        if (cu >= c1) break;
        const unsigned int words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int kb = cu * 64 + b * 32;
            const unsigned int s2 = __ldg(ss + (size_t)(kb / group) * 8);
            const unsigned int s_lo = low_pair(s2), s_hi = high_pair(s2);
            uint4 xa[MT], xb[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int ra = mt * 16 + g, rb = ra + 8;
                xa[mt] = ra < m ? __ldg((const uint4*)(x + (size_t)ra * k + kb + 8 * t)) : make_uint4(0, 0, 0, 0);
                xb[mt] = rb < m ? __ldg((const uint4*)(x + (size_t)rb * k + kb + 8 * t)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const unsigned int w = words[2 * b + j];
                const unsigned int b00 = dequant_pair(w, s_lo), b01 = dequant_pair(w >> 4, s_lo);
                const unsigned int b10 = dequant_pair(w >> 8, s_hi), b11 = dequant_pair(w >> 12, s_hi);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const unsigned int a[4] = {j ? xa[mt].z : xa[mt].x, j ? xb[mt].z : xb[mt].x,
                                               j ? xa[mt].w : xa[mt].y, j ? xb[mt].w : xb[mt].y};
                    mma_bf16_16816(acc[mt][0], a, b00, b01);
                    mma_bf16_16816(acc[mt][1], a, b10, b11);
                }
            }
        }
    }
}

// Element i = (mt, nt, e) of a lane's accumulators: row mt * 16 + g (+ 8 for e >= 2), column
// strip * 16 + nt * 8 + 2t + (e & 1).
__device__ __forceinline__ int acc_row(int i, int g) { return (i >> 3) * 16 + g + ((i & 2) ? 8 : 0); }
__device__ __forceinline__ int acc_col(int i, int strip, int t) { return strip * 16 + ((i >> 2) & 1) * 8 + 2 * t + (i & 1); }

// One product of a launch: its packed weight, scale words, output, rows of w and whether y holds
// a bias to add onto.
struct Int4Product {
    const uint4* wq;
    const unsigned int* sc;
    bf16_t* y;
    int n, accumulate;
};

// Strip `strip` of product `p` (strip `gstrip`, column `col0 + ...` of the launch's columns
// `ncols`, as partials and counters count them).
template <int MT>
__device__ void w4a16(const bf16_t* __restrict__ x, const Int4Product p, int strip, int gstrip, int col0, int ncols,
                      float* __restrict__ partial, unsigned int* __restrict__ counters, int m, int k, int group) {
    __shared__ float red[INT4_WARPS][MT * 8][32];
    __shared__ int last;
    const int split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int chunks = k / 64, groups = k / group;
    const int c0 = (int)((long long)chunks * split / splits), c1 = (int)((long long)chunks * (split + 1) / splits);
    const uint4* ws = p.wq + (size_t)strip * chunks * 32 + lane;
    const unsigned int* ss = p.sc + (size_t)strip * groups * 8 + g;

    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[mt][e >> 2][e & 3] = 0.f;

    // The first weight loads go out before waiting on the previous kernel (weights are no
    // kernel's output), so that their latency overlaps its end.
    uint4 wv[INT4_UNROLL];
    int c = c0 + warp;
#pragma unroll
    for (int u = 0; u < INT4_UNROLL; ++u)
        if (c + u * INT4_WARPS < c1) wv[u] = ld_stream(ws + (size_t)(c + u * INT4_WARPS) * 32);
    pdl_wait();
    for (; c < c1; c += INT4_WARPS * INT4_UNROLL) {
        if (c != c0 + warp) {
#pragma unroll
            for (int u = 0; u < INT4_UNROLL; ++u)
                if (c + u * INT4_WARPS < c1) wv[u] = ld_stream(ws + (size_t)(c + u * INT4_WARPS) * 32);
        }
        w4a16_batch<MT>(x, wv, ss, c, c1, m, k, group, g, t, acc);
    }

#pragma unroll
    for (int i = 0; i < MT * 8; ++i) red[warp][i][lane] = acc[i >> 3][(i >> 2) & 1][i & 3];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int i = 0; i < MT * 8; ++i) {
            float v = red[0][i][lane];
#pragma unroll
            for (int w = 1; w < INT4_WARPS; ++w) v += red[w][i][lane];
            const int row = acc_row(i, g), col = acc_col(i, strip, t);
            if (row >= m) continue;
            if (splits == 1) {
                const size_t o = (size_t)row * p.n + col;
                if (p.accumulate) v += to_f(p.y[o]);
                p.y[o] = from_f<bf16_t>(v);
            } else {
                partial[((size_t)split * m + row) * ncols + col0 + col] = v;
            }
        }
    }
    if (splits == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + gstrip, 1u) == (unsigned int)(splits - 1);
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    if (lane == 0) counters[gstrip] = 0u;  // zero again, whoever replays the launch
#pragma unroll
    for (int i = 0; i < MT * 8; ++i) {
        const int row = acc_row(i, g), col = acc_col(i, strip, t);
        if (row >= m) continue;
        float v = 0.f;
        for (int z = 0; z < splits; ++z) v += __ldcg(partial + ((size_t)z * m + row) * ncols + col0 + col);
        const size_t o = (size_t)row * p.n + col;
        if (p.accumulate) v += to_f(p.y[o]);
        p.y[o] = from_f<bf16_t>(v);
    }
}

// Up to three products of one x (q/k/v, gate/up) in one grid: blockIdx.x runs over the strips of
// each in turn; a product with n = 0 is absent.
template <int MT>
__device__ void w4a16x3(const bf16_t* x, int m, int k, int group, float* partial, unsigned int* counters,
                        const Int4Product (&ps)[3]) {
    const int ncols = ps[0].n + ps[1].n + ps[2].n;
    int strip = blockIdx.x, col0 = 0;
    Int4Product p = ps[0];
    if (strip >= ps[0].n / 16) {
        strip -= ps[0].n / 16;
        col0 += ps[0].n;
        p = ps[1];
        if (strip >= ps[1].n / 16) {
            strip -= ps[1].n / 16;
            col0 += ps[1].n;
            p = ps[2];
            if (strip >= ps[2].n / 16) {
                pdl_wait();
                return;
            }
        }
    }
    w4a16<MT>(x, p, strip, blockIdx.x, col0, ncols, partial, counters, m, k, group);
}

#define INST_W4A16(MT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(INT4_WARPS * 32)                                                 \
        w4a16x3_mt##MT(const bf16_t* x, int m, int k, int group, float* partial, unsigned int* counters,          \
                       const uint4* wq0, const unsigned int* sc0, bf16_t* y0, int n0, int a0, const uint4* wq1,     \
                       const unsigned int* sc1, bf16_t* y1, int n1, int a1, const uint4* wq2,                     \
                       const unsigned int* sc2, bf16_t* y2, int n2, int a2) {                                     \
        const Int4Product ps[3] = {{wq0, sc0, y0, n0, a0}, {wq1, sc1, y1, n1, a1}, {wq2, sc2, y2, n2, a2}};      \
        w4a16x3<MT>(x, m, k, group, partial, counters, ps);                                                     \
    }
INST_W4A16(1) INST_W4A16(2) INST_W4A16(4)

// w[n, k] in bf16 from the packed layout: each thread expands one word (two rows' four inputs).
extern "C" __global__ void int4_dequant_bf16(const unsigned int* __restrict__ wq, const unsigned int* __restrict__ sc,
                                             bf16_t* __restrict__ w, int n, int k, int group) {
    pdl_wait();
    const size_t chunks = k / 64, groups = k / group;
    GRID_STRIDE(i, (size_t)n * k / 8) {
        const int step = (int)(i & 3), lane = (int)((i >> 2) & 31);
        const size_t chunk = (i >> 7) % chunks, strip = (i >> 7) / chunks;
        const int g = lane >> 2, t = lane & 3;
        const size_t row = strip * 16 + g;
        const size_t col = chunk * 64 + (step >> 1) * 32 + 8 * t + 4 * (step & 1);
        const unsigned int s2 = sc[(strip * groups + col / group) * 8 + g];
        const unsigned int word = wq[i];
        *(uint2*)(w + row * k + col) = make_uint2(dequant_pair(word, low_pair(s2)), dequant_pair(word >> 4, low_pair(s2)));
        *(uint2*)(w + (row + 8) * k + col) =
            make_uint2(dequant_pair(word >> 8, high_pair(s2)), dequant_pair(word >> 12, high_pair(s2)));
    }
}
