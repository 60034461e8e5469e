#include "model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/quant.h"

namespace qinfer {

RandomInit random_init(const std::string & name, const std::vector<int64_t> & shape, WeightRole role, int n_layers) {
    switch (role) {
    case WeightRole::Norm: return {1.0f, 0.1f};
    case WeightRole::Bias: return {0.0f, 0.1f};
    case WeightRole::Embedding: return {0.0f, 1.0f};
    case WeightRole::Router: return {0.0f, 1.0f / std::sqrt(float(shape[1]))};
    case WeightRole::Linear: {
        float s = 1.0f / std::sqrt(float(shape[1]));
        bool writes_residual = name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
        if (writes_residual) s /= std::sqrt(2.0f * float(n_layers));
        return {0.0f, s};
    }
    default: return {0.0f, 1.0f};  // quantized tensors are produced from the dense weight
    }
}

void fill_random(uint64_t stream, RandomInit init, DType dtype, uint8_t * out, size_t nbytes) {
    const int64_t n = int64_t(nbytes / dtype_size(dtype));
    constexpr int64_t k_chunk = 1 << 16;
    parallel_for((n + k_chunk - 1) / k_chunk, [&](int64_t c) {
        const int64_t i0 = c * k_chunk, i1 = std::min(n, i0 + k_chunk);
        for (int64_t i = i0; i < i1; i++) {
            float v = init.mean + init.std * normal_at(stream, uint64_t(i));
            switch (dtype) {
            case DType::BF16: {
                uint16_t h = f32_to_bf16(v);
                std::memcpy(out + 2 * i, &h, 2);
                break;
            }
            case DType::F16: {
                uint16_t h = f32_to_f16(v);
                std::memcpy(out + 2 * i, &h, 2);
                break;
            }
            default: std::memcpy(out + 4 * i, &v, 4); break;
            }
        }
    });
}

DType stored_dtype(WeightRole role, DType dense, const QuantScheme & scheme) {
    switch (role) {
    case WeightRole::QWeight:
    case WeightRole::QZeros:
    case WeightRole::QGIdx: return DType::I32;
    case WeightRole::QScales: return DType::F16;
    case WeightRole::BnbCodes:
    case WeightRole::BnbQuantState: return DType::U8;
    case WeightRole::BnbAbsmax: return scheme.double_quant ? DType::U8 : DType::F32;
    case WeightRole::BnbQuantMap:
    case WeightRole::BnbNestedAbsmax:
    case WeightRole::BnbNestedQuantMap:
    case WeightRole::KvScale: return DType::F32;
    default: return dense;
    }
}

std::string torch_dtype_name(DType t) {
    switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F32: return "float32";
    default: QINFER_FAIL() << "random weights are bf16, fp16 or fp32, not " << dtype_name(t);
    }
}

std::string act_order_key(const std::string & module) {
    const std::string parent = module.substr(0, module.rfind('.'));
    const std::string leaf = module.substr(module.rfind('.') + 1);
    if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") return parent + ".qkv";
    if (leaf == "gate_proj" || leaf == "up_proj") return parent + ".gate_up";
    return module;
}

std::string bnb_quant_state_json(const Linear & l, const std::string & dtype, float nested_offset) {
    std::string s = "{\"quant_type\": \"" + std::string(quant_packing_name(l.scheme.packing)) + "\", \"blocksize\": " +
                    std::to_string(l.scheme.block_size) + ", \"dtype\": \"" + dtype + "\", \"shape\": [" + std::to_string(l.out_features) +
                    ", " + std::to_string(l.in_features) + "]";
    if (l.scheme.double_quant) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.8e", double(nested_offset));  // fixed width: offset >= 0
        s += ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": " + std::string(buf);
    }
    return s + "}";
}

