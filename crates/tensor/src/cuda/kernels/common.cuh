// Shared by every module: the bf16 type, conversions, reductions, instantiation helpers.
//
// The sources include no headers: bf16 is a 16-bit struct converted with bit operations and the
// sm_80+ `cvt.rn.bf16.f32` instruction, so kernels compile wherever `libnvrtc` loads, with no
// CUDA toolkit include directory to find at run time. Constants shared with Rust (activation and
// op codes, tile sizes, the padding slot) are not defined here: `kernels.rs` passes them to NVRTC.
//
// Every kernel computes in f32 and rounds once when it stores. Templates are instantiated for the
// activation type `T` (f32, bf16) and, where an op takes a parameter tensor (norm weights, rows,
// cos/sin), its type `W`, under `extern "C"` names `<op>_<t>[_<w>]` that the launchers look up.

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

struct __align__(2) bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(((unsigned int)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float v) {
    bf16_t r;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (unsigned short)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.bits = (unsigned short)(u >> 16);
    }
#endif
    return r;
}

// The elements of a 16-byte chunk as floats: 4 f32 or 8 bf16.
__device__ __forceinline__ void unpack(uint4 r, float* f, float) {
    f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y); f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w);
}
__device__ __forceinline__ void unpack(uint4 r, float* f, bf16_t) {
    unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { f[2 * i] = __uint_as_float(w[i] << 16); f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}

// e4m3 (torch.float8_e4m3fn): FP8 weights, activations and KV caches.

// Four e4m3 bytes as floats.
__device__ __forceinline__ void e4m3x4(unsigned int w, float* f) {
#if __CUDA_ARCH__ >= 890
    unsigned int lo, hi;
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(f[0]), "=f"(f[1])
        : "r"(lo));
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(f[2]), "=f"(f[3])
        : "r"(hi));
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int b = (w >> (8 * i)) & 0xffu, e = (b >> 3) & 0xfu, mant = b & 7u;
        const float v = e ? ldexpf(1.f + mant / 8.f, (int)e - 7) : mant * 0.001953125f;
        f[i] = (b & 0x80u) ? -v : v;
    }
#endif
}

__device__ __forceinline__ void e4m3x16(uint4 w, float* f) {
    e4m3x4(w.x, f);
    e4m3x4(w.y, f + 4);
    e4m3x4(w.z, f + 8);
    e4m3x4(w.w, f + 12);
}

// fp8.rs's round_to_e4m3: nearest e4m3 value, ties to even, saturating at 448.
__device__ __forceinline__ float round_to_e4m3(float x) {
    float a = fabsf(x);
    float r;
    if (a < 0.015625f) {
        r = rintf(a * 512.f) / 512.f;
    } else {
        unsigned int bits = __float_as_uint(a);
        unsigned int half = (1u << 19) - 1u + ((bits >> 20) & 1u);
        r = __uint_as_float((bits + half) & ~((1u << 20) - 1u));
    }
    return copysignf(fminf(r, 448.f), x);
}

// The e4m3 byte of an e4m3 value (as round_to_e4m3 returns it).
__device__ __forceinline__ unsigned char e4m3_byte(float v) {
    const unsigned int sign = signbit(v) ? 0x80u : 0u;
    const float a = fabsf(v);
    if (a < 0.015625f) return (unsigned char)(sign | (unsigned int)(a * 512.f));
    const unsigned int bits = __float_as_uint(a);
    return (unsigned char)(sign | ((((bits >> 23) & 0xffu) - 120u) << 3) | ((bits >> 20) & 7u));
}

// An element of an FP8 KV cache: the e4m3 byte of the value divided by the cache's scale.
struct fp8_t { unsigned char bits; };

__device__ __forceinline__ float to_f(fp8_t v) {
    float f[4];
    e4m3x4(v.bits, f);
    return f[0];
}
// A 16-byte chunk of an FP8 cache holds 16 elements.
__device__ __forceinline__ void unpack(uint4 r, float* f, fp8_t) { e4m3x16(r, f); }

