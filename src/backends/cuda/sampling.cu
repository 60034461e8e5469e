// The next token on the device: greedy argmax (two passes over the vocabulary: blocks of a slice each, then a merge)
// and sampling with the host Sampler's rules (runtime/sampler.h), so decode steps that pick tokens run inside the CUDA
// graph with no logits leaving the card.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"

namespace qinfer::cuda {

namespace {

constexpr int k_argmax_threads = 256;
constexpr int k_argmax_blocks = 128;

// (value, id) pairs: the larger value wins, the lower id on ties.
__device__ __forceinline__ void argmax_merge(float & bv, int & bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
    }
}

__device__ __forceinline__ void block_argmax(float & bv, int & bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / 32); w++) argmax_merge(bv, bi, sv[w], si[w]);
    }
}

// Pass 1: each block reduces a strided slice of the logits to one (value, id) pair.
__global__ void __launch_bounds__(k_argmax_threads) argmax_partial_kernel(const float * logits, int n, float * partial) {
    pdl_wait();
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = blockIdx.x * k_argmax_threads + threadIdx.x; i < n; i += k_argmax_blocks * k_argmax_threads) {
        argmax_merge(bv, bi, logits[i], i);
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = bv;
        reinterpret_cast<int *>(partial)[2 * blockIdx.x + 1] = bi;
    }
}

// Pass 2: one block of k_argmax_blocks threads merges the pairs and advances the decode state.
__global__ void argmax_final_kernel(const float * partial, int * state, int * out_tokens) {
    pdl_wait();
    float bv = partial[2 * threadIdx.x];
    int bi = reinterpret_cast<const int *>(partial)[2 * threadIdx.x + 1];
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        if (bi == 0x7fffffff) bi = 0;  // all NaN: a defined token rather than garbage
        state[0] = bi;
        out_tokens[state[2]] = bi;
        state[1] += 1;
        state[2] += 1;
        state[3] += 1;
    }
}

// A batch's argmax in two passes. Pass 1: block (p, r) reduces part p of row r's n_valid ids (consecutive ids, eight
// loads in flight per thread) to one (value, id) pair in partial [rows][parts]. (One block a row, one load in flight
// a thread, took 33.9 us a step at batch 4 on an H200; this way 7B GPTQ-Int4 batch 4 / 16 +1.2 / +0.9%, BF16 +1.4 /
// +0.6%; bench/results/2026-12-01-h200-int8-ring.)
__global__ void __launch_bounds__(k_argmax_threads)
    argmax_rows_partial_kernel(const float * logits, int vocab, int n_valid, int parts, float * partial) {
    pdl_wait();
    const int p = blockIdx.x, r = blockIdx.y;
    const int per = (n_valid + parts - 1) / parts, begin = p * per, end = min(n_valid, begin + per);
    const float * row = logits + int64_t(r) * vocab;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    constexpr int k_unroll = 8;
    for (int i0 = begin + int(threadIdx.x); i0 < end; i0 += k_unroll * k_argmax_threads) {
        float v[k_unroll];
#pragma unroll
        for (int u = 0; u < k_unroll; u++) {
            const int i = i0 + u * k_argmax_threads;
            v[u] = i < end ? row[i] : -INFINITY;
        }
#pragma unroll
        for (int u = 0; u < k_unroll; u++) {
            const int i = i0 + u * k_argmax_threads;
            if (i < end) argmax_merge(bv, bi, v[u], i);
        }
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        partial[2 * (size_t(r) * parts + p)] = bv;
        reinterpret_cast<int *>(partial)[2 * (size_t(r) * parts + p) + 1] = bi;
    }
}

// Pass 2: block r merges row r's parts (one a thread) and advances the decode state of its sequence.
__global__ void argmax_rows_final_kernel(const float * partial, int parts, int rows, int * tokens, int * pos, const int * step, int * len, int * out) {
    pdl_wait();
    const int r = blockIdx.x;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    if (int(threadIdx.x) < parts) {
        bv = partial[2 * (size_t(r) * parts + threadIdx.x)];
        bi = reinterpret_cast<const int *>(partial)[2 * (size_t(r) * parts + threadIdx.x) + 1];
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        if (bi == 0x7fffffff) bi = 0;
        tokens[r] = bi;
        out[int64_t(*step) * rows + r] = bi;
        pos[r] += 1;
        len[r] += 1;
    }
}

