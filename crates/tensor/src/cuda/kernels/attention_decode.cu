// `paged_decode` serves single-token rows (decode), which are bound by reading the cache: a
// block takes one row, up to 8 query heads of one KV group and a range of keys, and walks it
// DEC_SUB keys at a time: every thread scores one key (the whole K row in 16-byte loads, eight in
// flight), the block takes the softmax statistics of the DEC_SUB scores, then each warp
// accumulates a quarter of the V rows (lanes across the head dimension, coalesced).

#define DEC_UNROLL 8  // 16-byte key loads a thread has in flight; the kernel's own, not shared with Rust

__device__ __forceinline__ int decode_slot(const unsigned int* __restrict__ tables, int bt_off, int kp, int block_size) {
    return (int)(tables[bt_off + kp / block_size] * block_size + kp % block_size);
}

template <typename T, typename C, int HM, int DVR>
__device__ void paged_decode(const T* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
                             const unsigned int* __restrict__ tables, const DecodeItem* __restrict__ items,
                             T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml, int hq,
                             int hkv, int d, int dv, int k_dim, int v_dim, int block_size, float scale, float softcap,
                             int splits, int n_rows, int vec, unsigned int* __restrict__ done,
                             const float* __restrict__ sinks, float vscale) {
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
    const C* kbase = kc + (size_t)g * k_dim;
    const C* vbase = vc + (size_t)g * v_dim;
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
            const C* kr = kbase + (size_t)slot * kstride;
            if (vec) {
                constexpr int CH = 16 / sizeof(C);
                for (int c0 = 0; c0 < d; c0 += DEC_UNROLL * CH) {
                    uint4 raw[DEC_UNROLL];
#pragma unroll
                    for (int u = 0; u < DEC_UNROLL; ++u)
                        raw[u] = c0 + u * CH < d ? __ldg((const uint4*)(kr + c0 + u * CH)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                    for (int u = 0; u < DEC_UNROLL; ++u) {
                        if (c0 + u * CH < d) {
                            float kf[CH];
                            unpack(raw[u], kf, C());
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
            const C* vr = vbase + (size_t)slot_s[j] * vstride;
            float vv[DVR];
#pragma unroll
            for (int i = 0; i < DVR; ++i) vv[i] = lane + 32 * i < dv ? from_cache(vr[lane + 32 * i], vscale) : 0.f;
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
            out[((size_t)it.row * hq + it.h0 + h) * dv + c] =
                from_f<T>(sinks != nullptr ? a * sink_norm(m_s[h], l_s[h], sinks[it.h0 + h]) : a / l_s[h]);
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
        if (lane == 0) l_s[h] = sinks != nullptr ? sink_norm(m, l, sinks[it.h0 + h]) : l > 0.f ? 1.f / l : 0.f;
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

// Decode kernels for up to HM heads a block and values of up to 32 * DVR elements: sized
// register arrays instead of predicated-off work for the common GQA groups and head dims. A cache
// of the activations' type takes `paged_decode_<t>_h<HM>_v<DVR>`, an FP8 one
// `paged_decode_<t>_fp8_h<HM>_v<DVR>` (its key scale folded into `scale`, its value scale `vscale`).
#define INST_DECODE(TN, T, CN, C, HM, DVR)                                                                         \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) paged_decode_##TN##CN##_h##HM##_v##DVR(           \
        const T* q, const C* kc, const C* vc, const unsigned int* tables, const DecodeItem* items, T* out,         \
        float* part_acc, float* part_ml, int hq, int hkv, int d, int dv, int k_dim, int v_dim, int block_size,     \
        float scale, float softcap, int splits, int n_rows, int vec, unsigned int* done, const float* sinks,       \
        float vscale) {                                                                                            \
        paged_decode<T, C, HM, DVR>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, d, dv, k_dim, v_dim, \
                                    block_size, scale, softcap, splits, n_rows, vec, done, sinks, vscale);         \
    }
// The decode kernels are most of the attention PTX, so each (activation, cache, value width) is a
// module of its own (kernels.rs), compiled on a thread of its own at start-up.
#define INST_DECODE_V(TN, T, CN, C, DVR)                                                                           \
    INST_DECODE(TN, T, CN, C, 1, DVR) INST_DECODE(TN, T, CN, C, 2, DVR) INST_DECODE(TN, T, CN, C, 4, DVR)          \
    INST_DECODE(TN, T, CN, C, 8, DVR)