// A value as a cache of type C stores it: an FP8 one as fp8.rs's fake_quantize rounds it.
template <typename C> __device__ __forceinline__ C to_cache(float v, float) { return from_f<C>(v); }
template <> __device__ __forceinline__ fp8_t to_cache<fp8_t>(float v, float scale) {
    return fp8_t{e4m3_byte(round_to_e4m3(fminf(fmaxf(v / scale, -448.f), 448.f)))};
}
// A cached value as the attention kernels compute with it: an FP8 one times its scale.
__device__ __forceinline__ float from_cache(float v, float) { return v; }
__device__ __forceinline__ float from_cache(bf16_t v, float) { return to_f(v); }
__device__ __forceinline__ float from_cache(fp8_t v, float scale) { return to_f(v) * scale; }

// `act` is one of the ACT_* codes of `Activation` (kernels.rs); ACT_RELU is the default case.
__device__ __forceinline__ float activate(int act, float x) {
    switch (act) {
    case ACT_SILU: return x / (1.f + expf(-x));
    case ACT_GELU: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case ACT_GELU_TANH: {
        float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.f + tanhf(inner));
    }
    case ACT_RELU2: {
        float r = fmaxf(x, 0.f);
        return r * r;
    }
    case ACT_SIGMOID: return 1.f / (1.f + expf(-x));
    case ACT_QUICK_GELU: return x * (1.f / (1.f + expf(-1.702f * x)));
    default: return fmaxf(x, 0.f);
    }
}

// Programmatic dependent launch (sm_90+): kernels are launched allowed to start before the
// previous kernel in the stream has finished, so every kernel first waits for its predecessors
// to complete and their writes to be visible. Right after that wait it lets the next kernel
// launch, so that the next one's blocks are resident and waiting when this one ends; as each
// kernel triggers only once it runs, one grid at most waits ahead. Elsewhere both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread gets the total. blockDim.x must be a multiple of 32. The leading barrier lets a
// kernel call these back to back without a reader of the previous result racing the next write.
__device__ float block_sum(float v) {
    __shared__ float buf[32];
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? buf[threadIdx.x & 31] : 0.f;
    return warp_sum(v);
}
__device__ float block_max(float v) {
    __shared__ float buf[32];
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? buf[threadIdx.x & 31] : -INFINITY;
    return warp_max(v);
}

// `c += a b` on tensor cores: a 16x16 bf16 A fragment (4 registers), a 16x8 B fragment (2), an
// f32 16x8 accumulator (4), in the register order of PTX's `mma.m16n8k16` fragments.
__device__ __forceinline__ void mma_bf16_16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

#define FOR_T(M) M(f32, float) M(bf16, bf16_t)
#define FOR_TW(M) M(f32, float, f32, float) M(f32, float, bf16, bf16_t) M(bf16, bf16_t, f32, float) M(bf16, bf16_t, bf16, bf16_t)

// torch.argmax order: NaN is the largest value; among equals the lowest index wins.
__device__ __forceinline__ bool better(float v, unsigned int i, float bv, unsigned int bi) {
    if (isnan(v)) return !isnan(bv) || i < bi;
    if (isnan(bv)) return false;
    return v > bv || (v == bv && i < bi);
}

// Thread 0 writes the block's best index to out_i[o] (and its value to out_v[o] when given).
__device__ void store_best(float bv, unsigned int bi, unsigned int* out_i, float* out_v = nullptr, size_t o = 0) {
    for (int k = 16; k > 0; k >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, k);
        unsigned int oi = __shfl_xor_sync(0xffffffffu, bi, k);
        if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    __shared__ float sv[32];
    __shared__ unsigned int si[32];
    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = bv; si[threadIdx.x >> 5] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (better(sv[w], si[w], bv, bi)) { bv = sv[w]; bi = si[w]; }
        out_i[o] = bi;
        if (out_v) out_v[o] = bv;
    }
}