// After every row has read it: the step counter of a batch advances.
__global__ void step_advance_kernel(int * step) {
    pdl_wait();
    *step += 1;
}

constexpr int k_sample_threads = 256;

// A uniform double in [0, 1) from the seed, the token's position and the row (splitmix64's finaliser).
__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t pos, uint64_t row) {
    uint64_t z = seed ^ (pos * 0x9E3779B97F4A7C15ull) ^ (row * 0xD1B54A32D192ED03ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) * (1.0 / 9007199254740992.0);
}

struct SampleArgs {
    const float * logits;  // [rows, vocab]
    int vocab, n_valid, rows;
    SampleParams p;
    uint8_t * seen;  // [rows, vocab]
    int * counts;    // [rows, vocab]
    float * work;    // [rows, vocab]
    int *tokens, *pos, *step, *len, *out;
};

// The draw of sample_rows_kernel and pick_rows_kernel, after penalties and temperature are in `work` (a row of
// n_valid values, consumed): the top_k candidates by k block-wide argmax passes (each winner marked NaN, which never
// wins again; ties to the lower id, as the host's sort), then on thread 0 the softmax over them, the top-p and min-p
// cuts and the draw with u in [0, 1). Every thread of the block calls it; the token is thread 0's (others get -1).
__device__ int draw_top_k(float * work, int n_valid, int top_k, float top_p, float min_p, double u01) {
    __shared__ float cand_v[k_sample_max_k];
    __shared__ int cand_i[k_sample_max_k];
    const int k = max(1, min(min(top_k, k_sample_max_k), n_valid));
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < n_valid; i += k_sample_threads) argmax_merge(bv, bi, work[i], i);
        block_argmax(bv, bi);
        if (threadIdx.x == 0) {
            if (bi == 0x7fffffff) bi = 0;
            cand_v[j] = bv;
            cand_i[j] = bi;
            work[bi] = NAN;
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return -1;
    double prob[k_sample_max_k];
    double sum = 0;
    for (int j = 0; j < k; j++) sum += (prob[j] = exp(double(cand_v[j]) - double(cand_v[0])));
    for (int j = 0; j < k; j++) prob[j] /= sum;
    int cut = k;
    if (top_p < 1.0f) {
        double cum = 0;  // the smallest prefix whose mass reaches top_p
        for (int j = 0; j < k; j++) {
            cum += prob[j];
            if (cum >= top_p) {
                cut = j + 1;
                break;
            }
        }
    }
    if (min_p > 0.0f) {
        const double threshold = min_p * prob[0];
        int c = 1;
        while (c < cut && prob[c] >= threshold) c++;
        cut = c;
    }
    double total = 0;
    for (int j = 0; j < cut; j++) total += prob[j];
    const double u = u01 * total;
    double acc = 0;
    for (int j = 0; j < cut; j++) {
        acc += prob[j];
        if (u < acc) return cand_i[j];
    }
    return cand_i[cut - 1];
}

// One block per row: penalties and temperature into `work`, the top_k candidates by k block-wide argmax passes
// (each winner is then marked NaN, which never wins again; ties go to the lower id, as the host's sort), then on one
// thread the softmax over them, the top-p and min-p cuts and the draw.
__global__ void __launch_bounds__(k_sample_threads) sample_rows_kernel(SampleArgs a) {
    pdl_wait();
    const int r = blockIdx.x;
    const float * row = a.logits + int64_t(r) * a.vocab;
    float * work = a.work + int64_t(r) * a.vocab;
    uint8_t * seen = a.seen + int64_t(r) * a.vocab;
    int * counts = a.counts + int64_t(r) * a.vocab;
    const SampleParams & p = a.p;
    for (int i = threadIdx.x; i < a.n_valid; i += k_sample_threads) {
        float l = row[i];
        if (p.repetition_penalty != 1.0f && seen[i]) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
        if (counts[i]) l -= p.presence_penalty + p.frequency_penalty * float(counts[i]);
        work[i] = l / p.temperature;
    }
    __syncthreads();
    const int tok = draw_top_k(work, a.n_valid, p.top_k, p.top_p, p.min_p, uniform01(p.seed, uint64_t(a.pos[r]), uint64_t(r)));
    if (threadIdx.x != 0) return;
    a.tokens[r] = tok;
    a.out[int64_t(*a.step) * a.rows + r] = tok;
    a.pos[r] += 1;
    a.len[r] += 1;
    seen[tok] = 1;
    counts[tok] += 1;
}

