// Recurrent token mixers (see cpu/recurrent.rs for the reference they follow). Per sequence the
// launcher passes `int4 {q_start, q_len, state slot, flags}` (flag 1: fresh, zero state; flag 2:
// prompt tokens); states are f32 in their slots.

// One thread per channel, one grid row per sequence: the window of the last KERNEL inputs lives
// in registers, the sequence's tokens are walked in order.
template <typename T>
__device__ void causal_conv1d(const T* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                              T* __restrict__ y, float* __restrict__ state, const int4* __restrict__ seqs,
                              int channels, int kernel, int act) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int4 s = seqs[blockIdx.y];
    if (c >= channels) return;
    const int hist = kernel - 1;
    float* st = state + (size_t)s.z * hist * channels;
    float win[CONV_KERNEL_MAX];
    for (int j = 0; j < hist; ++j) win[j] = (s.w & 1) ? 0.f : st[(size_t)j * channels + c];
    for (int t = 0; t < s.y; ++t) {
        const size_t row = (size_t)(s.x + t);
        win[hist] = to_f(x[row * channels + c]);
        float acc = bias ? bias[c] : 0.f;
        for (int j = 0; j < kernel; ++j) acc += w[(size_t)c * kernel + j] * win[j];
        y[row * channels + c] = from_f<T>(act >= 0 ? activate(act, acc) : acc);
        for (int j = 0; j < hist; ++j) win[j] = win[j + 1];
    }
    for (int j = 0; j < hist; ++j) st[(size_t)j * channels + c] = win[j];
}

// One block per (value head, sequence), one thread per state column (value dimension) holding its
// k_dim state entries; tokens in order, each through the delta-rule recurrence. Queries and keys
// are L2-normalised in shared memory; the gates are computed from the raw projections.
template <typename T>
__device__ void gated_delta_rule(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ a, const T* __restrict__ b, const float* __restrict__ a_log,
                                 const float* __restrict__ dt_bias, T* __restrict__ y, float* __restrict__ state,
                                 const int4* __restrict__ seqs, int hk, int hv, int dk, int dv,
                                 float q_scale, float q_root, float beta_scale, int channel_decay) {
    __shared__ float qs[GDN_DK_MAX], ks[GDN_DK_MAX], decay[GDN_DK_MAX];
    __shared__ float beta_s;
    const int h = blockIdx.x, kh = h / (hv / hk), j = threadIdx.x;
    const int4 s = seqs[blockIdx.y];
    float* st = state + ((size_t)s.z * hv + h) * dk * dv;
    float col[GDN_DK_MAX];
    for (int i = 0; i < dk; ++i) col[i] = ((s.w & 1) || j >= dv) ? 0.f : st[(size_t)i * dv + j];
    const bool recurrent = !(s.w & 2);
    // Gate inputs per token: one per value head, or (KDA) one per value head and key channel.
    const int gw = channel_decay ? dk : 1;
    for (int t = 0; t < s.y; ++t) {
        const size_t row = (size_t)(s.x + t);
        float sq = 0.f, sk = 0.f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            float qv = to_f(q[(row * hk + kh) * dk + i]), kv = to_f(k[(row * hk + kh) * dk + i]);
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
            const int c = channel_decay ? i : 0;
            float x = to_f(a[(row * hv + h) * gw + c]) + dt_bias[h * gw + c];
            // KDA's reference spells softplus log(1 + exp(x)), Gated DeltaNet's log1p(exp(x)).
            float sp = x > 20.f ? x : (channel_decay ? logf(1.f + expf(x)) : log1pf(expf(x)));
            decay[i] = expf(-expf(a_log[h]) * sp);
        }
        sq = block_sum(sq);
        sk = block_sum(sk);
        // transformers: Gated DeltaNet's recurrent form (one cached token) divides the query by
        // sqrt(dk), its chunked one multiplies it by dk^-0.5; KDA divides q and k by their norms
        // and multiplies q by 1 / sqrt(dk) (q_scale) in both forms.
        const float qnorm = sqrtf(sq + 1e-6f), knorm = sqrtf(sk + 1e-6f);
        const float qn = 1.f / qnorm, kn = 1.f / knorm;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            if (channel_decay) {
                qs[i] = qs[i] / qnorm * q_scale;
                ks[i] /= knorm;
            } else {
                qs[i] = recurrent ? qs[i] * qn / q_root : qs[i] * qn * q_scale;
                ks[i] *= kn;
            }
        }
        if (threadIdx.x == 0) beta_s = 1.f / (1.f + expf(-to_f(b[row * hv + h]))) * beta_scale;
        __syncthreads();
        if (j < dv) {
            const float beta = beta_s;
            float mem = 0.f;
            for (int i = 0; i < dk; ++i) {
                col[i] *= decay[i];
                mem += col[i] * ks[i];
            }
            const float delta = (to_f(v[row * hv * dv + (size_t)h * dv + j]) - mem) * beta;
            float o = 0.f;
            for (int i = 0; i < dk; ++i) {
                col[i] += ks[i] * delta;
                o += col[i] * qs[i];
            }
            y[row * hv * dv + (size_t)h * dv + j] = from_f<T>(o);
        }
        __syncthreads();
    }
    if (j < dv)
        for (int i = 0; i < dk; ++i) st[(size_t)i * dv + j] = col[i];
}