namespace {

template <class T> std::vector<uint8_t> bytes_of(const std::vector<T> & v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Sets field `pos` of a little-endian word stream (word(i) returns a reference to word i); the inverse of
// packed_field.
template <class Word> void put_field(int bits, int64_t pos, uint32_t v, Word word) {
    const int64_t bit = int64_t(bits) * pos;
    const int64_t w = bit / 32;
    const int shift = int(bit % 32);
    const uint64_t mask = (uint64_t(1) << bits) - 1;
    word(w) |= uint32_t((uint64_t(v) & mask) << shift);
    if (shift + bits > 32) word(w + 1) |= uint32_t((uint64_t(v) & mask) >> (32 - shift));
}

float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// bitsandbytes' code tables (quant_map) for NF4 and FP4 (bnb_code_table).
const float k_nf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
                         -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
                         0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                         0.7229568362236023f, 1.0f};
const float k_fp4[16] = {0.0f, 0.0625f / 12, 8.0f / 12, 12.0f / 12, 4.0f / 12, 6.0f / 12, 2.0f / 12, 3.0f / 12,
                         -0.0f, -0.0625f / 12, -8.0f / 12, -12.0f / 12, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12};

// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True)): for each decade 10^(i-6), i < 7,
// 2^i interval midpoints of linspace(0.1, 1) on both signs, plus 0 and 1, sorted.
std::vector<float> dynamic_map() {
    std::vector<float> m;
    for (int i = 0; i < 7; i++) {
        const int items = (1 << i) + 1;
        for (int j = 0; j + 1 < items; j++) {
            const double lo = 0.1 + 0.9 * j / (items - 1), hi = 0.1 + 0.9 * (j + 1) / (items - 1);
            const double v = std::pow(10.0, -6 + i) * (lo + hi) / 2;
            m.push_back(float(v));
            m.push_back(float(-v));
        }
    }
    m.push_back(0.0f);
    m.push_back(1.0f);
    std::sort(m.begin(), m.end());
    return m;
}

int nearest(const float * table, int n, float v) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (std::fabs(table[i] - v) < std::fabs(table[best] - v)) best = i;
    }
    return best;
}

