// Paged attention over block tables for a flattened batch of prefill chunks and decode tokens:
// what the prefill, decode and merge kernels share.
//
// Rows of multi-token chunks (prefill) go to `paged_attn` (attention_prefill.cu) or, in bf16, to
// `paged_attn_fa2` (attention_fa2.cu); single-token rows (decode) go to `paged_decode`
// (attention_decode.cu). When a batch has too few work items to fill the GPU, each splits the key
// range across blocks (flash-decoding) and `attn_combine` (attention_combine.cu) merges the partial
// results, except where the decode kernel has a few splits: then the last block of each work item
// to finish merges them.

// Laid out as `AttnItem` and `DecodeItem` in attention.rs (the NVRTC unit test checks that they agree).
struct AttnItem { int row0, nrows, pos0, h0, nheads, bt_off, k_lo, k_hi, local0, last; };
struct DecodeItem { int row, local, h0, nheads, bt_off, k_lo, k_hi, pad; };

// Writes one query vector's result: directly when the keys were not split, else as a partial
// (unnormalised accumulator, running max, sum) at index `ph` for the merge of the splits.
// The factor that turns a row's summed values (relative to its max logit `m`, with softmax sum
// `l`) into its output when the head has an attention sink: the sink logit joins the max and the
// denominator and weighs no value, as the column transformers concatenates and drops. Applied
// once per row, where its splits are merged (or in place of 1 / l when it is not split).
__device__ __forceinline__ float sink_norm(float m, float l, float sink) {
    const float mx = fmaxf(m, sink);
    const float c = m == -INFINITY ? 0.f : expf(m - mx);
    return c / (l * c + expf(sink - mx));
}

__device__ __forceinline__ void store_partial(float* part_acc, float* part_ml, size_t ph, int c, float a, int dv,
                                              float m, float l, bool write_ml) {
    if (c < dv) part_acc[ph * dv + c] = a;
    if (write_ml) { part_ml[ph * 2] = m; part_ml[ph * 2 + 1] = l; }
}
