// Tensor parallel on the GPUs: the model split over `tp` GPUs as model/tp_plan.h plans it (whole GQA
// groups of heads; intermediate columns of the dense MLP, of every expert and of the shared expert, cut on the
// checkpoint's quantization groups), each rank a CudaQwenEngine on its GPU, driven by its own thread, over its slices
// (model/qwen_tp.h shard_model, the CPU's tensor parallel's split). The ranks' partial sums after o_proj, down_proj
// and the experts meet in one NCCL all-reduce each (CudaQwenEngine::reduce), queued on the rank's stream and captured
// into its decode graphs; in decode steps of up to k_gemv_max_m rows with every rank in this process, in one kernel
// over peer memory instead (link_peers, backends/cuda/peer_sum.h: 3.3-3.8 us against NCCL's 6.7-7.2 in a graph).
// The embedding and lm_head stay whole on every rank; decode steps of few rows compute each rank's share of the
// vocabulary and all-gather the logits (CudaQwenEngine::decode_logits), larger steps and prompts every logit on every
// rank. Every rank picks the same token from the same logits, which the engine checks after every
// call.
//
// One process drives the GPUs of its host; with --nnodes, one process a host (each running the same command, node 0
// at --master-addr) joins the same communicators through a TCP rendezvous (runtime/rendezvous.h). NVLink SHARP (NVLS)
// is switched off, as these machines require.
//
// No rank waits forever: a rank that throws aborts the communicators (the others' collectives return), and a watchdog
// (runtime/call_watchdog.h) aborts them on NCCL's asynchronous errors or when a call outlasts QINFER_TP_TIMEOUT (the
// connection of the nodes: the rendezvous's limit and a minute); a call still in flight 30 s after an abort ends
// the process with the reason.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "backends/cuda/nccl.h"
#include "backends/cuda/peer_sum.h"
#include "core/env.h"
#include "core/process_exit.h"
#include "model/qwen_cuda.h"
#include "model/quant.h"
#include "model/qwen_tp.h"
#include "model/rank_workers.h"
#include "runtime/call_watchdog.h"
#include "runtime/rendezvous.h"

