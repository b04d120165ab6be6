// Sampling, `cpu::sampling` step for step (its module doc has the semantics): one block of
// SAMPLE_THREADS threads per row reads the row a pass at a time (the max; per filter eight radix
// passes; the top-p mass; the race) and writes one token id.
//
// The filters' thresholds are order keys of the scaled logits found by a radix select, 4 bits a
// pass from the top: each pass histograms into 16 bins the survivors that share the digits
// chosen so far, weighing each by 1 (top-k: exact counts, so the exact k-th value) or by its
// unnormalised probability (top-p). The bins are summed in a fixed order rather than with
// float atomics, so a row samples the same token on every run. Products and differences that
// the CPU computes separately use `__fmul_rn`/`__fsub_rn`, which NVRTC never fuses into an FMA.

// Laid out as `SamplePlan` in sampling.rs (the NVRTC unit test checks that they agree).
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
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                                   \
        sample_rows_##TN(const T* x, const SamplePlan* plans, unsigned int* out, int cols) { pdl_wait();           \
        sample_rows<T>(x, plans, out, cols);                                                                       \
    }
FOR_T(INST_T)

// Structured outputs: every logit whose token's bit is clear in its row of `bitmask` (`words`
// 32-bit words a row, bit c % 32 of word c / 32 for column c) becomes -inf in `out`.
template <typename T>
__device__ void mask_tokens(const T* x, const unsigned int* bitmask, T* out, int cols, int words) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const size_t i = (size_t)blockIdx.y * cols + c;
    const bool allowed = (bitmask[(size_t)blockIdx.y * words + (c >> 5)] >> (c & 31)) & 1u;
    out[i] = allowed ? x[i] : from_f<T>(-INFINITY);
}

#define INST_MASK(TN, T)                                                                                           \
    extern "C" __global__ void mask_tokens_##TN(const T* x, const unsigned int* bitmask, T* out, int cols,         \
                                                int words) { pdl_wait();                                           \
        mask_tokens<T>(x, bitmask, out, cols, words);                                                              \
    }
FOR_T(INST_MASK)