std::map<std::string, std::vector<uint8_t>> quantize_gptq(const Linear & l, const std::vector<float> & w, uint64_t perm_seed) {
    const QuantScheme & s = l.scheme;
    const int64_t K = l.in_features, N = l.out_features, G = s.group(int(K)), groups = (K + G - 1) / G;
    const int maxq = (1 << s.bits) - 1;
    // Act-order: columns are quantized in a (here random) order; g_idx[k] = position of k in that order / G.
    std::vector<int32_t> g_idx(static_cast<size_t>(K));
    std::vector<int64_t> order(static_cast<size_t>(K));
    std::iota(order.begin(), order.end(), 0);
    if (s.desc_act) {
        for (int64_t i = K - 1; i > 0; i--) std::swap(order[size_t(i)], order[size_t(splitmix64(perm_seed ^ uint64_t(i)) % uint64_t(i + 1))]);
    }
    for (int64_t i = 0; i < K; i++) g_idx[size_t(order[size_t(i)])] = int32_t(i / G);
    std::vector<float> scale(size_t(groups * N));
    std::vector<int> zero(size_t(groups * N));
    std::vector<uint8_t> q(size_t(N * K));
    const bool v1 = s.packing == QuantPacking::GptqV1;
    parallel_for(N, [&](int64_t n) {
        const float * row = w.data() + n * K;
        for (int64_t g = 0; g < groups; g++) {
            float xmin = 0, xmax = 0;  // the range always includes 0
            for (int64_t i = g * G; i < std::min(K, (g + 1) * G); i++) {
                xmin = std::min(xmin, row[order[size_t(i)]]);
                xmax = std::max(xmax, row[order[size_t(i)]]);
            }
            if (s.sym) {
                xmax = std::max(-xmin, xmax);
                if (xmin < 0) xmin = -xmax;
            }
            if (xmin == 0 && xmax == 0) {
                xmin = -1;
                xmax = 1;
            }
            const float sc = round_f16((xmax - xmin) / float(maxq));
            int z = s.sym ? (maxq + 1) / 2 : int(std::lround(-xmin / sc));
            z = std::clamp(z, v1 ? 1 : 0, maxq);  // v1 stores zero - 1: keep it >= 0 (FORMATS.md 3.3)
            scale[size_t(g * N + n)] = sc;
            zero[size_t(g * N + n)] = z;
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t g = g_idx[size_t(k)];
            const float sc = scale[size_t(g * N + n)];
            q[size_t(n * K + k)] = uint8_t(std::clamp(int(std::lround(row[k] / sc)) + zero[size_t(g * N + n)], 0, maxq));
        }
    });
    // As the loader requires (model/weights.cpp): the packed rows hold whole words (else the fields below would run
    // past them).
    QINFER_CHECK((K * s.bits) % 32 == 0 && (N * s.bits) % 32 == 0)
        << l.qweight.name << ": " << s.bits << "-bit GPTQ packing needs in and out features (" << K << ", " << N << ") times the bits to be multiples of 32";
    std::vector<uint32_t> qweight(size_t(K * s.bits / 32 * N), 0u), qzeros(size_t(groups * (N * s.bits / 32)), 0u);
    parallel_for(N, [&](int64_t n) {
        for (int64_t k = 0; k < K; k++) put_field(s.bits, k, q[size_t(n * K + k)], [&](int64_t r) -> uint32_t & { return qweight[size_t(r * N + n)]; });
    });
    const int64_t zrow = N * s.bits / 32;
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t n = 0; n < N; n++) {
            put_field(s.bits, n, uint32_t(zero[size_t(g * N + n)] - (v1 ? 1 : 0)), [&](int64_t c) -> uint32_t & { return qzeros[size_t(g * zrow + c)]; });
        }
    }
    std::vector<uint16_t> scales16(scale.size());
    for (size_t i = 0; i < scale.size(); i++) scales16[i] = f32_to_f16(scale[i]);
    return {{".qweight", bytes_of(qweight)}, {".qzeros", bytes_of(qzeros)}, {".scales", bytes_of(scales16)}, {".g_idx", bytes_of(g_idx)}};
}

std::map<std::string, std::vector<uint8_t>> quantize_awq(const Linear & l, const std::vector<float> & w) {
    const QuantScheme & s = l.scheme;
    const int64_t K = l.in_features, N = l.out_features, G = s.group(int(K)), groups = (K + G - 1) / G;
    constexpr int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds column 8c + order[i]
    std::vector<uint16_t> scales16(size_t(groups * N));
    std::vector<uint8_t> zero(size_t(groups * N)), q(size_t(K * N));  // q: [K, N]
    parallel_for(N, [&](int64_t n) {
        for (int64_t g = 0; g < groups; g++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t k = g * G; k < std::min(K, (g + 1) * G); k++) {
                mn = std::min(mn, w[size_t(n * K + k)]);
                mx = std::max(mx, w[size_t(n * K + k)]);
            }
            const float sc = round_f16(std::max(mx - mn, 1e-5f) / 15.0f);
            const int z = std::clamp(-int(std::lround(mn / sc)), 0, 15);
            scales16[size_t(g * N + n)] = f32_to_f16(sc);
            zero[size_t(g * N + n)] = uint8_t(z);
            for (int64_t k = g * G; k < std::min(K, (g + 1) * G); k++) {
                q[size_t(k * N + n)] = uint8_t(std::clamp(int(std::lround(w[size_t(n * K + k)] / sc)) + z, 0, 15));
            }
        }
    });
    auto pack = [&](const std::vector<uint8_t> & v, int64_t rows) {
        std::vector<uint32_t> out(size_t(rows * (N / 8)), 0u);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < N / 8; c++) {
                uint32_t word = 0;
                for (int i = 0; i < 8; i++) word |= uint32_t(v[size_t(r * N + 8 * c + order[i])]) << (4 * i);
                out[size_t(r * (N / 8) + c)] = word;
            }
        }
        return out;
    };
    if (s.packing == QuantPacking::AwqGemv) {
        // Transposed: per output row, codes along K (natural nibble order), zeros along the groups, scales padded.
        const int64_t W = awq_gemv_zeros_width(K, int(G));
        std::vector<uint32_t> qw(size_t(N * (K / 8)), 0u), qz(size_t(N * W), 0u);
        std::vector<uint16_t> sc(size_t(N * 8 * W), 0);
        for (int64_t n = 0; n < N; n++) {
            for (int64_t k = 0; k < K; k++) qw[size_t(n * (K / 8) + k / 8)] |= uint32_t(q[size_t(k * N + n)]) << (4 * (k % 8));
            for (int64_t g = 0; g < groups; g++) {
                qz[size_t(n * W + g / 8)] |= uint32_t(zero[size_t(g * N + n)]) << (4 * (g % 8));
                sc[size_t(n * 8 * W + g)] = scales16[size_t(g * N + n)];
            }
        }
        return {{".qweight", bytes_of(qw)}, {".qzeros", bytes_of(qz)}, {".scales", bytes_of(sc)}};
    }
    return {{".qweight", bytes_of(pack(q, K))}, {".qzeros", bytes_of(pack(zero, groups))}, {".scales", bytes_of(scales16)}};
}

