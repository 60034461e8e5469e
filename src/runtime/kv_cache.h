// KV cache in fixed-size blocks with a block table per sequence (the vLLM "paged" layout), so batching,
// prefix reuse and quantized caches build on it without rewrites.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qinfer {

// Element type of a KV cache (FORMATS.md section 7).
//   f32, bf16: plain.
//   fp8: e4m3 with one scale per layer for K and one for V (x = fp8 * scale): the checkpoint's k_scale / v_scale
//        (vLLM's names; kv_scale for both) where it has them, else amax / 448 of the first forward's values of that
//        layer, then fixed.
//   int8, int4: asymmetric per token and KV head over head_dim (LMDeploy's quant_policy 8/4): scale = (max - min) /
//        255 (15), zero = -min / scale, q = trunc(x / scale + zero + 0.5) clamped, x = (q - zero) * scale; int4 byte j
//        holds element j in the low nibble and element j + head_dim / 2 in the high nibble.
enum class KVDType { F32, BF16, FP8, INT8, INT4 };
const char * kv_dtype_name(KVDType t);                 // "fp32", "bf16", "fp8", "int8", "int4"
KVDType parse_kv_dtype(const std::string & name);      // throws naming the choices
double kv_dtype_bytes_per_element(KVDType t);          // incl. int8/int4 scale and zero (fp32 pairs) per head_dim

// One row (a token's head, head_dim values) to its stored form and back, by the formulas above: the specification
// every backend's cache follows. codes: head_dim bytes (fp8, int8) or head_dim / 2 (int4); scale_zero: int8/int4
// float[2]; fp8_scale: the layer's scale (fp8). Not for f32/bf16.
void kv_quantize_row(KVDType t, const float * x, int head_dim, float fp8_scale, uint8_t * codes, float * scale_zero);
void kv_dequantize_row(KVDType t, const uint8_t * codes, const float * scale_zero, int head_dim, float fp8_scale, float * x);

struct KVCacheShape {
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int block_size = 16;  // tokens per block
    int n_blocks = 0;
    KVDType dtype = KVDType::F32;
};

// Block bookkeeping, shared by every backend: which blocks are free, which sequence owns which blocks.
class BlockTable {
public:
    explicit BlockTable(int n_blocks, int block_size);
    int add_sequence();
    void free_sequence(int seq);
    // Makes room for `n_tokens` tokens in total; throws qinfer::Error when the pool runs out.
    void reserve(int seq, int n_tokens);
    int length(int seq) const;
    void set_length(int seq, int n_tokens);  // after the tokens' K/V are written
    const std::vector<int> & blocks(int seq) const;
    int block_size() const { return block_size_; }
    int free_blocks() const { return int(free_.size()); }
    int n_blocks() const { return n_blocks_; }
    // (block, slot) of token `pos` of a sequence.
    int block_of(int seq, int pos) const { return blocks(seq)[size_t(pos / block_size_)]; }

private:
    struct Sequence {
        std::vector<int> blocks;
        int length = 0;
    };
    const Sequence & get(int seq) const;
    int n_blocks_;
    int block_size_;
    std::vector<int> free_;
    std::map<int, Sequence> seqs_;
    int next_id_ = 0;
};

// The CPU cache, stored in its dtype: K and V of every layer, [layer][block][slot][kv_head][head_dim] (+ per-head
// scale and zero for int8/int4). The reference for every cache dtype: attention reads what read() returns.
class CpuKVCache {
public:
    explicit CpuKVCache(const KVCacheShape & shape);
    const KVCacheShape & shape() const { return shape_; }
    BlockTable & table() { return table_; }
    const BlockTable & table() const { return table_; }
    // Stores tokens pos0..pos0+n-1 of a sequence whose cache is `blocks` (position order; table().blocks(seq), or a
    // scheduler's table): k, v fp32 [n, n_kv_heads, head_dim], quantized to the dtype.
    void write(int layer, const std::vector<int> & blocks, int pos0, int n, const float * k, const float * v);
    // Tokens 0..n-1 of such a sequence as stored (dequantized): k, v fp32 [n, n_kv_heads, head_dim].
    void read(int layer, const std::vector<int> & blocks, int n, float * k, float * v) const;
    size_t bytes() const { return k_.size() + v_.size() + (k_sz_.size() + v_sz_.size()) * sizeof(float); }
    float fp8_scale(int layer, bool value) const { return (value ? v_fp8_scale_ : k_fp8_scale_)[size_t(layer)]; }
    // A fixed fp8 scale (the checkpoint's), used instead of one computed from the first values.
    void set_fp8_scale(int layer, bool value, float scale) { (value ? v_fp8_scale_ : k_fp8_scale_)[size_t(layer)] = scale; }

private:
    size_t row_index(int layer, const std::vector<int> & blocks, int pos) const;  // the (token, all heads) row of a position
    void store(size_t row, const float * x, std::vector<uint8_t> & buf, std::vector<float> & sz, float fp8_scale);
    void load(size_t row, const std::vector<uint8_t> & buf, const std::vector<float> & sz, float fp8_scale, float * x) const;
    KVCacheShape shape_;
    BlockTable table_;
    size_t head_bytes_ = 0;             // stored bytes of one head of one token
    std::vector<uint8_t> k_, v_;        // [layer][block][slot][kv_head][head_bytes_]
    std::vector<float> k_sz_, v_sz_;    // int8/int4: [layer][block][slot][kv_head][scale, zero]
    std::vector<float> k_fp8_scale_, v_fp8_scale_;  // fp8: [layer], 0 until the first write
};

}  // namespace qinfer