// The token of one row by its own settings (a whole block calls it; the token is thread 0's): penalties over its
// history, then the argmax over its ids (temperature 0), or top-k sampling as sample_rows_kernel, its draw hashing the
// seed and `pos`.
__device__ int pick_row_token(const float * row, int vocab, const RowPick & p, const int * history, float * work, int * counts, int pos) {
    const int n_valid = max(1, min(p.n_valid, vocab));
    const bool rep = p.repetition_penalty != 1.0f, counted = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (p.temperature <= 0.0f && !rep && !counted) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < n_valid; i += k_sample_threads) argmax_merge(bv, bi, row[i], i);
        block_argmax(bv, bi);
        return bi == 0x7fffffff ? 0 : bi;
    }
    for (int i = threadIdx.x; i < n_valid; i += k_sample_threads) work[i] = row[i];
    __syncthreads();
    const int * h = history + p.hist_off;
    if (rep) {
        // Each id of the prompt and output once: writing the penalised logit again for a repeated id is the same.
        for (int j = threadIdx.x; j < p.n_prompt + p.n_output; j += k_sample_threads) {
            const int id = h[j];
            if (id < 0 || id >= n_valid) continue;
            const float l = row[id];
            work[id] = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
        }
        __syncthreads();
    }
    if (counted) {
        const int * gen = h + p.n_prompt;
        for (int j = threadIdx.x; j < p.n_output; j += k_sample_threads) {
            if (gen[j] >= 0 && gen[j] < n_valid) atomicAdd(&counts[gen[j]], 1);
        }
        __syncthreads();
        // The first to take an id's count applies it (and leaves the count zero again).
        for (int j = threadIdx.x; j < p.n_output; j += k_sample_threads) {
            if (gen[j] < 0 || gen[j] >= n_valid) continue;
            const int c = atomicExch(&counts[gen[j]], 0);
            if (c > 0) work[gen[j]] -= p.presence_penalty + p.frequency_penalty * float(c);
        }
        __syncthreads();
    }
    if (p.temperature <= 0.0f) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < n_valid; i += k_sample_threads) argmax_merge(bv, bi, work[i], i);
        block_argmax(bv, bi);
        return bi == 0x7fffffff ? 0 : bi;
    }
    for (int i = threadIdx.x; i < n_valid; i += k_sample_threads) work[i] /= p.temperature;
    __syncthreads();
    return draw_top_k(work, n_valid, p.top_k, p.top_p, p.min_p, uniform01(p.seed, uint64_t(pos), 0));
}

// One block per row of a decode step: its token, then the decode state advances.
__global__ void __launch_bounds__(k_sample_threads)
    pick_rows_kernel(const float * logits, int vocab, int rows, const RowPick * picks, const int * history, float * work_all, int * counts_all,
                     int * tokens, int * pos, const int * step, int * len, int * out) {
    pdl_wait();
    const int r = blockIdx.x;
    const int tok = pick_row_token(logits + int64_t(r) * vocab, vocab, picks[r], history, work_all + int64_t(r) * vocab,
                                   counts_all + int64_t(r) * vocab, pos[r]);
    if (threadIdx.x != 0) return;
    tokens[r] = tok;
    out[int64_t(*step) * rows + r] = tok;
    pos[r] += 1;
    len[r] += 1;
}

