#include "tools/synth_quant.h"

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
#include "tools/args.h"

namespace qinfer {

using json = nlohmann::json;

const char * synth_quant_kinds() { return "gptq-int2, gptq-int3, gptq-int4, gptq-int8, awq, awq-gemv, autoround-sym, autoround-asym, nf4, fp4"; }

SynthQuant synth_quant_from_args(const Args & a) {
    SynthQuant q;
    q.kind = a.str("quant");
    q.group_size = int(a.integer("group-size", 128));
    q.desc_act = a.flag("desc-act");
    q.gptq_format = a.str("gptq-format", "v1");
    if (a.flag("asym")) q.sym = 0;
    q.double_quant = a.flag("double-quant");
    if (q.kind.empty() && (a.has("group-size") || q.desc_act || a.has("gptq-format") || q.sym == 0 || q.double_quant)) {
        QINFER_FAIL() << "--group-size, --desc-act, --gptq-format, --asym and --double-quant need --quant";
    }
    if (q.kind == "bf16") q.kind.clear();
    if (!q.kind.empty()) synth_quant_config(q);  // validates
    return q;
}

json synth_quant_config(const SynthQuant & q) {
    if (q.group_size != -1 && q.group_size <= 0) QINFER_FAIL() << "--group-size must be -1 or positive, got " << q.group_size;
    if (q.gptq_format != "v1" && q.gptq_format != "v2") QINFER_FAIL() << "--gptq-format must be v1 or v2, got '" << q.gptq_format << "'";
    const bool gptq = q.kind.rfind("gptq-int", 0) == 0;
    if (q.desc_act && !gptq) QINFER_FAIL() << "--desc-act applies to GPTQ checkpoints only";
    if (gptq) {
        const std::string b = q.kind.substr(8);
        if (b != "2" && b != "3" && b != "4" && b != "8") QINFER_FAIL() << "unknown --quant '" << q.kind << "' (" << synth_quant_kinds() << ")";
        json c = {{"quant_method", "gptq"}, {"bits", std::stoi(b)}, {"group_size", q.group_size}, {"desc_act", q.desc_act},
                  {"sym", q.sym != 0}, {"damp_percent", 0.01}, {"static_groups", false}, {"true_sequential", true}};
        if (q.gptq_format == "v2") {
            c["checkpoint_format"] = "gptq_v2";
            c["pack_dtype"] = "int32";
            c["meta"] = {{"quantizer", {"gptqmodel (qinfer synth, round-to-nearest)"}}};
        } else {
            c["checkpoint_format"] = "gptq";
            c["use_exllama"] = true;
            c["exllama_config"] = {{"version", 1}};
        }
        return c;
    }
    if (q.kind == "awq" || q.kind == "awq-gemv") {
        return {{"quant_method", "awq"}, {"bits", 4}, {"group_size", q.group_size}, {"zero_point", true},
                {"version", q.kind == "awq" ? "gemm" : "gemv"}, {"modules_to_not_convert", nullptr}};
    }
    if (q.kind == "autoround-sym" || q.kind == "autoround-asym") {
        const bool sym = q.kind == "autoround-sym";
        return {{"quant_method", "auto-round"}, {"packing_format", sym ? "auto_round:auto_gptq" : "auto_round:auto_awq"},
                {"bits", 4}, {"group_size", q.group_size}, {"sym", sym}, {"data_type", "int"}, {"iters", 0},
                {"autoround_version", "qinfer synth (round-to-nearest)"}};
    }
    if (q.kind == "nf4" || q.kind == "fp4") {
        return {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"load_in_8bit", false}, {"bnb_4bit_quant_type", q.kind},
                {"bnb_4bit_use_double_quant", q.double_quant}, {"bnb_4bit_compute_dtype", "bfloat16"},
                {"bnb_4bit_quant_storage", "uint8"}, {"llm_int8_skip_modules", nullptr}};
    }
    QINFER_FAIL() << "unknown --quant '" << q.kind << "' (" << synth_quant_kinds() << ")";
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

// bitsandbytes' code tables (quant_map) for NF4 and FP4.
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
    const float * table = s.packing == QuantPacking::Nf4 ? k_nf4 : k_fp4;
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

}  // namespace qinfer
