// Rotary embeddings and the KV-cache writes: the attention input of a step.

// Element `col` of row `row` of x [rows, width] with the first 2 * half dims of each head rotated
// (the rest pass through).
template <typename T, typename W>
__device__ __forceinline__ T rotated(const T* __restrict__ x, size_t row, int width, int col, const W* __restrict__ cosv,
                                     const W* __restrict__ sinv, int head_dim, int half, int interleaved) {
    const size_t idx = row * width + col;
    const int c = col % head_dim;
    if (c >= 2 * half) return x[idx];
    int i, partner;
    float sign;
    if (!interleaved) {
        if (c < half) { i = c; partner = c + half; sign = -1.f; }
        else { i = c - half; partner = c - half; sign = 1.f; }
    } else {
        i = c >> 1;
        if (c & 1) { partner = c - 1; sign = 1.f; } else { partner = c + 1; sign = -1.f; }
    }
    float co = to_f(cosv[row * half + i]), si = to_f(sinv[row * half + i]);
    float xp = to_f(x[idx - c + partner]);
    return from_f<T>(to_f(x[idx]) * co + sign * (xp * si));
}

template <typename T, typename W>
__device__ void rope(const T* __restrict__ x, const W* __restrict__ cosv, const W* __restrict__ sinv, T* __restrict__ y,
                     int rows, int cols, int head_dim, int half, int interleaved) {
    GRID_STRIDE(e, (size_t)rows * cols) y[e] = rotated(x, e / cols, cols, (int)(e % cols), cosv, sinv, head_dim, half, interleaved);
}

// The attention input of a step in one launch: rotated queries into qo, and the rotated keys
// and the values straight into their cache slots (write_kv's layout; none for padding rows), as a
// cache of type C stores them (an FP8 one divided by its scales `k_scale` and `v_scale`).
template <typename T, typename W, typename C>
__device__ void rope_write_kv(const T* __restrict__ q, T* __restrict__ qo, int qcols, const T* __restrict__ k,
                              const T* __restrict__ v, const unsigned int* __restrict__ slots, C* __restrict__ kc,
                              C* __restrict__ vc, int kcols, int vcols, const W* __restrict__ cosv,
                              const W* __restrict__ sinv, int rows, int head_dim, int half, int interleaved,
                              float k_scale, float v_scale) {
    const int cols = qcols + kcols + vcols;
    GRID_STRIDE(e, (size_t)rows * cols) {
        const size_t row = e / cols;
        int col = (int)(e % cols);
        if (col < qcols) {
            qo[row * qcols + col] = rotated(q, row, qcols, col, cosv, sinv, head_dim, half, interleaved);
            continue;
        }
        const unsigned int slot = slots[row];
        if (slot == PAD_SLOT) continue;
        col -= qcols;
        if (col < kcols)
            kc[(size_t)slot * kcols + col] =
                to_cache<C>(to_f(rotated(k, row, kcols, col, cosv, sinv, head_dim, half, interleaved)), k_scale);
        else
            vc[(size_t)slot * vcols + col - kcols] = to_cache<C>(to_f(v[row * vcols + col - kcols]), v_scale);
    }
}

// One block per token: copies its key and value rows into their cache slot (none for padding).
template <typename T, typename C>
__device__ void write_kv(const T* __restrict__ k, const T* __restrict__ v, const unsigned int* __restrict__ slots,
                         C* __restrict__ kc, C* __restrict__ vc, int kw, int vw, float k_scale, float v_scale) {
    if (slots[blockIdx.x] == PAD_SLOT) return;
    size_t slot = slots[blockIdx.x];
    const T* ks = k + (size_t)blockIdx.x * kw;
    const T* vs = v + (size_t)blockIdx.x * vw;
    for (int c = threadIdx.x; c < kw; c += blockDim.x) kc[slot * kw + c] = to_cache<C>(to_f(ks[c]), k_scale);
    for (int c = threadIdx.x; c < vw; c += blockDim.x) vc[slot * vw + c] = to_cache<C>(to_f(vs[c]), v_scale);
}

// Caches of the activations' type take `<op>_<t>[_<w>]`, FP8 ones `<op>_<t>[_<w>]_fp8`.
#define INST_KV_C(TN, T, CN, C)                                                                                    \
    extern "C" __global__ void write_kv_##TN##CN(const T* k, const T* v, const unsigned int* slots, C* kc, C* vc,   \
                                                 int kw, int vw, float k_scale, float v_scale) { pdl_wait();          \
        write_kv<T, C>(k, v, slots, kc, vc, kw, vw, k_scale, v_scale);                                                 \
    }
#define INST_KV(TN, T) INST_KV_C(TN, T, , T) INST_KV_C(TN, T, _fp8, fp8_t)
FOR_T(INST_KV)

#define INST_ROPE_KV(TN, T, WN, W, CN, C)                                                                          \
    extern "C" __global__ void rope_write_kv_##TN##_##WN##CN(const T* q, T* qo, int qcols, const T* k, const T* v, \
                                                             const unsigned int* slots, C* kc, C* vc, int kcols,   \
                                                             int vcols, const W* c, const W* s, int rows, int hd,  \
                                                             int half, int il, float k_scale, float v_scale) {         \
        pdl_wait();                                                                                                \
        rope_write_kv<T, W, C>(q, qo, qcols, k, v, slots, kc, vc, kcols, vcols, c, s, rows, hd, half, il, k_scale,   \
                               v_scale);                                                                             \
    }
#define INST_ROPE(TN, T, WN, W)                                                                                    \
    extern "C" __global__ void rope_##TN##_##WN(const T* x, const W* c, const W* s, T* y, int rows, int cols, int hd, \
                                                int half, int il) { pdl_wait();                                    \
        rope<T, W>(x, c, s, y, rows, cols, hd, half, il);                                                          \
    }                                                                                                              \
    INST_ROPE_KV(TN, T, WN, W, , T) INST_ROPE_KV(TN, T, WN, W, _fp8, fp8_t)
FOR_TW(INST_ROPE)
