#include "runtime/engine.h"

#include <algorithm>
#include <set>

#include "core/check.h"
#include "model/weights.h"

namespace qinfer {

void check_batch(const std::vector<int> & seqs, const std::vector<int> & tokens) {
    if (seqs.empty()) QINFER_FAIL() << "a batch needs at least one sequence";
    if (seqs.size() != tokens.size()) QINFER_FAIL() << "batch of " << seqs.size() << " sequences given " << tokens.size() << " tokens";
    if (std::set<int>(seqs.begin(), seqs.end()).size() != seqs.size()) QINFER_FAIL() << "a batch names the same sequence twice";
}

PoolInfo Engine::make_pool(const PoolOptions &) { QINFER_FAIL() << "the " << backend_name() << " backend has no continuous batching"; }

void Engine::step(const std::vector<StepSegment> &, const std::vector<int> &, StepOutput &) {
    QINFER_FAIL() << "the " << backend_name() << " backend has no continuous batching";
}

uint64_t Engine::reserve_batch(int, int, int) { QINFER_FAIL() << "the " << backend_name() << " backend holds no device memory to reserve"; }

void Engine::forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) {
    check_batch(seqs, tokens);
    const size_t V = size_t(config().vocab_size);
    logits.resize(seqs.size() * V);
    std::vector<float> one;
    for (size_t i = 0; i < seqs.size(); i++) {
        forward(seqs[i], {tokens[i]}, false, one);
        std::copy(one.begin(), one.end(), logits.begin() + long(i * V));
    }
}

#if defined(QINFER_CUDA) && defined(QINFER_HAVE_NCCL)
std::unique_ptr<Engine> make_cuda_tp_engine(const std::string & model_dir, const EngineOptions & opt);  // model/qwen_cuda_tp.cpp
#endif
#ifdef QINFER_CUDA
std::unique_ptr<Engine> make_cuda_engine(const std::string & model_dir, const EngineOptions & opt);
bool cuda_device_present();
bool cuda_available() { return cuda_device_present(); }
#else
bool cuda_available() { return false; }
#endif

LoadOptions load_options(const EngineOptions & opt) {
    LoadOptions l;
    l.past_context = opt.past_context ? opt.max_context : 0;
    l.dummy = opt.dummy_weights;
    return l;
}

std::unique_ptr<Engine> make_engine(const std::string & model_dir, const EngineOptions & opt) {
    if (opt.tp < 1) QINFER_FAIL() << "--tp " << opt.tp << ": the number of ranks must be at least 1";
    if (opt.nnodes < 1) QINFER_FAIL() << "--nnodes " << opt.nnodes << ": must be at least 1";
    if (opt.nnodes > 1) {
        if (opt.tp % opt.nnodes != 0) QINFER_FAIL() << "--tp " << opt.tp << " does not split evenly over --nnodes " << opt.nnodes;
        if (opt.node_rank < 0 || opt.node_rank >= opt.nnodes) QINFER_FAIL() << "--node-rank " << opt.node_rank << " is not in 0.." << opt.nnodes - 1;
        if (opt.master_addr.empty()) QINFER_FAIL() << "--nnodes " << opt.nnodes << " needs --master-addr HOST:PORT (node 0's address)";
        if (opt.backend == "cpu" || !cuda_available()) QINFER_FAIL() << "--nnodes: tensor parallel across hosts runs on the GPUs only";
    }
    if (opt.tp > 1) {
        if (opt.backend == "cpu" || (opt.backend == "auto" && !cuda_available())) return make_cpu_tp_engine(model_dir, opt);
#if defined(QINFER_CUDA) && defined(QINFER_HAVE_NCCL)
        if (!cuda_available()) QINFER_FAIL() << "--backend cuda: no CUDA device found";
        return make_cuda_tp_engine(model_dir, opt);
#else
        QINFER_FAIL() << "--tp " << opt.tp << " on the GPUs: this qinfer was built without CUDA and NCCL (--backend cpu runs tensor parallel on the CPU)";
#endif
    }
    if (opt.backend == "cpu") return make_cpu_engine(model_dir, opt);
    if (opt.backend == "cuda" || (opt.backend == "auto" && cuda_available())) {
#ifdef QINFER_CUDA
        if (!cuda_available()) QINFER_FAIL() << "--backend cuda: no CUDA device found";
        return make_cuda_engine(model_dir, opt);
#else
        QINFER_FAIL() << "--backend cuda: this qinfer was built without CUDA";
#endif
    }
    if (opt.backend != "auto") QINFER_FAIL() << "unknown backend '" << opt.backend << "' (auto, cpu, cuda)";
    return make_cpu_engine(model_dir, opt);
}

}  // namespace qinfer