namespace qinfer {

namespace cuda_engine {

namespace {

constexpr double k_rendezvous_timeout_s = 300;  // the nodes of a run may start minutes apart

// The communicators' state shared by the ranks' links and the abort: a collective is queued under a shared lock, an
// abort takes it exclusively, so that no rank calls NCCL on a communicator being (or already) aborted.
struct CommGate {
    std::shared_timed_mutex mu;
    std::atomic<bool> aborted{false};
};

class NcclLink : public DeviceCollective {
public:
    NcclLink(ncclComm_t comm, CommGate & gate) : comm_(comm), gate_(gate) {}
    void all_reduce(void * buf, size_t count, bool f32, cudaStream_t stream) override {
        std::shared_lock<std::shared_timed_mutex> lock(gate_.mu);
        check();
        NCCL_CHECK(ncclAllReduce(buf, buf, count, f32 ? ncclFloat32 : ncclBfloat16, ncclSum, comm_, stream));
    }
    void all_gather(const void * send, void * recv, size_t count, bool f32, cudaStream_t stream) override {
        std::shared_lock<std::shared_timed_mutex> lock(gate_.mu);
        check();
        NCCL_CHECK(ncclAllGather(send, recv, count, f32 ? ncclFloat32 : ncclBfloat16, comm_, stream));
    }
    float * partial_buffer(int which, size_t n) override {
        return peers_.ranks > 0 && n <= peers_.capacity ? peers_.parts[which][peers_.rank] : nullptr;
    }
    void add_partials(float * x, int which, size_t n, cudaStream_t stream) override {
        check();
        cuda::peer_add_partials(x, peers_, which, n, stream);
    }
    // Every rank's peer buffers, once they all exist (CudaTpEngine::link_peers).
    void use_peers(const cuda::PeerRanks & p) { peers_ = p; }

private:
    void check() const {
        if (gate_.aborted) QINFER_FAIL() << "tensor parallel: the collectives were aborted";
    }
    ncclComm_t comm_;
    CommGate & gate_;
    cuda::PeerRanks peers_;  // ranks 0: none
};

// Act-order GPTQ o_proj: a rank's input channels are its heads', which fall in every quantization group, unevenly;
// the GPUs' layout holds whole groups of consecutive sorted channels only. Such an o_proj stays whole on every rank,
// over every rank's gathered attention output (DevLayer::o_whole). Act-order down_proj is split by whole groups
// (shard_model).
void keep_act_order_o_proj_whole(const Model & full, Model & shard) {
    for (size_t l = 0; l < full.weights.layers.size(); l++) {
        const Linear & o = full.weights.layers[l].self_attn.o_proj;
        if (o.quantized() && has_act_order(o)) shard.weights.layers[l].self_attn.o_proj = o;
    }
}

// Checks before any weight is read: enough GPUs, heads that split.
void check_placement(const std::string & dir, const EngineOptions & opt) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
        cudaGetLastError();
        devices = 0;
    }
    const int local = opt.tp / std::max(1, opt.nnodes);
    if (local > devices) {
        QINFER_FAIL() << "--tp " << opt.tp << (opt.nnodes > 1 ? " over --nnodes " + std::to_string(opt.nnodes) : std::string()) << ": "
                      << local << " GPUs a node, only " << devices << " CUDA device(s) present";
    }
    if (local > cuda::k_max_devices) QINFER_FAIL() << "--tp " << opt.tp << ": at most " << cuda::k_max_devices << " GPUs in one process";
    plan_tensor_parallel(load_model_config(dir), opt.tp, 1);  // the heads; the intermediate sizes once the weights say their groups
}

class CudaTpEngine : public Engine {
public:
    CudaTpEngine(const std::string & dir, const EngineOptions & opt)
        : tp_(opt.tp), local_(opt.tp / std::max(1, opt.nnodes)), rank0_(opt.node_rank * local_),
          workers_(local_, std::max(1, (opt.threads > 0 ? opt.threads : max_threads()) / local_)) {
        check_placement(dir, opt);
        const auto t0 = std::chrono::steady_clock::now();
        full_ = load_model(dir, load_options(opt));
        const auto t1 = std::chrono::steady_clock::now();
        const ModelConfig & c = full_->config;
        // Bf16 kernels want 16-wide blocks of the intermediate dimension; quantized ones whole groups.
        const int align = tp_inter_align(*full_, k_tp_gpu_inter_align);
        std::vector<TpShard> plan = plan_tensor_parallel(c, tp_, align);
        for (TpShard & s : plan) {
            s.vocab0 = 0;  // embedding and lm_head whole on every rank
            s.n_vocab = c.vocab_size;
        }
        watchdog_ = std::make_unique<CallWatchdog>(k_abort_grace_s, [this] { return async_error(); }, [this](const std::string & why) { abort_comms(why); });
        watchdog_->begin("connecting the ranks (rendezvous, NCCL initialisation)", k_rendezvous_timeout_s + 60);
        init_comms(opt);
        watchdog_->end();
        const auto t2 = std::chrono::steady_clock::now();
        for (ncclComm_t comm : comms_) links_.push_back(std::make_unique<NcclLink>(comm, gate_));
        owned_.resize(static_cast<size_t>(local_));
        ranks_.resize(static_cast<size_t>(local_));
        const auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
        double split_s = 0;  // rank 0's
        run_ranks([&](size_t l) {
            const int rank = rank0_ + int(l);
            const auto s0 = std::chrono::steady_clock::now();
            std::unique_ptr<Model> shard = shard_model(*full_, plan[size_t(rank)], tp_, owned_[l], align);
            keep_act_order_o_proj_whole(*full_, *shard);
            if (l == 0) split_s = seconds(s0, std::chrono::steady_clock::now());
            ranks_[l] = std::make_unique<CudaQwenEngine>(std::move(shard), opt, RankPlace{int(l), rank, tp_, links_[l].get()});
        }, /*quiet_followers=*/true, /*watched=*/false);
        link_peers(c);
        std::fprintf(stderr, "tensor parallel: weights in host memory in %.1f s, ranks connected in %.1f s, shards split (rank 0: %.1f s), repacked and uploaded in %.1f s\n",
                     seconds(t0, t1), seconds(t1, t2), split_s, seconds(t2, std::chrono::steady_clock::now()));
    }
    ~CudaTpEngine() override {
        watchdog_.reset();
        // An abort under way: give it a while to finish before the process may exit under it; if it is still running
        // (a peer that died can keep ncclCommAbort blocked), the process must end without tearing CUDA and NCCL down.
        for (int i = 0; broken_ && !*aborted_ && i < 1000; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (broken_ && !*aborted_) request_exit_without_teardown();
        // Each rank's graphs, streams and buffers go on its own device.
        try {
            workers_.run_all([&](size_t r) {
                CUDA_CHECK(cudaSetDevice(int(r)));
                ranks_[r].reset();
                if (r < peer_buffers_.size()) peer_buffers_[r].reset();
            }, [] {});
        } catch (const std::exception &) {
        }
        for (ncclComm_t comm : comms_) {
            if (comm) ncclCommDestroy(comm);
        }
        cudaSetDevice(0);
    }

    const ModelConfig & config() const override { return full_->config; }
    std::string backend_name() const override { return "cuda-tp" + std::to_string(tp_); }

    // Allocations only, no collective: a rank out of memory leaves the engine usable (bench --max-batch probes so).
    void plan_batch(int n_sequences, int max_tokens) override {
        run_ranks([&](size_t r) { ranks_[r]->plan_batch(n_sequences, max_tokens); }, false, true, /*collectives=*/false);
    }
    uint64_t reserve_batch(int n_sequences, int max_tokens, int prompt_tokens) override {
        std::vector<uint64_t> bytes(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { bytes[r] = ranks_[r]->reserve_batch(n_sequences, max_tokens, prompt_tokens); }, false, true, /*collectives=*/false);
        return std::accumulate(bytes.begin(), bytes.end(), uint64_t(0));
    }
    int new_sequence(int max_tokens) override {
        std::vector<int> ids(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { ids[r] = ranks_[r]->new_sequence(max_tokens); });
        agree(ids, "sequence ids");
        return ids[0];
    }
    void free_sequence(int seq) override {
        run_ranks([&](size_t r) { ranks_[r]->free_sequence(seq); });
    }
    void forward(int seq, const std::vector<int> & tokens, bool all_logits, std::vector<float> & logits) override {
        std::vector<std::vector<float>> outs(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { ranks_[r]->forward(seq, tokens, all_logits, r == 0 ? logits : outs[r]); });
    }
    void forward_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, std::vector<float> & logits) override {
        std::vector<std::vector<float>> outs(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { ranks_[r]->forward_batch(seqs, tokens, r == 0 ? logits : outs[r]); });
    }
    bool decode_greedy(int seq, int token, int n_steps, int n_valid, std::vector<int> & out) override {
        return decode_all(out, [&](CudaQwenEngine & e, std::vector<int> & o) { return e.decode_greedy(seq, token, n_steps, n_valid, o); });
    }
    bool decode_greedy_batch(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid,
                             std::vector<int> & out) override {
        return decode_all(out, [&](CudaQwenEngine & e, std::vector<int> & o) { return e.decode_greedy_batch(seqs, tokens, n_steps, n_valid, o); });
    }
    bool decode_sampled(const std::vector<int> & seqs, const std::vector<int> & tokens, int n_steps, int n_valid, const SamplingParams & p,
                        const std::vector<History> & history, std::vector<int> & out) override {
        return decode_all(out, [&](CudaQwenEngine & e, std::vector<int> & o) { return e.decode_sampled(seqs, tokens, n_steps, n_valid, p, history, o); });
    }
    // Every GPU's peak together.
    uint64_t peak_memory_bytes() const override {
        uint64_t total = 0;
        for (int r = 0; r < local_; r++) total += cuda::DeviceAllocator::of_device(r).peak();
        return total;
    }
    PoolInfo make_pool(const PoolOptions & opt) override {
        // Rank 0 sizes the pool; the others take as many blocks, so that one block table serves every rank.
        PoolInfo info;
        run_ranks([&](size_t r) {
            if (r == 0) info = ranks_[0]->make_pool(opt);
        });
        PoolOptions same = opt;
        same.n_blocks = info.n_blocks;
        run_ranks([&](size_t r) {
            if (r > 0) ranks_[r]->make_pool(same);
        });
        return info;
    }
    void step(const std::vector<StepSegment> & segs, const std::vector<int> & tokens, StepOutput & out) override {
        std::vector<StepOutput> outs(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { ranks_[r]->step(segs, tokens, r == 0 ? out : outs[r]); });
        for (int r = 1; r < local_; r++) {
            if (outs[size_t(r)].tokens != out.tokens) QINFER_FAIL() << "tensor parallel: rank " << r << " picked other tokens than rank 0";
        }
    }

private:
    // The decode step's sums over peer memory (backends/cuda/peer_sum.h) where every rank is in this process and every
    // pair of GPUs reaches the other's memory; NCCL's all-reduce otherwise (several nodes, no peer access). Against
    // NCCL's all-reduce on two H200s, same calls: 7B BF16 --tp 2 352.4 -> 398.8 tok/s, 72B GPTQ-Int4 100.7 -> 111.6,
    // GPTQ-Int8 67.1 -> 73.0 (bench/results/2026-11-30-h200x2-peer-sum).
    void link_peers(const ModelConfig & c) {
        if (local_ != tp_ || local_ > cuda::k_peer_max_ranks) return;
        if (!cuda::enable_peer_access(local_)) {
            std::fprintf(stderr, "tensor parallel: the GPUs cannot reach each other's memory; NCCL sums every step\n");
            return;
        }
        peer_buffers_.resize(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { peer_buffers_[r] = std::make_unique<cuda::PeerBuffers>(size_t(k_gemv_max_m) * c.hidden_size); },
                  false, false);
        const std::vector<cuda::PeerRanks> views = cuda::link_peer_ranks(peer_buffers_);
        for (int r = 0; r < local_; r++) links_[size_t(r)]->use_peers(views[size_t(r)]);
    }