std::map<std::string, std::vector<uint8_t>> quantize_bnb(const Linear & l, const std::vector<float> & w, const std::string & dtype) {
    const QuantScheme & s = l.scheme;
    const float * table = bnb_code_table(s.packing);
    const int64_t total = int64_t(l.out_features) * l.in_features, bs = s.block_size, blocks = (total + bs - 1) / bs;
    std::vector<float> absmax(static_cast<size_t>(blocks));
    std::vector<uint8_t> codes(size_t((total + 1) / 2), 0);
    parallel_for(blocks, [&](int64_t b) {
        float m = 0;
        for (int64_t i = b * bs; i < std::min(total, (b + 1) * bs); i++) m = std::max(m, std::fabs(w[size_t(i)]));
        absmax[size_t(b)] = m;
        for (int64_t i = b * bs; i < std::min(total, (b + 1) * bs); i += 2) {
            int hi = nearest(table, 16, m > 0 ? w[size_t(i)] / m : 0.0f);
            int lo = i + 1 < total ? nearest(table, 16, m > 0 ? w[size_t(i + 1)] / m : 0.0f) : 0;
            codes[size_t(i / 2)] = uint8_t(hi << 4 | lo);
        }
    });
    std::map<std::string, std::vector<uint8_t>> out;
    out[".weight"] = codes;
    out[".weight.quant_map"] = bytes_of(std::vector<float>(table, table + 16));
    float offset = 0;
    if (s.double_quant) {
        // absmax - mean, quantized in blocks of 256 with the dynamic map.
        double sum = 0;
        for (float a : absmax) sum += a;
        offset = float(sum / double(blocks));
        const std::vector<float> map = dynamic_map();
        const int64_t nested = (blocks + 255) / 256;
        std::vector<float> nested_absmax(static_cast<size_t>(nested));
        std::vector<uint8_t> q(static_cast<size_t>(blocks));
        for (int64_t j = 0; j < nested; j++) {
            float m = 0;
            for (int64_t b = j * 256; b < std::min(blocks, (j + 1) * 256); b++) m = std::max(m, std::fabs(absmax[size_t(b)] - offset));
            nested_absmax[size_t(j)] = m;
            for (int64_t b = j * 256; b < std::min(blocks, (j + 1) * 256); b++) {
                q[size_t(b)] = uint8_t(nearest(map.data(), 256, m > 0 ? (absmax[size_t(b)] - offset) / m : 0.0f));
            }
        }
        out[".weight.absmax"] = q;
        out[".weight.nested_absmax"] = bytes_of(nested_absmax);
        out[".weight.nested_quant_map"] = bytes_of(map);
    } else {
        out[".weight.absmax"] = bytes_of(absmax);
    }
    const std::string state = bnb_quant_state_json(l, dtype, offset);
    out[std::string(".weight.quant_state.bitsandbytes__") + quant_packing_name(s.packing)] = std::vector<uint8_t>(state.begin(), state.end());
    return out;
}

}  // namespace

