#include "runtime/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace qinfer {

BlockTable::BlockTable(int n_blocks, int block_size) : n_blocks_(n_blocks), block_size_(block_size) {
    QINFER_CHECK(n_blocks >= 0 && block_size > 0);
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);
}

int BlockTable::add_sequence() {
    int id = next_id_++;
    seqs_[id] = Sequence{};
    return id;
}

void BlockTable::free_sequence(int seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    // Last block first onto the stack, so that the next sequence gets them back in their order: a repeated request
    // reads its cache in the same ascending pages as the first one.
    const std::vector<int> & blocks = it->second.blocks;
    free_.insert(free_.end(), blocks.rbegin(), blocks.rend());
    seqs_.erase(it);
}

const BlockTable::Sequence & BlockTable::get(int seq) const {
    auto it = seqs_.find(seq);
    QINFER_CHECK(it != seqs_.end()) << "unknown sequence " << seq;
    return it->second;
}

void BlockTable::reserve(int seq, int n_tokens) {
    Sequence & s = const_cast<Sequence &>(get(seq));
    size_t need = size_t((int64_t(n_tokens) + block_size_ - 1) / block_size_);
    if (need > s.blocks.size() && need - s.blocks.size() > free_.size()) {
        QINFER_FAIL() << "KV cache full: " << n_tokens << " tokens need " << need << " blocks of " << block_size_
                      << ", only " << free_.size() + s.blocks.size() << " available";
    }
    while (s.blocks.size() < need) {
        s.blocks.push_back(free_.back());
        free_.pop_back();
    }
}

int BlockTable::length(int seq) const { return get(seq).length; }

void BlockTable::set_length(int seq, int n_tokens) {
    Sequence & s = const_cast<Sequence &>(get(seq));
    QINFER_CHECK(size_t(n_tokens) <= s.blocks.size() * size_t(block_size_));
    s.length = n_tokens;
}

const std::vector<int> & BlockTable::blocks(int seq) const { return get(seq).blocks; }

const char * kv_dtype_name(KVDType t) {
    switch (t) {
    case KVDType::F32: return "fp32";
    case KVDType::BF16: return "bf16";
    case KVDType::FP8: return "fp8";
    case KVDType::INT8: return "int8";
    case KVDType::INT4: return "int4";
    }
    return "?";
}

KVDType parse_kv_dtype(const std::string & name) {
    for (KVDType t : {KVDType::F32, KVDType::BF16, KVDType::FP8, KVDType::INT8, KVDType::INT4}) {
        if (name == kv_dtype_name(t)) return t;
    }
    if (name == "fp8_e4m3") return KVDType::FP8;
    QINFER_FAIL() << "unknown KV cache dtype '" << name << "' (fp32, bf16, fp8, int8, int4)";
}

double kv_dtype_bytes_per_element(KVDType t) {
    switch (t) {
    case KVDType::F32: return 4;
    case KVDType::BF16: return 2;
    case KVDType::FP8: return 1;
    case KVDType::INT8: return 1;
    case KVDType::INT4: return 0.5;
    }
    return 4;
}

CpuKVCache::CpuKVCache(const KVCacheShape & shape) : shape_(shape), table_(shape.n_blocks, shape.block_size) {
    const int d = shape.head_dim;
    switch (shape.dtype) {
    case KVDType::F32: head_bytes_ = size_t(d) * 4; break;
    case KVDType::BF16: head_bytes_ = size_t(d) * 2; break;
    case KVDType::FP8:
    case KVDType::INT8: head_bytes_ = size_t(d); break;
    case KVDType::INT4:
        QINFER_CHECK(d % 2 == 0) << "int4 KV cache needs an even head_dim";
        head_bytes_ = size_t(d) / 2;
        break;
    }
    const size_t heads = size_t(shape.n_layers) * shape.n_blocks * shape.block_size * shape.n_kv_heads;
    k_.assign(heads * head_bytes_, 0);
    v_.assign(heads * head_bytes_, 0);
    if (shape.dtype == KVDType::INT8 || shape.dtype == KVDType::INT4) {
        k_sz_.assign(heads * 2, 0.0f);
        v_sz_.assign(heads * 2, 0.0f);
    }
    k_fp8_scale_.assign(size_t(shape.n_layers), 0.0f);
    v_fp8_scale_.assign(size_t(shape.n_layers), 0.0f);
}

size_t CpuKVCache::row_index(int layer, const std::vector<int> & blocks, int pos) const {
    const KVCacheShape & s = shape_;
    QINFER_CHECK(pos / s.block_size < int(blocks.size())) << "KV cache: position " << pos << " past the sequence's " << blocks.size() << " blocks";
    const int block = blocks[size_t(pos / s.block_size)];
    QINFER_CHECK(block >= 0 && block < s.n_blocks) << "KV cache: block " << block << " outside the pool of " << s.n_blocks;
    return (size_t(layer) * s.n_blocks + size_t(block)) * s.block_size + size_t(pos % s.block_size);
}