#define INST_REC(TN, T)                                                                                             \
    extern "C" __global__ void causal_conv1d_##TN(const T* x, const float* w, const float* bias, T* y,            \
                                                  float* state, const int4* seqs, int channels, int kernel,       \
                                                  int act) {                                                      \
        pdl_wait();                                                                                                 \
        causal_conv1d<T>(x, w, bias, y, state, seqs, channels, kernel, act);                                        \
    }                                                                                                               \
    extern "C" __global__ void gated_delta_rule_##TN(const T* q, const T* k, const T* v, const T* a, const T* b,  \
                                                     const float* a_log, const float* dt_bias, T* y, float* state,\
                                                     const int4* seqs, int hk, int hv, int dk, int dv,            \
                                                     float q_scale, float q_root, float beta_scale,            \
                                                     int channel_decay) {                                         \
        pdl_wait();                                                                                                 \
        gated_delta_rule<T>(q, k, v, a, b, a_log, dt_bias, y, state, seqs, hk, hv, dk, dv, q_scale, q_root,        \
                            beta_scale, channel_decay);                                                             \
    }
FOR_T(INST_REC)

extern "C" __global__ void copy_state_slots(float* k, float* v, const int2* pairs, int k_len, int v_len) {
    pdl_wait();
    const int2 p = pairs[blockIdx.y];
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)k_len) k[(size_t)p.y * k_len + i] = k[(size_t)p.x * k_len + i];
    if (i < (size_t)v_len) v[(size_t)p.y * v_len + i] = v[(size_t)p.x * v_len + i];
}

// Mamba2's selective scan: one block per (head, sequence), one thread per head dimension holding
// its row of the [head_dim, state] state; tokens in order.
template <typename T>
__device__ void selective_scan(const T* __restrict__ x, const T* __restrict__ dt, const T* __restrict__ b,
                            const T* __restrict__ c, const float* __restrict__ a_log,
                            const float* __restrict__ dt_bias, const float* __restrict__ d, T* __restrict__ y,
                            float* __restrict__ state, const int4* __restrict__ seqs, int heads, int head_dim,
                            int groups, int n, float dt_min, float dt_max, int per_channel) {
    const int h = blockIdx.x, i = threadIdx.x, g = h / (heads / groups);
    const int4 s = seqs[blockIdx.y];
    float* st = state + (((size_t)s.z * heads + h) * head_dim + i) * n;
    float row[SSM_STATE_MAX];
    const bool active = i < head_dim;
    for (int k = 0; k < n; ++k) row[k] = ((s.w & 1) || !active) ? 0.f : st[k];
    const bool chunked = (s.w & 2) != 0;
    // The parameters' index: the head (Mamba2), or this thread's channel (Mamba).
    const int at = per_channel ? h * head_dim + i : h, width = per_channel ? heads * head_dim : heads;
    float a[SSM_STATE_MAX];
    for (int k = 0; k < n; ++k) a[k] = active ? -expf(a_log[per_channel ? (size_t)at * n + k : h]) : 0.f;
    for (int t = 0; t < s.y; ++t) {
        const size_t r = (size_t)(s.x + t);
        if (active) {
            float delta = to_f(dt[r * width + at]) + dt_bias[at];
            delta = delta > 20.f ? delta : log1pf(expf(delta));
            if (chunked) delta = fminf(fmaxf(delta, dt_min), dt_max);
            const float xi = to_f(x[(r * heads + h) * head_dim + i]);
            const float head_decay = expf(delta * a[0]);
            float acc = 0.f;
            for (int k = 0; k < n; ++k) {
                const float decay = per_channel ? expf(delta * a[k]) : head_decay;
                row[k] = row[k] * decay + delta * to_f(b[(r * groups + g) * n + k]) * xi;
                acc += to_f(c[(r * groups + g) * n + k]) * row[k];
            }
            y[(r * heads + h) * head_dim + i] = from_f<T>(acc + xi * d[at]);
        }
    }
    if (active)
        for (int k = 0; k < n; ++k) st[k] = row[k];
}

#define INST_MAMBA(TN, T)                                                                                           \
    extern "C" __global__ void selective_scan_##TN(const T* x, const T* dt, const T* b, const T* c, const float* a_log, \
                                                const float* dt_bias, const float* d, T* y, float* state,          \
                                                const int4* seqs, int heads, int head_dim, int groups, int n,      \
                                                float dt_min, float dt_max, int per_channel) {                     \
        pdl_wait();                                                                                                 \
        selective_scan<T>(x, dt, b, c, a_log, dt_bias, d, y, state, seqs, heads, head_dim, groups, n, dt_min,      \
                          dt_max, per_channel);                                                                     \
    }
FOR_T(INST_MAMBA)