const float * bnb_code_table(QuantPacking packing) { return packing == QuantPacking::Nf4 ? k_nf4 : k_fp4; }

std::map<std::string, std::vector<uint8_t>> quantize_linear(const Linear & l, const std::vector<float> & w, uint64_t perm_seed,
                                                            const std::string & dtype) {
    switch (l.scheme.method) {
    case QuantMethod::Gptq: return quantize_gptq(l, w, perm_seed);
    case QuantMethod::Awq: return quantize_awq(l, w);
    case QuantMethod::Bnb4: return quantize_bnb(l, w, dtype);
    case QuantMethod::None: break;
    }
    QINFER_FAIL() << "quantize_linear: the linear is not quantized";
}


std::map<std::string, std::vector<uint8_t>> random_quantized_linear(const Linear & l, const std::string & module, int n_layers,
                                                                    uint64_t value_stream, uint64_t perm_seed, DType dense) {
    std::vector<float> weight(size_t(l.out_features) * l.in_features);  // fp32 [N, K]
    const RandomInit init = random_init(module + ".weight", {l.out_features, l.in_features}, WeightRole::Linear, n_layers);
    fill_random(value_stream, init, DType::F32, reinterpret_cast<uint8_t *>(weight.data()), weight.size() * 4);
    return quantize_linear(l, weight, perm_seed, torch_dtype_name(dense));
}

namespace {

// A quantized linear's stored tensors with their roles (bitsandbytes' codes live in `weight`).
std::vector<std::pair<Weight *, WeightRole>> quantized_slots(Linear & l) {
    if (l.scheme.method == QuantMethod::Bnb4) {
        return {{&l.weight, WeightRole::BnbCodes},
                {&l.absmax, WeightRole::BnbAbsmax},
                {&l.quant_map, WeightRole::BnbQuantMap},
                {&l.nested_absmax, WeightRole::BnbNestedAbsmax},
                {&l.nested_quant_map, WeightRole::BnbNestedQuantMap},
                {&l.quant_state, WeightRole::BnbQuantState}};
    }
    return {{&l.qweight, WeightRole::QWeight}, {&l.qzeros, WeightRole::QZeros}, {&l.scales, WeightRole::QScales}, {&l.g_idx, WeightRole::QGIdx}};
}

}  // namespace