// One block per row of a prefill pass's logits: row w picks by picks[slots[w]] into tokens[slots[w]] (slot -1: the
// host takes that row's logits).
__global__ void __launch_bounds__(k_sample_threads)
    pick_slots_kernel(const float * logits, int vocab, const int * slots, const RowPick * picks, const int * history, float * work_all,
                      int * counts_all, int * tokens) {
    pdl_wait();
    const int w = blockIdx.x, slot = slots[w];
    if (slot < 0) return;
    const RowPick p = picks[slot];
    const int tok = pick_row_token(logits + int64_t(w) * vocab, vocab, p, history, work_all + int64_t(w) * vocab, counts_all + int64_t(w) * vocab, p.pos);
    if (threadIdx.x == 0) tokens[slot] = tok;
}

}  // namespace

void pick_rows_advance(const float * logits, int rows, int vocab, const RowPick * picks, const int * history, float * work, int * counts,
                       int * tokens, int * pos, int * step, int * len, int * out_tokens, cudaStream_t stream) {
    if (rows == 0) return;
    launch_kernel(pick_rows_kernel, rows, k_sample_threads, 0, stream, logits, vocab, rows, picks, history, work, counts, tokens, pos, step, len,
                  out_tokens);
    launch_kernel(step_advance_kernel, 1, 1, 0, stream, step);
}

void pick_slots(const float * logits, int rows, int vocab, const int * slots, const RowPick * picks, const int * history, float * work,
                int * counts, int * tokens, cudaStream_t stream) {
    if (rows == 0) return;
    launch_kernel(pick_slots_kernel, rows, k_sample_threads, 0, stream, logits, vocab, slots, picks, history, work, counts, tokens);
}

void argmax_advance(const float * logits, int n_valid, float * scratch, int * state, int * out_tokens, cudaStream_t stream) {
    launch_kernel(argmax_partial_kernel, k_argmax_blocks, k_argmax_threads, 0, stream, logits, n_valid, scratch);
    launch_kernel(argmax_final_kernel, 1, k_argmax_blocks, 0, stream, scratch, state, out_tokens);
}

// Parts of a row in the batch argmax's first pass: four blocks an SM over the batch, at most k_argmax_row_parts.
static int argmax_row_parts(int rows) { return std::clamp((4 * sm_count() + rows - 1) / rows, 1, k_argmax_row_parts); }

size_t argmax_rows_scratch(int rows) { return size_t(std::max(rows, 1)) * k_argmax_row_parts * 2; }

void argmax_rows_advance(const float * logits, int rows, int vocab, int n_valid, float * scratch, int * tokens, int * pos, int * step,
                         int * len, int * out_tokens, cudaStream_t stream) {
    if (rows == 0) return;
    const int parts = argmax_row_parts(rows);
    launch_kernel(argmax_rows_partial_kernel, dim3(parts, rows), k_argmax_threads, 0, stream, logits, vocab, n_valid, parts, scratch);
    launch_kernel(argmax_rows_final_kernel, rows, k_argmax_row_parts, 0, stream, static_cast<const float *>(scratch), parts, rows, tokens, pos,
                  static_cast<const int *>(step), len, out_tokens);
    launch_kernel(step_advance_kernel, 1, 1, 0, stream, step);
}

void sample_rows_advance(const float * logits, int rows, int vocab, int n_valid, const SampleParams & p, uint8_t * seen, int * counts,
                         float * work, int * tokens, int * pos, int * step, int * len, int * out_tokens, cudaStream_t stream) {
    if (rows == 0) return;
    if (p.top_k < 1 || p.top_k > k_sample_max_k) QINFER_FAIL() << "sample_rows_advance: top_k " << p.top_k << " (1.." << k_sample_max_k << ")";
    if (!(p.temperature > 0)) QINFER_FAIL() << "sample_rows_advance: temperature must be > 0 (greedy: argmax_rows_advance)";
    const SampleArgs a{logits, vocab, n_valid, rows, p, seen, counts, work, tokens, pos, step, len, out_tokens};
    launch_kernel(sample_rows_kernel, rows, k_sample_threads, 0, stream, a);
    launch_kernel(step_advance_kernel, 1, 1, 0, stream, step);
}

}  // namespace qinfer::cuda