void kv_quantize_row(KVDType t, const float * x, int d, float fp8_scale, uint8_t * out, float * scale_zero) {
    switch (t) {
    case KVDType::FP8:
        for (int i = 0; i < d; i++) out[i] = f32_to_e4m3(x[i] / fp8_scale);
        return;
    case KVDType::INT8:
    case KVDType::INT4: {
        const float qmax = t == KVDType::INT8 ? 255.0f : 15.0f;
        float mn = x[0], mx = x[0];
        for (int i = 1; i < d; i++) {
            mn = std::min(mn, x[i]);
            mx = std::max(mx, x[i]);
        }
        // A constant row (max == min) is stored exactly: scale 1, zero -min, every code 0.
        const float scale = mx > mn ? (mx - mn) / qmax : 1.0f;
        const float zero = -mn / scale;
        auto quant = [&](float v) { return uint8_t(std::clamp(std::trunc(v / scale + zero + 0.5f), 0.0f, qmax)); };
        if (t == KVDType::INT8) {
            for (int i = 0; i < d; i++) out[i] = quant(x[i]);
        } else {
            for (int j = 0; j < d / 2; j++) out[j] = uint8_t(quant(x[j]) | (quant(x[j + d / 2]) << 4));
        }
        scale_zero[0] = scale;
        scale_zero[1] = zero;
        return;
    }
    default: QINFER_FAIL() << "kv_quantize_row: " << kv_dtype_name(t) << " is not a quantized cache dtype";
    }
}

void kv_dequantize_row(KVDType t, const uint8_t * in, const float * scale_zero, int d, float fp8_scale, float * x) {
    switch (t) {
    case KVDType::FP8:
        for (int i = 0; i < d; i++) x[i] = e4m3_to_f32(in[i]) * fp8_scale;
        return;
    case KVDType::INT8:
    case KVDType::INT4: {
        const float scale = scale_zero[0], zero = scale_zero[1];
        if (t == KVDType::INT8) {
            for (int i = 0; i < d; i++) x[i] = (float(in[i]) - zero) * scale;
        } else {
            for (int j = 0; j < d / 2; j++) {
                x[j] = (float(in[j] & 15) - zero) * scale;
                x[j + d / 2] = (float(in[j] >> 4) - zero) * scale;
            }
        }
        return;
    }
    default: QINFER_FAIL() << "kv_dequantize_row: " << kv_dtype_name(t) << " is not a quantized cache dtype";
    }
}

// One token's heads: x fp32 [n_kv_heads, head_dim] into row `row`.
void CpuKVCache::store(size_t row, const float * x, std::vector<uint8_t> & buf, std::vector<float> & sz, float fp8_scale) {
    const int d = shape_.head_dim, heads = shape_.n_kv_heads;
    for (int h = 0; h < heads; h++) {
        const float * xh = x + size_t(h) * d;
        const size_t head = row * heads + size_t(h);
        uint8_t * out = buf.data() + head * head_bytes_;
        switch (shape_.dtype) {
        case KVDType::F32: std::memcpy(out, xh, size_t(d) * 4); break;
        case KVDType::BF16:
            for (int i = 0; i < d; i++) {
                const uint16_t b = f32_to_bf16(xh[i]);
                std::memcpy(out + 2 * i, &b, 2);
            }
            break;
        default: kv_quantize_row(shape_.dtype, xh, d, fp8_scale, out, sz.empty() ? nullptr : &sz[head * 2]); break;
        }
    }
}

void CpuKVCache::load(size_t row, const std::vector<uint8_t> & buf, const std::vector<float> & sz, float fp8_scale, float * x) const {
    const int d = shape_.head_dim, heads = shape_.n_kv_heads;
    for (int h = 0; h < heads; h++) {
        float * xh = x + size_t(h) * d;
        const size_t head = row * heads + size_t(h);
        const uint8_t * in = buf.data() + head * head_bytes_;
        switch (shape_.dtype) {
        case KVDType::F32: std::memcpy(xh, in, size_t(d) * 4); break;
        case KVDType::BF16:
            for (int i = 0; i < d; i++) {
                uint16_t b;
                std::memcpy(&b, in + 2 * i, 2);
                xh[i] = bf16_to_f32(b);
            }
            break;
        default: kv_dequantize_row(shape_.dtype, in, sz.empty() ? nullptr : &sz[head * 2], d, fp8_scale, xh); break;
        }
    }
}

void CpuKVCache::write(int layer, const std::vector<int> & blocks, int pos0, int n, const float * k, const float * v) {
    const size_t token = size_t(shape_.n_kv_heads) * shape_.head_dim;
    if (shape_.dtype == KVDType::FP8) {
        // The layer's scales come from the first values it sees (amax / 448) and stay.
        for (auto [x, scale] : {std::pair{k, &k_fp8_scale_[size_t(layer)]}, std::pair{v, &v_fp8_scale_[size_t(layer)]}}) {
            if (*scale > 0) continue;
            float amax = 0;
            for (size_t i = 0; i < size_t(n) * token; i++) amax = std::max(amax, std::fabs(x[i]));
            *scale = amax > 0 ? amax / 448.0f : 1.0f;
        }
    }
    for (int t = 0; t < n; t++) {
        const size_t row = row_index(layer, blocks, pos0 + t);
        store(row, k + size_t(t) * token, k_, k_sz_, k_fp8_scale_[size_t(layer)]);
        store(row, v + size_t(t) * token, v_, v_sz_, v_fp8_scale_[size_t(layer)]);
    }
}

void CpuKVCache::read(int layer, const std::vector<int> & blocks, int n, float * k, float * v) const {
    const size_t token = size_t(shape_.n_kv_heads) * shape_.head_dim;
    for (int t = 0; t < n; t++) {
        const size_t row = row_index(layer, blocks, t);
        load(row, k_, k_sz_, k_fp8_scale_[size_t(layer)], k + size_t(t) * token);
        load(row, v_, v_sz_, v_fp8_scale_[size_t(layer)], v + size_t(t) * token);
    }
}

}  // namespace qinfer
