// One block per (row, head) of `n_rows` rows: merges the splits' partial results. Partial row i
// belongs to output row rows[i]. The splits' statistics are read by all threads at once and the
// empty splits (key ranges past the context) are dropped before the per-channel sums, which run
// over the remaining splits in order: at decode most of a capture-sized split count is empty,
// and a merge that walked every split a thread at a time was bound by those dependent loads.
// Dynamic shared memory: `splits` floats and `splits` ints.

template <typename T>
__device__ void attn_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml, T* __restrict__ out,
                             const unsigned int* __restrict__ rows, int splits, int n_rows, int hq, int dv,
                             const float* __restrict__ sinks) {
    extern __shared__ float comb_s[];
    float* scale_s = comb_s;                  // [splits] exp(m_s - m)
    int* live_s = (int*)(comb_s + splits);    // [splits] the non-empty splits, in order
    __shared__ int n_live;
    const size_t local = blockIdx.x / hq, h = blockIdx.x % hq;
    const size_t oh = (size_t)rows[local] * hq + h;
    const size_t per_split = (size_t)n_rows * hq;
    const size_t ph = local * hq + h;
    const int tid = threadIdx.x, lane = tid & 31;
    float m = -INFINITY;
    for (int s = tid; s < splits; s += blockDim.x) m = fmaxf(m, part_ml[(s * per_split + ph) * 2]);
    m = block_max(m);
    float l = 0.f;
    for (int s = tid; s < splits; s += blockDim.x) {
        const float ms = part_ml[(s * per_split + ph) * 2];
        const float e = ms == -INFINITY ? 0.f : expf(ms - m);
        scale_s[s] = e;
        if (ms != -INFINITY) l += part_ml[(s * per_split + ph) * 2 + 1] * e;
    }
    l = block_sum(l);
    if (tid < 32) {
        int n = 0;
        for (int s0 = 0; s0 < splits; s0 += 32) {
            const int s = s0 + lane;
            const bool live = s < splits && part_ml[(s * per_split + ph) * 2] != -INFINITY;
            const unsigned int ballot = __ballot_sync(0xffffffffu, live);
            if (live) live_s[n + __popc(ballot & ((1u << lane) - 1u))] = s;
            n += __popc(ballot);
        }
        if (lane == 0) n_live = n;
    }
    __syncthreads();
    const int live = n_live;
    const float inv = sinks != nullptr ? sink_norm(m, l, sinks[h]) : l > 0.f ? 1.f / l : 0.f;
    for (int c = tid; c < dv; c += blockDim.x) {
        float a = 0.f;
#pragma unroll 8
        for (int j = 0; j < live; ++j) {
            const int s = live_s[j];
            a += part_acc[(s * per_split + ph) * dv + c] * scale_s[s];
        }
        out[oh * dv + c] = from_f<T>(a * inv);
    }
}

#define INST_COMBINE(TN, T)                                                                                        \
    extern "C" __global__ void attn_combine_##TN(const float* pa, const float* pm, T* out, const unsigned int* rows, \
                                                 int splits, int n_rows, int hq, int dv, const float* sinks) {     \
        pdl_wait();                                                                                                \
        attn_combine<T>(pa, pm, out, rows, splits, n_rows, hq, dv, sinks);                                         \
    }
FOR_T(INST_COMBINE)
