// Tensor-core prefill laid out as FlashAttention-2 (bf16, equal head dims D = DV, a multiple of
// 16). It replaced a kernel whose blocks served 16 query vectors, each warp taking a quarter of
// every key tile: at 4 times the query vectors per key read, a 16k-token prompt reached its
// first token 3.2 times sooner on an H100 (benches/results/cuda-long-prefill-h100-2026-12-07.json).
//
// A block serves one work item of up to FA2_QV query vectors (rows x heads of one KV head), and
// each of its NWARPS warps owns 16 of them as the M = 16 side of `mma.m16n8k16`, keeping their
// online softmax in registers (a thread holds fragment rows g and g + 8, g = lane / 4). All warps
// multiply the same MMA_TK-key tile, which cp.async stages in shared memory while the previous
// tile is multiplied, so each key read from the cache serves FA2_QV query vectors. Scores are kept
// in base-2 units (scale folded with log2 e) so that one exp2 per score does the softmax;
// probabilities are rounded to bf16 for the P.V product, as flash attention does.

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned int shared_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16 bytes from global to shared memory without passing through registers; zeros where `valid`
// is false (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 bf16 matrices, lane l giving the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_addr(p)));
}

// Eight cached elements of a row into eight bf16 of a shared-memory tile: a bf16 cache's by
// cp.async; an FP8 cache's through registers, times `s` (its value scale; 1 for keys, whose scale
// is in the softmax scale), converted to bf16 (exact where `s` is 1: e4m3 fits in bf16).
__device__ __forceinline__ void stage8(unsigned short* dst, const bf16_t* src, bool ok, float) {
    cp_async_16(dst, src, ok);
}
__device__ __forceinline__ void stage8(unsigned short* dst, const fp8_t* src, bool ok, float s) {
    const uint2 raw = ok ? *(const uint2*)src : make_uint2(0u, 0u);
    float f[8];
    e4m3x4(raw.x, f);
    e4m3x4(raw.y, f + 4);
    *(uint4*)dst = make_uint4(pack_bf16x2(f[0] * s, f[1] * s), pack_bf16x2(f[2] * s, f[3] * s),
                              pack_bf16x2(f[4] * s, f[5] * s), pack_bf16x2(f[6] * s, f[7] * s));
}

