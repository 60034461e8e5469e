#include "model/tp_plan.h"

#include "core/check.h"

namespace qinfer {

namespace {

// [begin, end) of part r when `units` units are split into `parts` parts as evenly as possible (the larger parts last).
std::pair<int, int> even_part(int units, int parts, int r) { return {int(int64_t(units) * r / parts), int(int64_t(units) * (r + 1) / parts)}; }

}  // namespace

std::pair<int, int> tp_part(int size, int align, int parts, int r) {
    const int units = size / align;
    auto [u0, u1] = even_part(units, parts, r);
    return {u0 * align, r == parts - 1 ? size : u1 * align};
}

std::vector<TpShard> plan_tensor_parallel(const ModelConfig & c, int tp, int inter_align, int vocab_align) {
    const int n_q = c.num_attention_heads, n_kv = c.num_key_value_heads;
    if (tp < 1) QINFER_FAIL() << "--tp " << tp << ": the number of ranks must be at least 1";
    if (n_q < 1 || n_kv < 1 || n_q % n_kv != 0) QINFER_FAIL() << "tensor parallel: " << n_q << " query heads over " << n_kv << " KV heads";
    if (tp > n_q) QINFER_FAIL() << "--tp " << tp << ": more ranks than the model's " << n_q << " query heads";
    if (tp > n_kv && tp % n_kv != 0) {
        QINFER_FAIL() << "--tp " << tp << ": with more ranks than the model's " << n_kv << " KV heads, the rank count must be a multiple of " << n_kv;
    }
    const int inter = c.num_experts > 0 ? c.moe_intermediate_size : c.intermediate_size;
    if (inter_align < 1 || vocab_align < 1) QINFER_FAIL() << "tensor parallel: alignments must be >= 1";
    if (inter / inter_align < tp) QINFER_FAIL() << "--tp " << tp << ": the intermediate size " << inter << " has fewer than " << tp << " parts of " << inter_align;
    if (c.vocab_size / vocab_align < tp) QINFER_FAIL() << "--tp " << tp << ": the vocabulary of " << c.vocab_size << " is too small to split";
    const int rep = n_q / n_kv;
    std::vector<TpShard> plan(static_cast<size_t>(tp));
    for (int r = 0; r < tp; r++) {
        TpShard & s = plan[size_t(r)];
        s.rank = r;
        if (tp <= n_kv) {
            auto [g0, g1] = even_part(n_kv, tp, r);  // whole groups
            s.kv_head0 = g0;
            s.n_kv_heads = g1 - g0;
            s.q_head0 = g0 * rep;
            s.n_q_heads = (g1 - g0) * rep;
        } else {
            const int per_kv = tp / n_kv, kv = r / per_kv;  // ranks kv * per_kv .. share KV head kv
            auto [h0, h1] = even_part(rep, per_kv, r % per_kv);
            s.kv_head0 = kv;
            s.n_kv_heads = 1;
            s.q_head0 = kv * rep + h0;
            s.n_q_heads = h1 - h0;
        }
        auto [i0, i1] = tp_part(inter, inter_align, tp, r);
        s.inter0 = i0;
        s.n_inter = i1 - i0;
        auto [v0, v1] = tp_part(c.vocab_size, vocab_align, tp, r);
        s.vocab0 = v0;
        s.n_vocab = v1 - v0;
        if (s.n_q_heads < 1) QINFER_FAIL() << "--tp " << tp << ": rank " << r << " would hold no query head (" << rep << " a KV head)";
    }
    return plan;
}

}  // namespace qinfer
