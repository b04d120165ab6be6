// Tensor-core prefill (bf16, head dims D and DV multiples of 16 and 8): the work item of
// `paged_attn` (16 query vectors of one KV head) as the M = 16 side of `mma.m16n8k16`. Each of
// the 4 warps takes 16 keys of every 64-key tile and keeps its own online softmax (scores, row
// statistics and the output accumulator stay in the MMA fragments' registers; a thread holds
// rows g and g + 8 of its fragments, g = lane / 4); the warps' states merge at the end as split
// partials do. Probabilities are rounded to bf16 for the P.V product, as flash attention does.

__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int D, int DV>
__device__ void paged_attn_mma(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,
                               const unsigned int* __restrict__ tables, const AttnItem* __restrict__ items,
                               bf16_t* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                               int hq, int hkv, int k_dim, int v_dim, int block_size, float scale, float softcap,
                               int window, int attn_chunk, int causal, int splits, int n_rows,
                               const float* __restrict__ sinks) {
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
                bool valid = qok[i] && kp < kend &&
                             (!causal || (kp <= max(pos[i], it.last) && (window == 0 || kp > pos[i] - window) &&
                                          (attn_chunk == 0 || kp >= pos[i] - pos[i] % attn_chunk)));
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
        if (splits == 1 && sinks != nullptr) {
            float mb = -INFINITY;
            for (int w = 0; w < NWARPS; ++w) mb = fmaxf(mb, m_s[w * 16 + qv]);
            out[((size_t)row * hq + h) * DV + c] = from_f<bf16_t>(o_s[e] * sink_norm(mb, l, sinks[h]));
        } else if (splits == 1) {
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
        float scale, float softcap, int window, int attn_chunk, int causal, int splits, int n_rows,               \
        const float* sinks) {                                                                                      \
        pdl_wait();                                                                                                \
        paged_attn_mma<D, DV>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, k_dim, v_dim, block_size, \
                              scale, softcap, window, attn_chunk, causal, splits, n_rows, sinks);                  \
    }
INST_MMA(64, 64) INST_MMA(128, 128) INST_MMA(256, 256)