    // One host: every rank's communicator at once. Several (--nnodes): node 0 makes NCCL's unique id and the TCP
    // rendezvous at --master-addr hands it to the other nodes; each node then joins its ranks rank0_.. in one group.
    void init_comms(const EngineOptions & opt) {
        std::vector<ncclComm_t> comms;
        if (opt.nnodes <= 1) {
            comms = cuda::nccl_local_comms(local_);
        } else {
            comms = join_nodes(opt);
        }
        std::lock_guard<std::mutex> lock(abort_mu_);  // the watchdog's probe reads comms_
        comms_ = std::move(comms);
    }
    std::vector<ncclComm_t> join_nodes(const EngineOptions & opt) {
        cuda::nccl_nvls_off();
        std::vector<ncclComm_t> comms(static_cast<size_t>(local_));
        ncclUniqueId id{};
        if (opt.node_rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        const std::string got = rendezvous_broadcast(parse_master_address(opt.master_addr), opt.nnodes, opt.node_rank,
                                                     std::string(id.internal, sizeof id.internal), k_rendezvous_timeout_s);
        if (got.size() != sizeof id.internal) QINFER_FAIL() << "rendezvous: node 0 sent " << got.size() << " bytes, not an NCCL unique id";
        std::memcpy(id.internal, got.data(), sizeof id.internal);
        NCCL_CHECK(ncclGroupStart());
        for (int l = 0; l < local_; l++) {
            CUDA_CHECK(cudaSetDevice(l));
            NCCL_CHECK(ncclCommInitRank(&comms[size_t(l)], tp_, id, rank0_ + l));
        }
        NCCL_CHECK(ncclGroupEnd());
        return comms;
    }

    // fn(r) on every rank, each on its own thread with its GPU current. Where fn makes collectives, a failing rank
    // aborts the communicators, so that ranks waiting in a collective for it return instead of hanging; the engine is
    // then unusable. Without collectives (allocations) the first failure is rethrown once every rank has returned and
    // the engine goes on. A watched call is also aborted by the watchdog: on NCCL's asynchronous errors (a node whose
    // process went away, a broken connection) or past QINFER_TP_TIMEOUT.
    void run_ranks(const std::function<void(size_t)> & fn, bool quiet_followers = false, bool watched = true, bool collectives = true) {
        if (broken_) {
            const std::string & why = abort_reason_.empty() ? first_failure_ : abort_reason_;
            QINFER_FAIL() << "tensor parallel: the engine stopped after a rank failed" << (why.empty() ? "" : ": " + why);
        }
        if (watched) watchdog_->begin("a call of the ranks", timeout_s_, "QINFER_TP_TIMEOUT");
        try {
            workers_.run_all(
                [&](size_t r) {
                    CUDA_CHECK(cudaSetDevice(int(r)));
                    Progress::quiet_on_this_thread(quiet_followers && r > 0);
                    fn(r);
                    Progress::quiet_on_this_thread(false);
                },
                [&] {
                    if (collectives) abort_comms("");
                });
        } catch (const std::exception & e) {
            watchdog_->end();
            if (broken_ && first_failure_.empty()) first_failure_ = e.what();  // a caller that catches it (bench's warm-up) leaves it unseen
            fail_if_aborted();
            throw;
        } catch (...) {
            watchdog_->end();
            fail_if_aborted();
            throw;
        }
        watchdog_->end();
        fail_if_aborted();
    }
    void fail_if_aborted() {
        std::lock_guard<std::mutex> lock(abort_mu_);
        if (!abort_reason_.empty()) QINFER_FAIL() << "tensor parallel: " << abort_reason_ << "; the collectives were aborted";
    }
    // Aborts every communicator once: NCCL's kernels and the calls waiting in them return. A rank queueing a collective
    // holds the gate for a moment; one blocked there (a full launch queue behind a stuck collective) must not keep the
    // abort waiting, so after two seconds it goes on without the gate. ncclCommAbort itself runs on a thread of its own:
    // with a peer gone it can wait on the network, and the watchdog must stay free to end a stuck process.
    void abort_comms(const std::string & reason) {
        std::vector<ncclComm_t> doomed;
        {
            std::lock_guard<std::mutex> lock(abort_mu_);
            if (broken_) return;
            abort_reason_ = reason;
            broken_ = true;
            std::unique_lock<std::shared_timed_mutex> gate(gate_.mu, std::chrono::seconds(2));
            gate_.aborted = true;
            for (ncclComm_t & comm : comms_) {
                if (comm) doomed.push_back(comm);
                comm = nullptr;
            }
        }
        std::thread([doomed, done = aborted_] {
            for (ncclComm_t comm : doomed) ncclCommAbort(comm);
            *done = true;
        }).detach();
    }
    // The watchdog's probe: the first rank's asynchronous NCCL error ("": none).
    std::string async_error() {
        std::lock_guard<std::mutex> lock(abort_mu_);
        for (size_t l = 0; l < comms_.size(); l++) {
            ncclResult_t e = ncclSuccess;
            if (comms_[l] && ncclCommGetAsyncError(comms_[l], &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress) {
                return "rank " + std::to_string(rank0_ + int(l)) + ": NCCL reported " + ncclGetErrorString(e) + " (" + ncclGetLastError(comms_[l]) + ")";
            }
        }
        return "";
    }
    template <class T> void agree(const std::vector<T> & v, const char * what) {
        for (size_t r = 1; r < v.size(); r++) {
            if (v[r] != v[0]) QINFER_FAIL() << "tensor parallel: the ranks' " << what << " diverged (rank " << r << ")";
        }
    }
    template <class F> bool decode_all(std::vector<int> & out, F && fn) {
        std::vector<std::vector<int>> outs(static_cast<size_t>(local_));
        std::vector<int> ok(static_cast<size_t>(local_));
        run_ranks([&](size_t r) { ok[r] = fn(*ranks_[r], outs[r]) ? 1 : 0; });
        agree(ok, "decode paths");
        agree(outs, "tokens");
        out = std::move(outs[0]);
        return ok[0] != 0;
    }

    const int tp_;      // ranks over every node
    const int local_;   // ranks (GPUs 0..local_ - 1) of this node
    const int rank0_;   // this node's first rank
    std::unique_ptr<Model> full_;
    std::string first_failure_;  // the first rank failure's message, said again by every later call
    std::vector<ShardBuffers> owned_;  // per rank: column slices of its weights
    std::vector<ncclComm_t> comms_;
    CommGate gate_;
    std::vector<std::unique_ptr<NcclLink>> links_;
    std::vector<std::unique_ptr<cuda::PeerBuffers>> peer_buffers_;  // per rank, on its GPU (link_peers)
    std::vector<std::unique_ptr<CudaQwenEngine>> ranks_;
    RankWorkers workers_;
    std::atomic<bool> broken_{false};
    std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);  // the abort's ncclCommAbort calls returned
    std::mutex abort_mu_;          // comms_ (aborted, polled, published), abort_reason_
    std::string abort_reason_;     // why the watchdog aborted ("": a rank failed, its own error says why)
    const double timeout_s_ = read_env().tp_timeout_s;
    static constexpr double k_abort_grace_s = 30;  // an aborted call still in flight after this ends the process
    std::unique_ptr<CallWatchdog> watchdog_;       // last: stopped before the members it reads go
};

}  // namespace

}  // namespace cuda_engine

std::unique_ptr<Engine> make_cuda_tp_engine(const std::string & model_dir, const EngineOptions & opt) {
    QINFER_CHECK(opt.tp > 1) << "make_cuda_tp_engine: --tp " << opt.tp;
    return std::make_unique<cuda_engine::CudaTpEngine>(model_dir, opt);
}

}  // namespace qinfer
