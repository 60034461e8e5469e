// CUDA kernel launchers. Tensors are device pointers, row-major, with shapes in the comments; bf16 activations
// and weights, fp32 residual stream and logits, fp32 accumulation everywhere.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "model/decode_splits.h"

namespace qinfer::cuda {

using bf16 = __nv_bfloat16;

// ---- decode GEMV: y[m, n] = epilogue(sum_k W[n, k] * x[m, k]), m <= 4 ----
enum class GemvIn {
    Bf16,     // x: bf16 [m, k]
    NormF32,  // x: fp32 [m, k], RMS-normalised with norm_w in the prologue (RMSNorm fused into the GEMV)
};
enum class GemvOut {
    Bf16,         // y: bf16 [m, n]
    F32,          // y: fp32 [m, n] (logits)
    AddF32,       // y: fp32 [m, n] += result (residual stream)
    SiluMulBf16,  // W holds gate rows [0, n) then up rows [n, 2n); y: bf16 [m, n] = silu(gate) * up
};
struct GemvArgs {
    const bf16 * w = nullptr;       // [n, k] (SiluMulBf16: [2n, k])
    int n = 0, k = 0;
    const void * x = nullptr;       // see GemvIn
    int m = 1;
    const bf16 * norm_w = nullptr;  // [k] with NormF32
    float eps = 1e-6f;
    void * y = nullptr;             // see GemvOut
    bool vec_norm = false;          // NormF32 staged in float4 batches (set by gemv()/qgemv(): qstage::vec_norm_ok)
    bool vec_bf16 = false;          // qgemv ring: Bf16 rows staged by 16-byte copies (no act-order, k == k_padded, aligned)
    bool vec_params = false;        // qgemv ring: affine group parameters read 8 at a time (aligned scales / zeros)
    bool ring_fast = false;         // qgemv ring: unchecked rounds, normalised inputs staged for 16-byte B loads
    // qgemv ring: the SiluMulBf16 output written, or the Bf16 input read, with each 64-wide block in qstage::b_pair_order
    // (the gate/up -> down pair of a decode step: down's B fragments in two 16-byte loads; see qgemv_pair_io_ok).
    bool pair_io = false;
    int stage_stride = 0;  // qgemv ring: bf16 row stride of inputs staged in shared memory (set by its launch)
    bool beside = false;   // qgemv ring: runs beside another stream's kernels (a MoE shared expert): gate/up from one K part
    // qgemv ring: blocks from this one on are split blocks, half the row blocks in twice the K parts (set by its launch:
    // the grid's last, part-filled wave; INT_MAX: none).
    int split_block = INT_MAX;
};
void gemv(const GemvArgs & a, GemvIn in, GemvOut out, cudaStream_t stream);
// Shapes whose rows do not fill whole waves of the row kernels go to a one-wave balanced kernel (gemv_balanced.cu)
// unless this is off (default on; tests turn it off to check the row kernels on the same shapes).
void set_gemv_balanced(bool on);
// The row kernels give rows of at most 1024 values half a warp each (0.5B's lm_head) unless this is off (default on;
// tests check both).
void set_gemv_half_rows(bool on);

// Programmatic dependent launch for the kernels launched from now on (common.cuh).
void set_pdl_default(bool on);

// ---- quantized weights (layout: model/quant_repack.h) ----
struct QuantMatrix {
    const uint32_t * codes = nullptr;  // [rows, k bits / 32]: codes along k (in `perm` order), LSB first
    const uint16_t * scales = nullptr;  // affine: fp16 [rows, groups]
    const uint8_t * zeros = nullptr;    // affine: [rows, groups]; null: every zero is const_zero
    int const_zero = 0;
    const float * absmax = nullptr;     // lookup (bitsandbytes): [rows, k / 64]
    const float * table = nullptr;      // lookup: [16]
    const int * perm = nullptr;         // [k]: position i reads input channel perm[i]; null: identity
    int rows = 0, k = 0, bits = 4, group = 0, groups = 0;
    bool lut = false;
    bool tiled = false;  // 4/8-bit affine codes in the tensor-core tile layout; rows and k padded as below
    int rows_padded = 0, k_padded = 0;
};
// The GEMV above with quantized weights (a.w unused): dequantized in registers, fp32 accumulation. Any m (1..8 for
// the tiled layout). scratch: bf16 [m, w.k_padded] on the device, where the tiled kernel's normalised or gathered
// inputs are staged (qgemv_scratch_bytes); may be null for other layouts.
void qgemv(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, void * scratch, cudaStream_t stream);
size_t qgemv_scratch_bytes(int k_padded, int m);
// The blocks of qgemv's gate/up (SiluMulBf16, n outputs a matrix) for one normalised row beside another stream's
// kernels (GemvArgs::beside) in the tiled layout's ring kernel; 0 where it does not launch.
int qgemv_beside_blocks(const QuantMatrix & gate_up, int n);
// Whether a decode step's gate/up -> down pair may pass its activations in b_pair_order (GemvArgs::pair_io): both
// in the tiled layout with affine codes, down without act-order, its k unpadded and a multiple of 64.
bool qgemv_pair_io_ok(const QuantMatrix & gate_up, const QuantMatrix & down);
// The tiled layout's o_proj / down kernels (input from global memory, added to a residual) with twice the code loads in
// flight per lane where their grid holds at most two blocks per SM (qgemv_ring.cuh). By default for affine codes
// (GPTQ/AWQ/AutoRound, 4- and 8-bit), not for lookup codes (NF4/FP4). set_qgemv_ring_deep forces it (true: every kind, false: never; tests);
// reset_qgemv_ring_deep puts back the default.
void set_qgemv_ring_deep(bool on);
void reset_qgemv_ring_deep();
// The ring kernel's fast rounds (unchecked rounds, normalised inputs staged for 16-byte B loads): -1 where every K
// part holds at least one round of loads (the default), 1 wherever the kernel can take them, 0 never.
void set_qgemv_ring_fast(int mode);
// The ring GEMV's split last wave (ring_launch::split_from): -1 the rule, 1 the second half of every grid whose blocks
// hold two row blocks or more (tests).
void set_qgemv_ring_split(int mode);
// out = the dequantized weight, bf16 [rows, k] in input-channel order (prefill: then cuBLASLt).
void dequantize(const QuantMatrix & w, bf16 * out, cudaStream_t stream);
// Decode-step GEMM with the weights dequantized in registers (qgemm_mma.cu, mma.sync: sm_80 and up): y bf16 [m,
// w.rows] = x bf16 [m, w.k] W^T for the tiled 4-/8-bit affine layout, any m (made for the 9 to a few hundred rows of a
// continuous-batching step). Scratch: first the gathered inputs (act-order, k % 8, unaligned x), then the K splits'
// fp32 partial sums (qgemm_mma_scratch_bytes covers every m' <= m); with too little room K is not split. False where
// it does not apply or the inputs cannot be gathered. silu_mul: w is a stacked [gate; up] weight and y bf16 [m,
// w.rows / 2] = SiLU(x W_gate^T) * (x W_up^T), gate and up rounded to bf16 first (silu_mul's result, bit for bit);
// false where K would be split or its halves are not multiples of 16 rows.
bool qgemm_mma_applies(const QuantMatrix & w);
size_t qgemm_mma_scratch_bytes(const QuantMatrix & w, int m);
bool qgemm_mma(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t scratch_bytes, cudaStream_t stream,
               bool silu_mul = false);
// qgemm_mma's warps per block at up to 32 tokens, for tests: 6 or 8; 0 = the rule in qgemm_mma.cu.
void set_qgemm_mma_warps(int warps);
// The same on Hopper (qgemm_rs.cu, sm_90a build and device): the dequantized fragments go from registers straight
// into warpgroup MMAs over all of a block's tokens. Scratch and failure as qgemm_mma's; K is dealt out in pieces where
// the grid is under half a wave and for the tiles of a last, partial wave (their fp32 sums in the scratch). silu_mul
// as qgemm_mma's (gate and up rounded to bf16 first), false only where the halves are not multiples of 16 rows; where
// K is dealt out the sums may add in another order than quant_linear's (not its bits, the same on every call).
bool qgemm_rs_applies(const QuantMatrix & w);
size_t qgemm_rs_scratch_bytes(const QuantMatrix & w, int m);
bool qgemm_rs(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t scratch_bytes, cudaStream_t stream,
              bool silu_mul = false);
// qgemm_rs's rule as if the device had `sms` SMs (its K splits and last-wave pieces), for tests; 0 = the device's.
void set_qgemm_rs_slots(int sms);

// ---- quantized projections: the rule (qlinear.cpp) ----
constexpr int k_qgemv_max_m = 8;        // rows the tiled quantized GEMV takes in one pass
constexpr int k_qgemv_rowwise_max_m = 4;  // rows the other quantized GEMVs take (one pass per row)
// Which kernel y = x W^T of m rows (bf16 in, bf16 out) goes to, chosen per shape from measurements (qlinear.cpp says
// which): the GEMV, the register-dequantizing GEMMs (qgemm_mma; qgemm_rs on Hopper) or dequantize + cuBLASLt.
enum class QuantPath { Gemv, Mma, Rs, Dequantize };
QuantPath quant_path(const QuantMatrix & w, int m);
const char * quant_path_name(QuantPath path);
// Bytes of `scratch` quant_linear needs for any m' <= m rows (the dequantized weight where a path dequantizes).
size_t quant_linear_scratch_bytes(const QuantMatrix & w, int m);
// y bf16 [m, w.rows] = x bf16 [m, w.k] W^T by `path`: gemv_scratch as qgemv's for k_qgemv_max_m rows, scratch of
// quant_linear_scratch_bytes(w, m). False where the path does not apply to w or m or the scratch is too small for it
// (the caller then dequantizes); nothing is launched then.
bool quant_linear(QuantPath path, const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * gemv_scratch, void * scratch,
                  size_t scratch_bytes, cudaStream_t stream);
// act bf16 [m, w.rows / 2] = SiLU(x W_gate^T) * (x W_up^T) for a stacked [gate; up] weight in one launch, where
// `path` is qgemm_mma and its SwiGLU tiles fit w (equal to quant_linear then silu_mul, bit for bit), or qgemm_rs at up
// to 64 rows (the same but for the order of K pieces' sums). False, with nothing launched, elsewhere: the caller then
// runs quant_linear and silu_mul.
bool quant_linear_silu(QuantPath path, const QuantMatrix & w, const bf16 * x, int m, bf16 * act, void * scratch, size_t scratch_bytes,
                       cudaStream_t stream);

// ---- elementwise ----
// x[t] = float(table[ids[t]]): table bf16 [vocab, hidden]; ids int [n] on the device; x fp32 [n, hidden]
void embedding(const bf16 * table, const int * ids, int n, int hidden, float * x, cudaStream_t stream);
// y = RMSNorm(x) * w: x fp32 [n, hidden]; w bf16 [hidden]; y bf16 [n, hidden]
void rms_norm(const float * x, const bf16 * w, float eps, int n, int hidden, bf16 * y, cudaStream_t stream);
// x += delta; y = RMSNorm(x) * w: x fp32 [n, hidden]; delta bf16 [n, hidden]; y bf16 [n, hidden]
void add_rms_norm(float * x, const bf16 * delta, const bf16 * w, float eps, int n, int hidden, bf16 * y, cudaStream_t stream);
// x += delta: x fp32 [n, hidden]; delta bf16 [n, hidden]
void add_residual(float * x, const bf16 * delta, int64_t count, cudaStream_t stream);
// out = silu(gate_up[:, :inter]) * gate_up[:, inter:]: gate_up bf16 [n, 2 inter]; out bf16 [n, inter]
void silu_mul(const bf16 * gate_up, int n, int inter, bf16 * out, cudaStream_t stream);
// out[i] = in[rows[i]]: in bf16 [*, hidden]; out bf16 [m, hidden]; rows int [m]
void gather_rows(const bf16 * in, const int * rows, int m, int hidden, bf16 * out, cudaStream_t stream);

// ---- paged KV cache ----
// Cache of one layer: bf16 [n_blocks, n_kv_head, block_size, head_dim]; a sequence's token t lives in block
// block_table[t / block_size], slot t % block_size. A batch keeps its sequences' tables in one array, sequence b's
// at block_table + b * table_stride.
//
// Quantized caches (runtime/kv_cache.h is the specification; FORMATS.md section 7) keep codes instead, in the same
// [n_blocks, n_kv_head, block_size] order with head_dim codes per row: fp8 e4m3 (x = e4m3 * layer scale), int8
// (x = (q - zero) * scale per row), int4 (byte j: element j in the low nibble, j + head_dim / 2 in the high one).
enum class KVKind { BF16, FP8, INT8, INT4 };
struct KVQuant {
    KVKind kind = KVKind::BF16;
    uint8_t * k = nullptr, * v = nullptr;         // codes [n_blocks, n_kv_head, block_size, head_dim (int4: / 2)]
    float2 * k_sz = nullptr, * v_sz = nullptr;    // int8/int4: (scale, zero) [n_blocks, n_kv_head, block_size]
    float * fp8_scale = nullptr;                  // fp8: {K scale, V scale} of the layer
};
struct KVLayer {
    bf16 * k = nullptr;  // bf16 cache (kind BF16)
    bf16 * v = nullptr;
    const int * block_table = nullptr;
    int block_size = 16;
    int table_stride = 0;
    KVQuant quant;
    int64_t rows = 0;  // rows of this layer's k/v arrays (n_blocks * n_kv * block_size; 0: unknown, no tensor maps)
};

// The new tokens' q/k/v after the QKV projection: add biases, per-head RMSNorm of q and k (Qwen3), rotate-half RoPE,
// write K and V into the cache, q to `q_out`. Position of token t: pos0 + t, pos0 = *pos0_dev when given.
struct QkvRopeArgs {
    const bf16 * qkv = nullptr;   // [n, (n_head + 2 n_kv) * d]
    const bf16 * bias = nullptr;  // [(n_head + 2 n_kv) * d] or null
    const bf16 * q_norm = nullptr, * k_norm = nullptr;  // [d] or null
    float eps = 1e-6f;
    const float * inv_freq = nullptr;  // [d / 2] on the device
    float attention_scaling = 1.0f;
    int n = 0, n_head = 0, n_kv = 0, head_dim = 0;
    int pos0 = 0;
    const int * pos0_dev = nullptr;
    // Decode of a batch: token t is sequence t of the batch, at position pos_dev[t] (device int [n]); overrides pos0.
    const int * pos_dev = nullptr;
    // With pos_dev, tokens of several prompts packed in one pass: token t reads row row_seq[t] (device int [n]) of the
    // block tables instead of row t.
    const int * row_seq = nullptr;
    KVLayer cache;
    // fp8 cache, first write of a layer: instead of writing, fold max |K| and max |V| of these tokens into
    // fp8_amax (device float [2], zeroed by the caller); fp8_scales_from_amax then sets the layer's scales.
    float * fp8_amax = nullptr;
    bf16 * q_out = nullptr;  // [n, n_head, d]
};
void qkv_rope_cache(const QkvRopeArgs & a, cudaStream_t stream);
// scale[i] = amax[i] / 448 (1 where amax is 0), i = 0 (K), 1 (V): the fp8 rule of the CPU cache. A scale already
// set (> 0, from the checkpoint) is kept.
void fp8_scales_from_amax(const float * amax, float * scale, cudaStream_t stream);

// Causal prefill attention (FlashAttention-2 style on tensor cores): n queries at positions pos0..pos0+n-1 over
// cached keys 0..pos0+n-1. q bf16 [n, n_head, d]; out bf16 [n, n_head, d]. d in {16, 24, 32, 64, 128}. Quantized caches
// are dequantized (to bf16) as their tiles are loaded.
// Three implementations: 64 queries per block with each K/V tile loaded then used (any head_dim above); 128 queries
// per block with the next tile in flight through cp.async while the current one is used (head_dim 64 and 128;
// attention_prefill_pipelined.cu); the same pipeline feeding Hopper's warpgroup MMAs (head_dim 64 and 128, sm_90a
// builds on compute capability 9.0; attention_prefill_wgmma.cu); and for bf16 caches with known rows and block sizes
// that divide 128 (multiples of 8), the warp-specialised form: a producer warp moves K/V pages with the tensor copy
// engine into a three-stage ring guarded by mbarriers, two consumer warpgroups run the wgmma loop without block barriers
// (attention_prefill_tma.cu; Tma where it does not apply runs Wgmma); TmaPingpong: the same with the consumer
// warpgroups taking turns to issue their MMAs. Auto: TmaPingpong where it applies (sm_90a, head_dim 64 / 128), else
// Wgmma; Pipelined off Hopper; Tiled for other head dims. Tests pass each kind as `kernel`.
enum class PrefillKernel { Auto, Tiled, Pipelined, Wgmma, Tma, TmaPingpong };
const char * prefill_kernel_name(PrefillKernel kernel);
// Prefill over a quantized cache through the bf16 kernels (kv_dequant.cu): the sequence's first n_blocks blocks
// (cache.block_table's row) dequantized as the quantized kernels read them (kv_quant.cuh, rounded to bf16) into
// k_out / v_out, bf16 [n_blocks, n_kv, block_size, head_dim] in table order (read them with an identity table).
// head_dim a multiple of 16.
void kv_dequantize_blocks(const KVLayer & cache, int n_blocks, int n_kv, int head_dim, bf16 * k_out, bf16 * v_out, cudaStream_t stream);
// Whether the warpgroup-MMA kernels run here for this head_dim.
bool prefill_wgmma_available(int head_dim);
void attention_prefill(const bf16 * q, const KVLayer & cache, int n, int pos0, int n_head, int n_kv, int head_dim, bf16 * out,
                       cudaStream_t stream, PrefillKernel kernel = PrefillKernel::Auto);
// One sequence's chunk for attention_prefill_pieces: n queries at positions pos0.. over the keys its own block table
// names. q, out as for attention_prefill.
struct PrefillPiece {
    const bf16 * q = nullptr;
    bf16 * out = nullptr;
    const int * block_table = nullptr;
    int n = 0, pos0 = 0;
};
constexpr int k_prefill_pieces = 32;  // pieces one launch takes
// attention_prefill for the chunks of several sequences in one cache layer (cache.block_table is not read: each
// piece names its own). Where the warp-specialised kernel applies (sm_90a, bf16 cache, head_dim 64 / 128) up to
// k_prefill_pieces pieces share one launch, grid (heads, query tiles of the longest, pieces): a chunk of a few dozen
// tokens is one block a head, so alone it had 28 of an H200's 132 SMs at work for 50 us a layer over 2024 cached keys
// (7B), and a step's chunks ran one after another. Elsewhere one attention_prefill a piece.
// split: with one piece, its scratch for key splits of the launch's last-wave query tiles (model/prefill_splits.h;
// attention_prefill_tma.cu): `size` >= prefill_split_scratch_bytes(head_dim, sm_count()) bytes, zero before first
// use (the counters at its end put themselves back to zero); splits 0: prefill_split_plan's rule, 1: none, more: every
// query tile in that many (tests).
struct PrefillSplitScratch {
    void * bytes = nullptr;
    size_t size = 0;
    int splits = 0;
};
void attention_prefill_pieces(const PrefillPiece * pieces, int count, const KVLayer & cache, int n_head, int n_kv, int head_dim, cudaStream_t stream,
                              const PrefillSplitScratch * split = nullptr);

// Decode attention for one token of each of `batch` sequences (flash-decoding): the keys of each KV head are spread
// over max_splits blocks (at most k_decode_max_split_keys keys each, model/decode_splits.h), then combined. The grid
// is fixed (graph capture) and the context lengths are read from len_dev (int [batch] on the device), so one
// captured graph serves every step.
// q bf16 [batch, n_head, d]; out bf16 [batch, n_head, d]; sequence b's block table at cache.block_table +
// b * cache.table_stride. Quantized caches are dequantized in registers (fp32); d in {16, 32, 64, 128} for them.
struct DecodeScratch {
    float * partial_out = nullptr;  // [batch, n_head, max_splits, d]
    float * partial_ml = nullptr;   // [batch, n_head, max_splits, 2]
    int max_splits = 0;
};
// Splits for contexts up to max_len: whole waves of the blocks this GPU holds at this head_dim, no split above the
// maximum (model/decode_splits.h).
int decode_splits(int max_len, int n_kv, int head_dim, int batch = 1);
// Two implementations: SIMT lanes with an online softmax per lane group (any head_dim above), and tensor cores with
// the GQA group as the rows of an mma tile (head_dim 64 and 128; attention_decode_tc.cu). Auto: the tensor-core
// kernel where it applies (2-2.4x faster on an H100, perf-log). TensorCoreTma: the tensor-core kernel with its K/V
// tiles brought by the tensor copy engine, where decode_tma_applies (the default there).
enum class DecodeKernel { Auto, Simt, TensorCore, TensorCoreTma };
// Whether the tensor-copy decode kernel takes this cache and GQA group: a bf16 cache (head_dim 64 or 128, up to 16
// query heads a KV head) or an int8 or fp8 one (head_dim 128, up to 8) with its rows known (KVLayer::rows), block size
// a multiple of 16, on an sm_90a build running on a compute capability 9.0 device. The SIMT kernel takes up to 8 query
// heads a KV head, the tensor-core ones up to 16.
bool decode_tma_applies(const KVLayer & cache, int head_dim, int n_rep = 1);
// The tensor-core kernel requests the block table and its first tiles of keys before the new key's (the ones written
// by earlier steps) ahead of pdl_wait, so they overlap the end of the kernel ahead under programmatic dependent launch
// (attention_decode_tc.cu). On by default; tests turn it off to check both orders; reset_decode_early_kv puts it
// back on.
void set_decode_early_kv(bool on);
void reset_decode_early_kv();
// short_context: every sequence of this launch (and of the graph it is captured into) stays within
// k_short_decode_keys keys, which lets the combine start early under PDL (launch_combine, attention.cu).
constexpr int k_short_decode_keys = 4096;
void attention_decode(const bf16 * q, const KVLayer & cache, const int * len_dev, int n_head, int n_kv, int head_dim,
                      const DecodeScratch & scratch, bf16 * out, cudaStream_t stream, int batch = 1,
                      DecodeKernel kernel = DecodeKernel::Auto, bool short_context = false);

// ---- sampling on the device ----
// Greedy step: token = argmax(logits[0:n_valid]) (lowest id on ties); state[0] = token, out_tokens[state[2]] = token,
// then state[1] (position), state[2] (step) and state[3] (context length) advance by one.
// scratch: fp32 [k_argmax_scratch] on the device.
constexpr int k_argmax_scratch = 256;
void argmax_advance(const float * logits, int n_valid, float * scratch, int * state, int * out_tokens, cudaStream_t stream);
// Greedy step of a batch of `rows` sequences: tokens[r] = argmax(logits[r, 0:n_valid]) (lowest id on ties),
// out_tokens[*step * rows + r] = tokens[r], pos[r] and len[r] advance by one, then *step. logits fp32 [rows, vocab];
// scratch fp32 [argmax_rows_scratch(rows)] on the device (each row's parts' pairs).
constexpr int k_argmax_row_parts = 64;
size_t argmax_rows_scratch(int rows);
void argmax_rows_advance(const float * logits, int rows, int vocab, int n_valid, float * scratch, int * tokens, int * pos, int * step,
                         int * len, int * out_tokens, cudaStream_t stream);
// Sampling step of a batch with the host Sampler's rules (runtime/sampler.h) for top_k in 1..k_sample_max_k and
// temperature > 0: repetition penalty over the ids marked in `seen`, presence/frequency penalties from `counts`,
// temperature, top-k, top-p, min-p, then a draw with the device's own random numbers (a hash of the seed, the token's
// position and the row: a sequence's draws do not depend on how its steps are chunked; they differ from the host
// Sampler's for the same seed). The chosen token is marked in seen/counts; the state advances as argmax_rows_advance.
// seen uint8 [rows, vocab], counts int [rows, vocab], work fp32 [rows, vocab] on the device.
constexpr int k_sample_max_k = 64;
struct SampleParams {
    float temperature = 1, top_p = 1, min_p = 0, repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
    int top_k = 0;
    uint64_t seed = 0;
};
void sample_rows_advance(const float * logits, int rows, int vocab, int n_valid, const SampleParams & p, uint8_t * seen, int * counts,
                         float * work, int * tokens, int * pos, int * step, int * len, int * out_tokens, cudaStream_t stream);
// Continuous batching: each row picks its token by its own settings (device RowPick [rows]): the repetition penalty over
// its history (history[hist_off ..], n_prompt prompt ids then n_output generated ones) and presence / frequency
// penalties over the generated ids, then at temperature 0 the argmax over its n_valid ids, else top_k in
// 1..k_sample_max_k with top-p and min-p, as sample_rows_advance. A row's draws hash its seed and position only, so
// they do not depend on the row it sits in. work: fp32 [rows, vocab] scratch; counts: int [rows, vocab], zero before
// and after. Advances the decode state as argmax_rows_advance.
struct RowPick {
    int n_valid = 0;
    int top_k = 0;
    float temperature = 0, top_p = 1, min_p = 0;
    float repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
    int hist_off = 0, n_prompt = 0, n_output = 0;
    int pos = 0;  // pick_slots only: the position of the row's last token (its draw hashes it; the decode state has pos)
    uint64_t seed = 0;
};
void pick_rows_advance(const float * logits, int rows, int vocab, const RowPick * picks, const int * history, float * work, int * counts,
                       int * tokens, int * pos, int * step, int * len, int * out_tokens, cudaStream_t stream);
// The same rules for the rows of a prefill pass (prompt ends, and decode rows that ride in the pass): logits fp32
// [rows, vocab]; row w picks by picks[slots[w]] into tokens[slots[w]], or is left to the host where slots[w] is -1.
// work / counts as above ([rows, vocab]); no decode state moves.
void pick_slots(const float * logits, int rows, int vocab, const int * slots, const RowPick * picks, const int * history, float * work,
                int * counts, int * tokens, cudaStream_t stream);

// ---- mixture of experts (moe.cu) ----
// A MoE layer of c tokens on the device: route (softmax over the router logits in fp32, top-k, optional
// renormalisation), group the c * top_k token-expert assignments by expert, run every routed expert's SwiGLU MLP on
// its rows with two grouped GEMMs (one launch each; grids sized for the worst case, so graphs can capture them), and
// add the weighted outputs (and the sigmoid-gated shared expert) into the residual stream.
constexpr int k_moe_max_experts = 256;
constexpr int k_moe_max_topk = 8;
struct MoeRouting {
    int * ids = nullptr;       // int [c, top_k]: the chosen experts, largest probability first (ties: lower id)
    float * weights = nullptr;  // fp32 [c, top_k]: their probabilities (renormalised: over the chosen ones)
    int * offsets = nullptr;   // int [E + 1]: expert e's rows are rows offsets[e] .. offsets[e + 1] - 1 of the sorted order
    int * tiles = nullptr;     // int [E + 1]: expert e's first row tile (tile_rows rows per tile, moe_tile_rows)
    int * token_of = nullptr;  // int [c * top_k]: sorted row -> its token (an expert's rows in token order)
    int * slot_of = nullptr;   // int [c * top_k]: assignment t * top_k + j -> its sorted row
};
// The routing's buffers for up to max_tokens tokens, carved from one device int array of moe_routing_ints() ints and
// a float array of max_tokens * top_k weights.
size_t moe_routing_ints(int max_tokens, int top_k, int n_experts);
MoeRouting moe_routing_in(int * ints, float * weights, int max_tokens, int top_k, int n_experts);
// The grouped GEMMs' row tile for c tokens: k_moe_wgmma_rows (the wgmma kernel, moe_wgmma.h; sm_90a devices only)
// where experts get 32 rows or more on average, 64 where they get 16 or more, else 16.
constexpr int k_moe_wgmma_rows = 128;
int moe_tile_rows(int tokens, int top_k, int n_experts);
// The most row tiles `assignments` sorted rows can take in tiles of tile_rows (every expert may end in a part tile):
// the grids of the launches over tiles, sized for the worst case so that graphs can capture them.
int moe_max_tiles(int assignments, int tile_rows, int n_experts);
// logits fp32 [c, stride] (the first n_experts of each row; n_experts <= k_moe_max_experts, top_k <= k_moe_max_topk) -> r.
void moe_route(const float * logits, int stride, int c, int n_experts, int top_k, bool renormalise, int tile_rows, const MoeRouting & r,
               cudaStream_t stream);
// y fp32 [c, R] = x bf16 [c, H] W bf16 [R, H]^T: the router's logits for steps of more tokens than the GEMVs take
// (moe_router.cu), where moe_router_pays (measured against cuBLASLt) and moe_router_applies (H a multiple of 8,
// 16-byte aligned rows).
bool moe_router_pays(int c, int R);
bool moe_router_applies(const bf16 * x, int H, const bf16 * w);
void moe_router_logits(const bf16 * x, int c, int H, const bf16 * w, int R, float * y, cudaStream_t stream);
struct MoeExperts {
    const bf16 * gate_up = nullptr;  // [n_experts, 2 inter, hidden]: each expert's gate rows, then its up rows
    const bf16 * down = nullptr;     // [n_experts, hidden, inter]
    int n_experts = 0, hidden = 0, inter = 0;  // hidden and inter multiples of 8
};
// Up to this many tokens (decode steps) the bf16 experts run as GEMVs (moe_decode); moe_experts runs grouped
// tensor-core GEMMs in tiles of tile_rows rows (k_moe_wgmma_rows: the inputs gathered into `out` first).
constexpr int k_moe_gemv_max_tokens = 4;
// act bf16 [c top_k, inter] = silu(gate) * up of each sorted row's token xn bf16 [c, hidden] through its expert;
// out bf16 [c top_k, hidden] = act W_down^T, in the sorted order; c > k_moe_gemv_max_tokens.
void moe_experts(const bf16 * xn, int c, int top_k, const MoeExperts & w, const MoeRouting & r, int tile_rows, bf16 * act, bf16 * out,
                 cudaStream_t stream);
// x fp32 [c, hidden] += sum_j weights[t, j] out[slot_of[t top_k + j]] (+ sigmoid(shared_gate[t gate_stride]) shared[t]
// where shared, bf16 [c, hidden], is given); accumulate false: x = that sum alone (a tensor-parallel rank's partial).
// slot_of null: out in assignment order (moe_decode).
void moe_combine(float * x, bool accumulate, int c, int hidden, int top_k, const MoeRouting & r, const bf16 * out, const bf16 * shared, const float * shared_gate,
                 int gate_stride, cudaStream_t stream);
// A decode step's MoE input normalised by the experts' own gate/up launches instead of a separate RMSNorm kernel:
// each block stages xn = bf16(norm_w * (x * rsqrt(mean(x^2) + eps))) of its token's row of x fp32 [c, hidden] (as
// rms_norm rounds it). x null: the launches read xn as given.
struct MoeNormIn {
    const float * x = nullptr;
    const bf16 * norm_w = nullptr;
    float eps = 0;
};
// The routed experts of a decode step of up to k_moe_gemv_max_tokens tokens with bf16 experts (moe_decode.cu), in
// assignment order (row t top_k + j: token t's j-th expert), with no grouping: launch 1 routes each token in the
// blocks that need it (the first writes ids and weights [c, top_k]) and writes act bf16 [c top_k, inter] =
// silu(gate) * up; launch 2 writes out bf16 [c top_k, hidden] = act W_down^T and, where `x` is given, the last block
// of each token's feature tile adds x fp32 [c, hidden] (+)= sum_j weights[t, j] out[t top_k + j] in moe_combine's
// order (accumulate false: the sum alone). Models with a shared expert leave x null and combine with moe_combine
// (slot_of null: assignment order) once their shared expert is done.
struct MoeDecode {
    float * logits = nullptr;  // fp32 [c, stride]: the router's n_experts columns first (written where router_w is set)
    int stride = 0;
    int top_k = 0;
    bool renormalise = false;
    MoeExperts experts;
    int * ids = nullptr;        // [c, top_k], written
    float * weights = nullptr;  // [c, top_k], written
    int * arrivals = nullptr;   // [moe_decode_arrivals(c, hidden)] zeros, left zero: the combine's per-tile counters
    MoeNormIn norm;             // norm.x set: xn is RMSNorm(norm.x), computed by the gate/up blocks (xn unused)
    // One token (c == 1) with router_w set: the router's logits are computed by the gate/up launch itself, no router
    // kernel ahead: router_w bf16 [router_rows, hidden] (the experts' rows first, then any other, such as a shared
    // expert's gate), all router_rows logits written into logits; router_count one int, zero between launches (the
    // down launch puts it back).
    const bf16 * router_w = nullptr;
    int router_rows = 0;
    int * router_count = nullptr;
    // One token: the routing handed to the down launch's blocks before they wait for the gate/up launch to end (two
    // ints, zero between launches: moe_route.cuh's publish_ids / take_id). Null: they read it after.
    int * ids_ready = nullptr;
};
bool moe_decode_applies(int n_experts, int top_k, int hidden, int inter);
size_t moe_decode_arrivals(int c, int hidden);
// Whether moe_decode can compute the router's logits in its gate/up launch (MoeDecode::router_w).
bool moe_decode_router_applies(int c, int router_rows, int n_experts, int hidden);
void moe_decode(const bf16 * xn, int c, const MoeDecode & m, bf16 * act, bf16 * out, float * x, bool accumulate, cudaStream_t stream);
// Quantized routed experts (moe_quant.cu): every expert's 4- or 8-bit affine codes stacked in the tile layout of
// model/quant_repack.h, gate_up rows [n_experts, gate inter | up inter] over hidden, down rows [n_experts, hidden]
// over inter; no act-order. One launch per projection reads each chosen expert's codes once per k_moe_qtile_rows of
// its sorted rows (the routing built with tile_rows = k_moe_qtile_rows): for steps where experts get few rows
// (decode and small batches); prefill runs the experts one by one (CudaQwenEngine::moe).
constexpr int k_moe_qtile_rows = 8;
struct MoeQuantExperts {
    QuantMatrix gate_up, down;
    int n_experts = 0, hidden = 0, inter = 0;  // hidden and inter multiples of 16
};
bool moe_qexperts_apply(const MoeQuantExperts & w);
// act bf16 [c top_k, inter] and out bf16 [c top_k, hidden] in the sorted order, as moe_experts.
// norm.x set: xn is RMSNorm(norm.x) (MoeNormIn), staged by the gate/up blocks (xn unused).
void moe_qexperts(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out,
                  cudaStream_t stream, const MoeNormIn & norm = {});
// Whether moe_qexperts_routed pays for these experts: where its gate/up grid is one wave.
bool moe_qexperts_route_in_launch(const MoeQuantExperts & w, int top_k);
// Tests: every launch of moe_qexperts / moe_qexperts_routed splits K into `ks` parts (1, 2, 4 or 8, at most what K
// allows); 0 puts back the rule (the fewest waves of resident blocks, then the most parts).
void set_moe_qexperts_parts(int ks);
// One token (a batch-1 decode step) routed inside the gate/up launch from the router's logits fp32 [n_experts...]
// (ids and weights [top_k] written), then act and out in assignment order (moe_combine with slot_of null).
// ids_ready: as MoeDecode::ids_ready. beside_blocks: the blocks of a launch on another stream meanwhile (a shared
// expert's gate/up, qgemv_beside_blocks), which the gate/up launch's K split leaves room for where it can.
void moe_qexperts_routed(const bf16 * xn, const float * logits, int top_k, bool renormalise, const MoeQuantExperts & w, int * ids,
                         float * weights, bf16 * act, bf16 * out, cudaStream_t stream, const MoeNormIn & norm = {}, int * ids_ready = nullptr,
                         int beside_blocks = 0);
// The routed experts of steps with many rows per expert (prefill) on Hopper (qgemm_rs.cu's grouped mode), the routing
// built with tile_rows = k_moe_qgemm_rows: the sorted rows' inputs gathered into `out`, then one launch over every
// expert's row tiles for gate_up with SwiGLU into act bf16 [c top_k, inter] and one for down into out bf16 [c top_k,
// hidden] (sorted order), the codes dequantized in registers into warpgroup MMAs as in qgemm_rs. Where
// moe_qgemm_apply (sm_90a).
constexpr int k_moe_qgemm_rows = 128;
bool moe_qgemm_apply(const MoeQuantExperts & w);
void moe_qgemm(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out, cudaStream_t stream);

// ---- prefill GEMM (cuBLASLt) ----
// y[m, n] = x[m, k] W[n, k]^T; x, W bf16; y bf16 or fp32.
void gemm(const bf16 * x, const bf16 * w, int m, int n, int k, void * y, bool y_f32, cudaStream_t stream);
// The cuBLASLt workspace of `stream` on this device, allocated now (gemm() allocates it at a stream's first GEMM, which
// must not fall inside a graph capture).
void gemm_reserve(cudaStream_t stream);
// Frees the workspace of a stream about to be destroyed (its handle may come back for another stream).
void gemm_release(cudaStream_t stream);

// ---- read-bandwidth probes (bandwidth_probe.cu; `qinfer bench --bandwidth`) ----
// One kernel streaming a region: `blocks` blocks of 16-byte loads, `unroll` in flight a thread; or (copies, sm_90a)
// `splits` x `heads` blocks, each bringing `chunk`-byte bulk copies, `per_stage` a stage, through `stages` stages of
// shared memory, block (split, head) reading chunk `head` of each page of `heads` chunks in its split's pages.
struct BandwidthProbe {
    bool copies = false;
    int blocks = 0, unroll = 8;
    int splits = 0, heads = 1, chunk = 2048, per_stage = 8, stages = 6;
};
// The bytes a probe reads of a region of region_bytes (its blocks' equal shares, rounded down).
int64_t probe_bytes(const BandwidthProbe & pr, int64_t region_bytes);
size_t probe_smem_bytes(const BandwidthProbe & pr);
int probe_grid(const BandwidthProbe & pr);  // blocks launched; out needs that many words
bool probe_runs_here(const BandwidthProbe & pr);
// Reads probe_bytes(pr, region_bytes) from region; out[block] = the XOR of the 32-bit words the block read.
void bandwidth_probe(const BandwidthProbe & pr, const void * region, int64_t region_bytes, uint32_t * out, cudaStream_t stream);

int sm_count();
// An sm_90a build (QINFER_SM90A) on a compute capability 9.0 device: where the wgmma and tensor-copy kernels run.
bool sm90a_device();
// Keeps the stream busy for about `microseconds` (profiling: the host queues a whole step behind it, so event
// timings measure the GPU, not the launch rate).
void gpu_sleep(int microseconds, cudaStream_t stream);

}  // namespace qinfer::cuda