template <int D, typename C>
__device__ void paged_attn_fa2(const bf16_t* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
                               const unsigned int* __restrict__ tables, const AttnItem* __restrict__ items,
                               bf16_t* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                               int hq, int hkv, int k_dim, int v_dim, int block_size, float scale, float softcap,
                               int window, int attn_chunk, int causal, int splits, int n_rows,
                               const float* __restrict__ sinks, float vscale) {
    // Row pitch of every tile: rows of D + 8 bf16 put the 8 rows an ldmatrix reads on distinct banks.
    constexpr int P = D + 8;
    constexpr int TILE_ELEMS = MMA_TK * P;
    extern __shared__ uint4 fa2_smem[];
    unsigned short* q_s = (unsigned short*)fa2_smem;  // [FA2_QV][P]
    unsigned short* kv_s = q_s + FA2_QV * P;          // [FA2_STAGES][keys, values][MMA_TK][P]

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

    const size_t kstride = (size_t)hkv * k_dim, vstride = (size_t)hkv * v_dim;
    const C* kbase = kc + (size_t)kvh * k_dim;
    const C* vbase = vc + (size_t)kvh * v_dim;
    auto load_tile = [&](int stage, int t0) {
        unsigned short* k_s = kv_s + stage * 2 * TILE_ELEMS;
        unsigned short* v_s = k_s + TILE_ELEMS;
        for (int e = threadIdx.x; e < MMA_TK * (D / 8); e += blockDim.x) {
            const int j = e / (D / 8), c = (e % (D / 8)) * 8;
            const int kp = t0 + j;
            const bool ok = kp < kend;
            const size_t slot = ok ? (size_t)tables[it.bt_off + kp / block_size] * block_size + kp % block_size : 0;
            stage8(k_s + j * P + c, kbase + slot * kstride + c, ok, 1.f);
            stage8(v_s + j * P + c, vbase + slot * vstride + c, ok, vscale);
        }
        cp_async_commit();
    };
    const int ntiles = kend > kbeg ? (kend - kbeg + MMA_TK - 1) / MMA_TK : 0;
    if (ntiles > 0) load_tile(0, kbeg);

    // The item's query vectors, zero past nqv (their rows are masked and never written).
    for (int e = threadIdx.x; e < FA2_QV * (D / 8); e += blockDim.x) {
        const int qv = e / (D / 8), c = (e % (D / 8)) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (qv < nqv)
            val = *(const uint4*)(q + ((size_t)(it.row0 + qv / it.nheads) * hq + it.h0 + qv % it.nheads) * D + c);
        *(uint4*)(q_s + qv * P + c) = val;
    }

    // This warp's query vectors (fragment rows g and g + 8), their positions, and the end of the
    // keys any of them sees: later tiles are all masked for this warp.
    const int qv0 = warp * 16;
    int pos[2];
    bool qok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int qv = qv0 + g + 8 * i;
        qok[i] = qv < nqv;
        pos[i] = it.pos0 + min(qv, nqv - 1) / it.nheads;
    }
    int warp_end = kbeg;
    if (qv0 < nqv) {
        const int last_pos = max(it.pos0 + min(qv0 + 15, nqv - 1) / it.nheads, it.last);
        warp_end = causal ? min(kend, last_pos + 1) : kend;
    }
    const float qk_scale = softcap > 0.f ? scale : scale * LOG2E;

    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_[2] = {-INFINITY, -INFINITY}, l_[2] = {0.f, 0.f};

    for (int ti = 0; ti < ntiles; ++ti) {
        const int t0 = kbeg + ti * MMA_TK;
        if (ti + 1 < ntiles) {
            load_tile((ti + 1) & 1, t0 + MMA_TK);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile ti (and, the first time, the queries) visible to every warp
        if (t0 < warp_end) {
            const unsigned short* k_s = kv_s + (ti & 1) * 2 * TILE_ELEMS;
            const unsigned short* v_s = k_s + TILE_ELEMS;
            float s[MMA_TK / 8][4];
#pragma unroll
            for (int nt = 0; nt < MMA_TK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
                unsigned int a[4];
                ldmatrix_x4(a, q_s + (qv0 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + ks * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int np = 0; np < MMA_TK / 16; ++np) {
                    unsigned int b[4];
                    ldmatrix_x4(b, k_s + (np * 16 + (lane & 7) + (lane >> 4) * 8) * P + ks * 16 + ((lane >> 3) & 1) * 8);
                    mma_bf16_16816(s[2 * np], a, b[0], b[1]);
                    mma_bf16_16816(s[2 * np + 1], a, b[2], b[3]);
                }
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < MMA_TK / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const int kp = t0 + nt * 8 + t * 2 + (e & 1);
                    float x = s[nt][e] * qk_scale;
                    if (softcap > 0.f) x = tanhf(x / softcap) * softcap * LOG2E;
                    const bool valid =
                        qok[i] && kp < kend &&
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
                const float m_new = fmaxf(m_[i], mx[i]);
                corr[i] = m_[i] == -INFINITY ? 0.f : exp2f(m_[i] - m_new);
                m_[i] = m_new;
                l_[i] *= corr[i];
            }
#pragma unroll
            for (int nt = 0; nt < MMA_TK / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1;
                    const float p = m_[i] == -INFINITY ? 0.f : exp2f(s[nt][e] - m_[i]);
                    s[nt][e] = p;
                    l_[i] += p;
                }
            }
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                o[j][0] *= corr[0]; o[j][1] *= corr[0]; o[j][2] *= corr[1]; o[j][3] *= corr[1];
            }
#pragma unroll
            for (int kk = 0; kk < MMA_TK / 16; ++kk) {
                // The score accumulators of keys 16 kk .. 16 kk + 15 are the A fragment of P.V.
                const unsigned int pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                            pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                            pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int jp = 0; jp < D / 16; ++jp) {
                    unsigned int b[4];
                    ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + jp * 16 + (lane >> 4) * 8);
                    mma_bf16_16816(o[2 * jp], pa, b[0], b[1]);
                    mma_bf16_16816(o[2 * jp + 1], pa, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with this stage before the next load refills it
    }

    if (qv0 >= nqv) return;
    // Row sums over the quad that shares a row; the max goes back to natural-log units, which the
    // partials' merge and the sink's normaliser use.
    float lsum[2], mnat[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        lsum[i] = l_[i];
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 1);
        lsum[i] += __shfl_xor_sync(0xffffffffu, lsum[i], 2);
        mnat[i] = m_[i] == -INFINITY ? -INFINITY : m_[i] / LOG2E;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!qok[i]) continue;
        const int qv = qv0 + g + 8 * i;
        const int row = it.row0 + qv / it.nheads, h = it.h0 + qv % it.nheads;
        float f = lsum[i] > 0.f ? 1.f / lsum[i] : 0.f;
        if (splits == 1 && sinks != nullptr) f = sink_norm(mnat[i], lsum[i], sinks[h]);
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = j * 8 + t * 2 + e;
                const float a = o[j][2 * i + e];
                if (splits == 1) {
                    out[((size_t)row * hq + h) * D + c] = from_f<bf16_t>(a * f);
                } else {
                    const size_t ph = ((size_t)split * n_rows + it.local0 + qv / it.nheads) * hq + h;
                    store_partial(part_acc, part_ml, ph, c, a, D, mnat[i], lsum[i], c == 0);
                }
            }
        }
    }
}

// A bf16 cache takes `paged_attn_fa2_bf16_d<D>`, an FP8 one `paged_attn_fa2_bf16_fp8_d<D>` (its key
// scale folded into `scale`, its value scale `vscale`; opt-in with FERRITE_FP8_KV_TC_PREFILL=1
// until it has run on a GPU).
#define INST_FA2_C(D, CN, C)                                                                                       \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32) paged_attn_fa2_bf16##CN##_d##D(                      \
        const bf16_t* q, const C* kc, const C* vc, const unsigned int* tables, const AttnItem* items, bf16_t* out, \
        float* part_acc, float* part_ml, int hq, int hkv, int k_dim, int v_dim, int block_size, float scale,      \
        float softcap, int window, int attn_chunk, int causal, int splits, int n_rows, const float* sinks,         \
        float vscale) {                                                                                            \
        pdl_wait();                                                                                                \
        paged_attn_fa2<D, C>(q, kc, vc, tables, items, out, part_acc, part_ml, hq, hkv, k_dim, v_dim, block_size,  \
                             scale, softcap, window, attn_chunk, causal, splits, n_rows, sinks, vscale);           \
    }
// One module per head dim (kernels.rs), compiled on threads of their own.
#define INST_FA2(D) INST_FA2_C(D, , bf16_t) INST_FA2_C(D, _fp8, fp8_t)
