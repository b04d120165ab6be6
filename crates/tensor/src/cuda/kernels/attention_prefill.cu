// `paged_attn` serves rows of multi-token chunks (prefill). A work item is up to QV_MAX query
// vectors (rows x heads of one sequence, all reading one KV head) that share every key/value
// tile the block stages in shared memory. Tiles hold TILE keys, one per lane when scoring; each
// of the NWARPS warps owns up to QPW query vectors and keeps an online softmax for them. It runs
// on CUDA cores; attention_fa2.cu has the tensor-core form.

__device__ __forceinline__ float2 load2(const float* p) { return make_float2(p[0], p[1]); }
__device__ __forceinline__ float2 load2(const bf16_t* p) {
    unsigned int u = *(const unsigned int*)p;
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
__device__ __forceinline__ float2 load2(const fp8_t* p) { return make_float2(to_f(p[0]), to_f(p[1])); }

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
            dst[j * pitch + c] = slot[j] >= 0 ? src[(size_t)slot[j] * stride + c] : T{};
        }
    }
}

template <typename T, typename C>
__device__ void paged_attn(const T* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
                           const unsigned int* __restrict__ tables, const AttnItem* __restrict__ items,
                           T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                           int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size, float scale,
                           float softcap, int window, int attn_chunk, int causal, int splits, int n_rows,
                           int kpitch, int vpitch, int vec, const float* __restrict__ sinks, float vscale) {
    extern __shared__ float smem[];
    float* q_s = smem;                                    // [QV_MAX][d]
    float* p_s = q_s + QV_MAX * d;                        // [NWARPS][QPW][TILE]
    int* slot_s = (int*)(p_s + NWARPS * QPW * TILE);      // [TILE]
    C* k_s = (C*)(slot_s + TILE);                         // [TILE][kpitch]
    C* v_s = k_s + TILE * kpitch;                         // [TILE][vpitch]

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
    const C* kbase = kc + (size_t)g * k_dim;
    const C* vbase = vc + (size_t)g * v_dim;

    for (int t0 = kbeg; t0 < kend; t0 += TILE) {
        __syncthreads();  // the previous tile's readers are done (and q_s is written, the first time)
        if (threadIdx.x < TILE) {
            int kp = t0 + threadIdx.x;
            slot_s[threadIdx.x] = kp < kend ? (int)(tables[it.bt_off + kp / block_size] * block_size + kp % block_size) : -1;
        }
        __syncthreads();
        load_tile<C>(k_s, kpitch, kbase, kstride, slot_s, d, vec);
        load_tile<C>(v_s, vpitch, vbase, vstride, slot_s, dv, vec);
        __syncthreads();
        if (nu == 0) continue;

        float s[QPW];
#pragma unroll
        for (int u = 0; u < QPW; ++u) s[u] = 0.f;
        const C* kr = k_s + lane * kpitch;
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
                bool valid = kp < kend && (!causal || (kp <= max(pos[u], it.last) && (window == 0 || kp > pos[u] - window) &&
                                                       (attn_chunk == 0 || kp >= pos[u] - pos[u] % attn_chunk)));
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
            const C* vr = v_s + j * vpitch;
#pragma unroll
            for (int i = 0; i < DV_REGS; ++i) {
                int c = lane + 32 * i;
                if (c < dv) {
                    float vv = from_cache(vr[c], vscale);
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
        float inv = sinks != nullptr ? sink_norm(m_[u], l_[u], sinks[h]) : l_[u] > 0.f ? 1.f / l_[u] : 0.f;
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

// A cache of the activations' type takes `paged_attn_<t>`, an FP8 one `paged_attn_<t>_fp8` (its
// key scale folded into `scale`, its value scale `vscale`).
#define INST_PREFILL_C(TN, T, CN, C)                                                                               \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32) paged_attn_##TN##CN(                                 \
        const T* q, const C* kc, const C* vc, const unsigned int* tables, const AttnItem* items, T* out,           \
        float* part_acc, float* part_ml, int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size,     \
        float scale, float softcap, int window, int attn_chunk, int causal, int splits, int n_rows, int kpitch,    \
        int vpitch, int vec, const float* sinks, float vscale) { pdl_wait();                                       \
        paged_attn<T, C>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, d, dv, k_dim, v_dim,           \
                         block_size, scale, softcap, window, attn_chunk, causal, splits, n_rows, kpitch, vpitch,   \
                         vec, sinks, vscale);                                                                      \
    }
#define INST_PREFILL(TN, T) INST_PREFILL_C(TN, T, , T) INST_PREFILL_C(TN, T, _fp8, fp8_t)
FOR_T(INST_PREFILL)