std::shared_ptr<const void> dummy_weights(const ModelConfig & c, ModelWeights & w, bool values) {
    const DType dense = c.torch_dtype;
    torch_dtype_name(dense);  // bf16, fp16 or fp32
    struct Store {
        std::map<std::string, std::vector<uint8_t>> pools;                                   // by init
        std::map<std::string, std::map<std::string, std::vector<uint8_t>>> quantized;        // by shape and scheme
    };
    auto store = std::make_shared<Store>();
    const uint64_t seed = splitmix64(0x64756d6d79ull);  // "dummy"

    // Dense tensors: one pool per init, as long as the largest tensor of that init plus room for the windows' offsets.
    struct Pooled {
        Weight * slot;
        std::string pool;
    };
    std::vector<Pooled> pooled;
    std::map<std::string, std::pair<RandomInit, int64_t>> pool_specs;  // init, largest tensor (elements)
    visit_weights(c, w, [&](const std::string & name, const std::vector<int64_t> & shape, WeightRole role, Weight & slot) {
        if (role == WeightRole::KvScale) return;  // optional fp8 cache scales: absent
        slot.name = name;
        slot.shape = shape;
        switch (role) {
        case WeightRole::Norm:
        case WeightRole::Linear:
        case WeightRole::Bias:
        case WeightRole::Embedding:
        case WeightRole::Router: {
            slot.dtype = dense;
            const RandomInit init = random_init(name, shape, role, c.num_hidden_layers);
            char key[64];
            std::snprintf(key, sizeof key, "%.9g/%.9g", double(init.mean), double(init.std));
            auto & spec = pool_specs.try_emplace(key, init, 0).first->second;
            spec.second = std::max(spec.second, slot.numel());
            pooled.push_back({&slot, key});
            break;
        }
        default: break;  // quantized tensors: below, from their linear
        }
    });
    constexpr int64_t k_align = 64;                     // elements: windows start 128-byte aligned
    constexpr int64_t k_max_slack = int64_t(1) << 22;  // distinct offsets a pool offers: up to 65536
    auto slack_of = [&](int64_t largest) { return std::min(k_max_slack, (largest + k_align - 1) / k_align * k_align); };
    if (values) {
        for (const auto & [key, spec] : pool_specs) {
            std::vector<uint8_t> & pool = store->pools[key];
            pool.resize(size_t(spec.second + slack_of(spec.second)) * dtype_size(dense));
            fill_random(hash_string(key, seed), spec.first, dense, pool.data(), pool.size());
        }
        for (const Pooled & p : pooled) {
            const int64_t slack = slack_of(pool_specs.at(p.pool).second);
            const int64_t offset = int64_t(hash_string(p.slot->name, seed) % uint64_t(slack / k_align + 1)) * k_align;
            p.slot->data = store->pools.at(p.pool).data() + size_t(offset) * dtype_size(dense);
        }
    }

    // Quantized linears: one dense random weight per shape and scheme, quantized once.
    for_each_linear(w, [&](Linear & l) {
        if (!l.quantized()) return;
        const bool bnb = l.scheme.method == QuantMethod::Bnb4;
        const std::string & first = bnb ? l.weight.name : l.qweight.name;
        const std::string module = first.substr(0, first.rfind(bnb ? ".weight" : ".qweight"));
        const std::string group = act_order_key(module).substr(act_order_key(module).rfind('.') + 1);
        const std::string perm_key = group + "/" + std::to_string(l.in_features);
        const RandomInit init = random_init(module + ".weight", {l.out_features, l.in_features}, WeightRole::Linear, c.num_hidden_layers);
        char std_text[32];
        std::snprintf(std_text, sizeof std_text, "/%.9g", double(init.std));
        const std::string key = l.scheme.describe() + "/" + std::to_string(l.out_features) + "x" + std::to_string(l.in_features) + "/" +
                                perm_key + std_text;
        std::map<std::string, std::vector<uint8_t>> * bytes = nullptr;
        if (values) {
            auto it = store->quantized.find(key);
            if (it == store->quantized.end()) {
                it = store->quantized
                         .emplace(key, random_quantized_linear(l, module, c.num_hidden_layers, hash_string(key, seed), hash_string(perm_key, seed), dense))
                         .first;
            }
            bytes = &it->second;
        }
        for (auto [slot, role] : quantized_slots(l)) {
            if (slot->name.empty()) continue;  // not in this format (double quantization's tensors)
            slot->dtype = stored_dtype(role, dense, l.scheme);
            if (role == WeightRole::BnbQuantState) slot->shape = {int64_t(bnb_quant_state_json(l, torch_dtype_name(dense), 0).size())};
            if (!bytes) continue;
            const std::vector<uint8_t> & b = bytes->at(slot->name.substr(module.size()));
            if (b.size() != slot->nbytes()) {
                QINFER_FAIL() << "dummy weights: " << slot->name << " has " << b.size() << " bytes, its shape " << shape_str(slot->shape)
                              << " needs " << slot->nbytes();
            }
            slot->data = b.data();
        }
    });
    if (c.tie_word_embeddings) w.lm_head = w.embed_tokens;
    return store;
}

}  // namespace qinfer
