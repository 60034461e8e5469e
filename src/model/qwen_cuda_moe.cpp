// The sparse MoE block of the CUDA engine (class in model/qwen_cuda.h): the router's logits, routing and grouping on
// the device, the routed experts (bf16 or quantized, by the kernels of backends/cuda/moe*.cu), the shared expert
// beside them in decode steps, and the weighted combine into the residual. Nothing waits for the host, except
// quantized experts no device kernel takes (DevLayer::experts_on_host), so MoE decode steps are CUDA graphs.
#include "model/qwen_cuda.h"

#include <algorithm>

namespace qinfer::cuda_engine {

// The routing's buffers, laid out for ws_tokens_ tokens (ensure_workspace).
cuda::MoeRouting CudaQwenEngine::moe_routing() const {
    const ModelConfig & cfg = model_->config;
    return cuda::moe_routing_in(moe_idx_.as<int>(), moe_w_.as<float>(), ws_tokens_, cfg.num_experts_per_tok, cfg.num_experts);
}

bool CudaQwenEngine::experts_on_host(int c) const {
    const int k = model_->config.num_experts_per_tok;
    return std::any_of(layers_.begin(), layers_.end(), [&](const DevLayer & L) { return L.experts_on_host(c, k); });
}

namespace {
// A GEMV's input in the MoE block: xn, or the residual with the norm fused (norm.x set); returns its kind.
cuda::GemvIn moe_input(cuda::GemvArgs & a, const bf16 * xn, const cuda::MoeNormIn & norm) {
    if (!norm.x) {
        a.x = xn;
        return cuda::GemvIn::Bf16;
    }
    a.x = norm.x;
    a.norm_w = norm.norm_w;
    a.eps = norm.eps;
    return cuda::GemvIn::NormF32;
}
}  // namespace

// router_logits_ fp32 [c, router rows] = xn W_router^T (the shared expert's gate last, where it has one).
void CudaQwenEngine::router(const DevLayer & L, int c, const bf16 * xn, const cuda::MoeNormIn & norm) {
    const int H = model_->config.hidden_size;
    if (c <= k_gemv_max_m) {
        cuda::GemvArgs a;
        a.w = L.router.ptr();
        a.n = L.router.n;
        a.k = H;
        const cuda::GemvIn in = moe_input(a, xn, norm);
        a.m = c;
        a.y = router_logits_.get();
        cuda::gemv(a, in, cuda::GemvOut::F32, stream_);
    } else {
        QINFER_CHECK(!norm.x) << "MoE: a step of " << c << " tokens needs its input normalised ahead";
        if (cuda::moe_router_pays(c, L.router.n) && cuda::moe_router_applies(xn, H, L.router.ptr())) {
            cuda::moe_router_logits(xn, c, H, L.router.ptr(), L.router.n, router_logits_.as<float>(), stream_);
        } else {
            cuda::gemm(xn, L.router.ptr(), c, L.router.n, H, router_logits_.get(), true, stream_);
        }
    }
}

// Sparse MoE block (Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock) on c tokens of xn, added into the residual x:
// the shared expert (if any), the router (with the shared expert's gate as its last row), routing and grouping on
// the device, the routed experts (cuda::moe_experts; quantized: cuda::moe_qexperts, or cuda::moe_qgemm for many rows
// an expert), the weighted combine. Decode steps of bf16 experts route, run the experts and (with no shared expert)
// combine in the two launches of cuda::moe_decode; with no shared expert, one token's router logits come from there
// too. Quantized experts neither kernel takes (act-order, no sm_90a for
// prefill steps) run one by one through linear() on their rows, counted on the host (DevLayer::experts_on_host).
void CudaQwenEngine::moe(const DevLayer & L, int c, const bf16 * xn, float * x, bool decode, const cuda::MoeNormIn & norm) {
    const ModelConfig & cfg = model_->config;
    const int H = cfg.hidden_size, E = cfg.num_experts, k = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size;
    const int router_rows = L.router.n;  // E (+ 1)
    // Decode steps of bf16 experts: routing, experts and (without a shared expert) the combine in two launches.
    const bool decode_kernels = L.experts_decode && c <= cuda::k_moe_gemv_max_tokens;
    // One token through quantized experts: the routing inside their gate/up launch, where that launch is one wave (one
    // token is never beyond the decode kernel's tile, so neither the host path nor the grouped GEMM takes it).
    const bool q_routed = c == 1 && L.expert_q_route;
    const bool on_host = L.experts_on_host(c, k);
    QINFER_CHECK(!norm.x || L.moe_normalises(c, k)) << "MoE: this step's experts read a normalised input";
    // The shared expert does not depend on the routing. In decode steps of experts on the device it runs on a second
    // stream beside the router and the routed experts, a branch of the decode graph joined before the combine: those
    // kernels are short and latency-bound, so the two chains overlap. GEMVs up to k_gemv_max_m tokens; bf16 cuBLASLt
    // GEMMs (a workspace a stream) into a SwiGLU buffer of their own up to k_moe_beside_max_rows. On an H200 (same
    // call, alternated twice; bench/results/2026-12-03-h200-moe-beside-lean) Qwen1.5-MoE-A2.7B BF16 at batch 16
    // decoded 2,181.19 / 2,182.46 -> 2,325.32 / 2,325.29 tok/s with the GEMMs beside (+6.6%), at batch 64 5,360.40 /
    // 5,365.54 -> 5,534.45 / 5,528.89 (+3.2%). The fork after the router instead, so the routed gate/up's blocks (PDL)
    // take the SMs before the shared expert's gate/up does, lost at one token (same call, alternated twice;
    // bench/results/2026-12-03-h200-moe-prologue, call 3): Qwen2-57B-A14B GPTQ-Int4 -1.7%, A2.7B GPTQ-Int4 -1.3%, BF16 -4.7%.
    const bool beside = L.has_shared && !on_host &&
                        (c <= k_gemv_max_m || (!L.shared.gate_up.quantized && !L.shared.down.quantized && c <= k_moe_beside_max_rows));
    if (L.has_shared) {
        struct StreamSwap {  // the shared expert's launches (through project() / mlp()) go to `s` while alive
            cudaStream_t & cur;
            cudaStream_t saved;
            StreamSwap(cudaStream_t & c, cudaStream_t s) : cur(c), saved(c) { cur = s; }
            ~StreamSwap() { cur = saved; }
        };
        if (beside) {
            CUDA_CHECK(cudaEventRecord(moe_fork_, stream_));
            CUDA_CHECK(cudaStreamWaitEvent(side_stream_, moe_fork_, 0));
        }
        StreamSwap on(stream_, beside ? side_stream_ : stream_);
        if (c <= k_gemv_max_m) {
            cuda::GemvArgs a;
            a.n = L.shared.down.k;
            a.k = H;
            const cuda::GemvIn in = moe_input(a, xn, norm);
            a.m = c;
            a.y = moe_gu_.get();  // not moe_act_, which the routed experts write meanwhile
            a.beside = beside;
            project(L.shared.gate_up, a, in, cuda::GemvOut::SiluMulBf16);
            a = cuda::GemvArgs{};
            a.n = H;
            a.k = L.shared.down.k;
            a.x = moe_gu_.get();
            a.m = c;
            a.y = moe_shared_.get();
            project(L.shared.down, a, cuda::GemvIn::Bf16, cuda::GemvOut::Bf16);
        } else {
            mlp(L.shared, xn, c, moe_gu_.as<bf16>(), beside ? moe_shared_act_.as<bf16>() : moe_act_.as<bf16>(), moe_shared_.as<bf16>());
        }
        if (beside) CUDA_CHECK(cudaEventRecord(moe_join_, side_stream_));
        else prof_.mark("shared expert");
    }
    // One token through bf16 decode kernels without a shared expert: the router's logits from the gate/up launch
    // (moe_decode.cu). On an H200 (same call, alternated twice; bench/results/2026-12-02-h200-router-in-launch)
    // Qwen3-30B-A3B BF16 decoded 374.19 / 374.26 -> 378.41 / 378.75 tok/s with it; Qwen1.5-MoE-A2.7B BF16, whose shared
    // expert forks beside the router, 589.81 / 590.43 -> 568.01 / 567.33: the gate/up blocks, launched early and waiting
    // for the router's count, held the SMs its shared expert's gate/up had taken at the fork (its duration doubled).
    // That launch without PDL instead (the blocks start only when o_proj ends, beside the shared expert's): 587.66 /
    // 587.70 -> 551.47 / 551.95 (-6.1%): the router's rows then run on the critical path after o_proj, their weights
    // not asked for ahead (routed gate/up 30.9 us a layer against ~26; bench/results/2026-12-02-h200-rs-silu, call 1).
    const bool router_in_launch = decode_kernels && !L.has_shared && cuda::moe_decode_router_applies(c, router_rows, E, H);
    if (!router_in_launch) router(L, c, xn, norm);
    const bool quantized = !L.experts.empty(), grouped = L.experts_grouped(c, k);
    const int tile = grouped ? cuda::k_moe_qgemm_rows : quantized ? cuda::k_moe_qtile_rows : cuda::moe_tile_rows(c, k, E);
    cuda::MoeRouting r = moe_routing();
    int * const router_count = moe_arrivals_.as<int>() + cuda::moe_decode_arrivals(std::min(ws_tokens_, cuda::k_moe_gemv_max_tokens), H);
    // One token: the routing handed to the down launch's blocks before they wait for the gate/up launch to end
    // (MoeDecode::ids_ready), so they ask for their weights while it still streams. On an H200 (same call, alternated
    // twice; bench/results/2026-12-04-h200-moe-early-ids, call 2), tok/s at input 1: Qwen2-57B-A14B GPTQ-Int4 298.70 /
    // 298.44 -> 306.55 / 306.09, Qwen1.5-MoE-A2.7B GPTQ-Int4 736.18 / 736.33 -> 764.20 / 761.73, Qwen3-30B-A3B BF16
    // 379.35 / 378.97 -> 381.17 / 381.08; but A2.7B BF16 588.90 / 588.73 -> 569.86 / 569.66: its bf16 down blocks,
    // busy early, slowed the shared expert's chain beside them. Bf16 experts with a shared expert do without.
    int * const ids_ready = c == 1 && (!L.experts.empty() || !L.has_shared) ? router_count + 1 : nullptr;
    float * part = decode ? peer_partial(1, size_t(c) * H) : nullptr;
    float * sum = part ? part : x;
    const bool accumulate = !part && !partial_only();
    if (!decode_kernels && !q_routed) cuda::moe_route(router_logits_.as<float>(), router_rows, c, E, k, cfg.norm_topk_prob, tile, r, stream_);
    prof_.mark("router");
    if (decode_kernels) {
        cuda::MoeDecode m;
        m.logits = router_logits_.as<float>();
        m.stride = router_rows;
        m.top_k = k;
        m.renormalise = cfg.norm_topk_prob;
        m.experts = cuda::MoeExperts{L.expert_gate_up.as<bf16>(), L.expert_down.as<bf16>(), E, H, I};
        m.ids = r.ids;
        m.weights = r.weights;
        m.arrivals = moe_arrivals_.as<int>();
        m.norm = norm;
        if (router_in_launch) {
            m.router_w = L.router.ptr();
            m.router_rows = router_rows;
            m.router_count = router_count;
        }
        m.ids_ready = ids_ready;
        cuda::moe_decode(xn, c, m, moe_act_.as<bf16>(), moe_out_.as<bf16>(), L.has_shared ? nullptr : sum, accumulate, stream_);
        r.slot_of = nullptr;  // the experts' rows in assignment order
    } else if (q_routed) {
        const cuda::MoeQuantExperts w{L.expert_q.gate_up.q, L.expert_q.down.q, E, H, I};
        // The shared expert's gate/up blocks beside it, which the routed gate/up's K split leaves room for.
        const int beside_blocks = beside && L.shared.gate_up.quantized ? cuda::qgemv_beside_blocks(L.shared.gate_up.q, L.shared.down.k) : 0;
        cuda::moe_qexperts_routed(xn, router_logits_.as<float>(), k, cfg.norm_topk_prob, w, r.ids, r.weights, moe_act_.as<bf16>(), moe_out_.as<bf16>(),
                                  stream_, norm, ids_ready, beside_blocks);
        r.slot_of = nullptr;  // the experts' rows in assignment order
    } else if (!quantized) {
        const cuda::MoeExperts w{L.expert_gate_up.as<bf16>(), L.expert_down.as<bf16>(), E, H, I};
        cuda::moe_experts(xn, c, k, w, r, tile, moe_act_.as<bf16>(), moe_out_.as<bf16>(), stream_);
    } else if (grouped) {
        const cuda::MoeQuantExperts w{L.expert_q.gate_up.q, L.expert_q.down.q, E, H, I};
        cuda::moe_qgemm(xn, c, k, w, r, moe_act_.as<bf16>(), moe_out_.as<bf16>(), stream_);
    } else if (!on_host) {
        const cuda::MoeQuantExperts w{L.expert_q.gate_up.q, L.expert_q.down.q, E, H, I};
        cuda::moe_qexperts(xn, c, k, w, r, moe_act_.as<bf16>(), moe_out_.as<bf16>(), stream_, norm);
    } else {
        int * offsets = static_cast<int *>(moe_offsets_host_.host());
        CUDA_CHECK(cudaMemcpyAsync(offsets, r.offsets, size_t(E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int e = 0; e < E; e++) {
            const int m = offsets[e + 1] - offsets[e];
            if (m == 0) continue;
            cuda::gather_rows(xn, r.token_of + offsets[e], m, H, moe_in_.as<bf16>(), stream_);
            mlp(L.experts[size_t(e)], moe_in_.as<bf16>(), m, moe_gu_.as<bf16>(), moe_act_.as<bf16>(), moe_out_.as<bf16>() + size_t(offsets[e]) * H);
        }
    }
    prof_.mark("experts");
    if (beside) CUDA_CHECK(cudaStreamWaitEvent(stream_, moe_join_, 0));
    if (!decode_kernels || L.has_shared) {
        cuda::moe_combine(sum, accumulate, c, H, k, r, moe_out_.as<bf16>(), L.has_shared ? moe_shared_.as<bf16>() : nullptr,
                          L.has_shared ? router_logits_.as<float>() + E : nullptr, router_rows, stream_);
        prof_.mark("combine");
    }
    if (part) add_partials(x, 1, size_t(c) * H);
    else reduce(x, size_t(c) * H);
}

}  // namespace qinfer::cuda_engine
