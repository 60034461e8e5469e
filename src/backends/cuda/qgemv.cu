// Decode GEMV with quantized weights (4-bit and 8-bit affine: GPTQ/AWQ/AutoRound; 4-bit lookup: bitsandbytes).
// Each lane reads 16 bytes of codes per row and step (32 4-bit or 16 8-bit values), and a warp works on four weight
// rows at once, so each staged input value is read from shared memory once per four rows.
//
// Integer codes become floats without conversion instructions: OR-ing a code field into the mantissa of 2^23 gives
// 2^23 + code * 2^shift exactly; subtracting 2^23 leaves code * 2^shift. The 2^shift of each field position is folded
// into the staged input (x * 2^-shift), so sum(code * x) comes out exact per term. The zero point is applied per
// 16-byte chunk: s * (sum(q x) - z sum(x)), with sum(x) per chunk computed once per block.
#include <algorithm>
#include <atomic>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/qgemv_ring_launch.cuh"
#include "backends/cuda/qstage.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_warps = 8;
constexpr int k_threads = k_warps * 32;
constexpr int k_rows_per_warp = 4;

constexpr uint32_t k_magic = 0x4B000000u;  // 2^23 as fp32
__device__ __forceinline__ float field(uint32_t w, uint32_t mask) { return __uint_as_float((w & mask) | k_magic) - 8388608.0f; }

// Position p of a word's fields -> the power of two its float carries (the staged input is multiplied by the inverse).
template <int BITS> __host__ __device__ constexpr float position_scale(int p) {
    if (BITS == 4) return p < 5 ? 1.0f / float(1 << (4 * p)) : 1.0f / float(1 << (4 * (p - 5)));
    return p % 2 == 0 ? 1.0f : 1.0f / 256.0f;
}

// sum over the word's fields of code * x; x holds the word's staged (position-scaled) inputs.
template <int BITS> __device__ __forceinline__ float dot_word(uint32_t w, const float * x) {
    float s;
    if constexpr (BITS == 4) {
        s = field(w, 0xFu) * x[0];
        s = fmaf(field(w, 0xF0u), x[1], s);
        s = fmaf(field(w, 0xF00u), x[2], s);
        s = fmaf(field(w, 0xF000u), x[3], s);
        s = fmaf(field(w, 0xF0000u), x[4], s);
        const uint32_t h = w >> 20;
        s = fmaf(field(h, 0xFu), x[5], s);
        s = fmaf(field(h, 0xF0u), x[6], s);
        s = fmaf(field(h, 0xF00u), x[7], s);
    } else {
        s = field(w, 0xFFu) * x[0];
        s = fmaf(field(w, 0xFF00u), x[1], s);
        const uint32_t h = w >> 16;
        s = fmaf(field(h, 0xFFu), x[2], s);
        s = fmaf(field(h, 0xFF00u), x[3], s);
    }
    return s;
}

// Lookup codes: byte j holds positions 2j (low nibble) and 2j + 1; pairs[b] = (table[b & 15], table[b >> 4]).
__device__ __forceinline__ float dot_word_lut(uint32_t w, const float * x, const float2 * pairs) {
    float s = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 p = pairs[(w >> (8 * j)) & 0xFFu];
        s = fmaf(p.x, x[2 * j], s);
        s = fmaf(p.y, x[2 * j + 1], s);
    }
    return s;
}

// KS warps share each group of rows (splitting k); a block holds k_warps / KS row groups.
template <int BITS, bool LUT, GemvIn IN, GemvOut OUT, int KS> __global__ void __launch_bounds__(k_threads)
    qgemv_kernel(QuantMatrix w, GemvArgs a, int m_row) {
    pdl_wait();
    constexpr int CV = 128 / BITS;       // values per 16-byte chunk
    constexpr int PER_WORD = 32 / BITS;  // values per 32-bit word
    constexpr int MATS = OUT == GemvOut::SiluMulBf16 ? 2 : 1;
    constexpr int OPW = k_rows_per_warp / MATS;  // outputs per warp
    constexpr int GPB = k_warps / KS;            // row groups per block
    extern __shared__ float4 smem4[];
    const int K = a.k, chunks = K / CV;
    float * xs = reinterpret_cast<float *>(smem4);  // fp32 [K]: staged input, in perm order, position-scaled
    float * csum = xs + K;                          // fp32 [chunks]: unscaled sum of each chunk's inputs
    float2 * pairs = reinterpret_cast<float2 *>(csum + ((chunks + 1) & ~1));  // [256] (lookup)
    __shared__ float red[k_warps][k_rows_per_warp];
    __shared__ float norm_red[k_warps];

    // Stage the input row m_row (RMSNorm or bf16, act-order gather) in one pass: each value position-scaled, and
    // each chunk's plain sum reduced across the lanes that hold it (a warp holds 32 consecutive positions).
    if constexpr (LUT) {
        for (int i = threadIdx.x; i < 256; i += k_threads) pairs[i] = make_float2(w.table[i & 15], w.table[i >> 4]);
    }
    qstage::for_each_input<IN>(a, w.perm, m_row, K, K, norm_red, [&](int i, float v) {
        if constexpr (!LUT) {
            float cs = v;
#pragma unroll
            for (int o = CV / 2; o > 0; o >>= 1) cs += __shfl_xor_sync(0xffffffffu, cs, o);
            if (i % CV == 0 && i < K) csum[i / CV] = cs;
            v *= position_scale<BITS>(i % PER_WORD);
        }
        if (i < K) xs[i] = v;
    });
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % KS, slot = warp / KS;
    const int words_per_row = K / PER_WORD;
    const int n_groups = (a.n + OPW - 1) / OPW;
    for (int g0 = blockIdx.x * GPB; g0 < n_groups; g0 += gridDim.x * GPB) {
        const int grp = g0 + slot;
        float acc[k_rows_per_warp] = {};
        int row[k_rows_per_warp];
        bool valid[k_rows_per_warp];
#pragma unroll
        for (int r = 0; r < k_rows_per_warp; r++) {
            const int o = grp * OPW + r % OPW;
            valid[r] = grp < n_groups && o < a.n;
            row[r] = valid[r] ? (r / OPW) * a.n + o : 0;
        }
        if (grp < n_groups) {
            for (int c = part * 32 + lane; c < chunks; c += KS * 32) {
                uint4 wv[k_rows_per_warp];
                float scale[k_rows_per_warp], zero[k_rows_per_warp];
#pragma unroll
                for (int r = 0; r < k_rows_per_warp; r++) {
                    wv[r] = valid[r] ? load_stream(reinterpret_cast<const uint4 *>(w.codes + int64_t(row[r]) * words_per_row) + c)
                                     : make_uint4(0, 0, 0, 0);
                    if constexpr (LUT) {
                        scale[r] = valid[r] ? w.absmax[int64_t(row[r]) * (K / 64) + c * CV / 64] : 0.0f;
                        zero[r] = 0;
                    } else {
                        const int64_t gi = int64_t(row[r]) * w.groups + (c * CV) / w.group;
                        scale[r] = valid[r] ? __half2float(__ushort_as_half(w.scales[gi])) : 0.0f;
                        zero[r] = w.zeros ? (valid[r] ? float(w.zeros[gi]) : 0.0f) : float(w.const_zero);
                    }
                }
                float x[CV];
#pragma unroll
                for (int i = 0; i < CV / 4; i++) reinterpret_cast<float4 *>(x)[i] = reinterpret_cast<const float4 *>(xs + c * CV)[i];
                const float cs = LUT ? 0.0f : csum[c];
#pragma unroll
                for (int r = 0; r < k_rows_per_warp; r++) {
                    const uint32_t * words = reinterpret_cast<const uint32_t *>(&wv[r]);
                    float d = 0;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        if constexpr (LUT) {
                            d += dot_word_lut(words[q], x + q * PER_WORD, pairs);
                        } else {
                            d += dot_word<BITS>(words[q], x + q * PER_WORD);
                        }
                    }
                    acc[r] = LUT ? fmaf(scale[r], d, acc[r]) : fmaf(scale[r], d - zero[r] * cs, acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < k_rows_per_warp; r++) acc[r] = warp_sum(acc[r]);
        if constexpr (KS > 1) {
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < k_rows_per_warp; r++) red[warp][r] = acc[r];
            }
            __syncthreads();
            if (part == 0) {
#pragma unroll
                for (int r = 0; r < k_rows_per_warp; r++) {
                    float t = 0;
                    for (int p = 0; p < KS; p++) t += red[warp + p][r];
                    acc[r] = t;
                }
            }
            __syncthreads();
        }
        if (part == 0 && grp < n_groups) {
#pragma unroll
            for (int i = 0; i < OPW; i++) {
                const int o = grp * OPW + i;
                if (lane != i || o >= a.n) continue;
                const int64_t dst = int64_t(m_row) * a.n + o;
                if constexpr (OUT == GemvOut::Bf16) {
                    static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(acc[i]);
                } else if constexpr (OUT == GemvOut::F32) {
                    static_cast<float *>(a.y)[dst] = acc[i];
                } else if constexpr (OUT == GemvOut::AddF32) {
                    static_cast<float *>(a.y)[dst] += acc[i];
                } else {
                    const float g = __bfloat162float(__float2bfloat16(acc[i])), u = __bfloat162float(__float2bfloat16(acc[OPW + i]));
                    static_cast<bf16 *>(a.y)[dst] = __float2bfloat16(silu(g) * u);
                }
            }
        }
    }
}

template <int BITS, bool LUT, GemvIn IN, GemvOut OUT, int KS> void launch(const QuantMatrix & w, const GemvArgs & a, cudaStream_t s) {
    constexpr int CV = 128 / BITS;
    const int chunks = a.k / CV;
    const size_t smem = (size_t(a.k) + ((chunks + 1) & ~1)) * sizeof(float) + (LUT ? 256 * sizeof(float2) : 0);
    auto kernel = qgemv_kernel<BITS, LUT, IN, OUT, KS>;
    static PerDevice<size_t> configured;
    allow_dynamic_smem(kernel, smem, configured);
    constexpr int OPW = k_rows_per_warp / (OUT == GemvOut::SiluMulBf16 ? 2 : 1);
    const int n_groups = (a.n + OPW - 1) / OPW;
    const int per_block = k_warps / KS;
    const int blocks = std::min((n_groups + per_block - 1) / per_block, sm_count() * 16);
    for (int m = 0; m < a.m; m++) {
        launch_kernel(kernel, blocks, k_threads, smem, s, w, a, m);
    }
}

// Warps per row group: enough blocks for two per SM.
template <int BITS, bool LUT, GemvIn IN, GemvOut OUT> void launch_ks(const QuantMatrix & w, const GemvArgs & a, cudaStream_t s) {
    constexpr int OPW = k_rows_per_warp / (OUT == GemvOut::SiluMulBf16 ? 2 : 1);
    const int n_groups = (a.n + OPW - 1) / OPW;
    int target = 2 * sm_count();
    if (forced_ks()) target = forced_ks() >= 8 ? 1 << 30 : forced_ks() >= 4 ? n_groups / 2 : forced_ks() >= 2 ? n_groups / 4 : 0;
    if (n_groups / 8 >= target) return launch<BITS, LUT, IN, OUT, 1>(w, a, s);
    if (n_groups / 4 >= target) return launch<BITS, LUT, IN, OUT, 2>(w, a, s);
    if (n_groups / 2 >= target) return launch<BITS, LUT, IN, OUT, 4>(w, a, s);
    return launch<BITS, LUT, IN, OUT, 8>(w, a, s);
}

template <int BITS, bool LUT, GemvIn IN> void dispatch_out(const QuantMatrix & w, const GemvArgs & a, GemvOut out, cudaStream_t s) {
    switch (out) {
    case GemvOut::Bf16: return launch_ks<BITS, LUT, IN, GemvOut::Bf16>(w, a, s);
    case GemvOut::F32: return launch_ks<BITS, LUT, IN, GemvOut::F32>(w, a, s);
    case GemvOut::AddF32: return launch_ks<BITS, LUT, IN, GemvOut::AddF32>(w, a, s);
    case GemvOut::SiluMulBf16: return launch_ks<BITS, LUT, IN, GemvOut::SiluMulBf16>(w, a, s);
    }
}

template <int BITS, bool LUT> void dispatch_in(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, cudaStream_t s) {
    if (in == GemvIn::NormF32) return dispatch_out<BITS, LUT, GemvIn::NormF32>(w, a, out, s);
    return dispatch_out<BITS, LUT, GemvIn::Bf16>(w, a, out, s);
}

template <int BITS, bool LUT> __global__ void dequantize_kernel(QuantMatrix w, bf16 * out) {
    constexpr int PER_WORD = 32 / BITS;
    const int words_per_row = w.k / PER_WORD;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= int64_t(w.rows) * words_per_row) return;
    const int64_t row = idx / words_per_row;
    const int word = int(idx % words_per_row);
    const uint32_t v = w.codes[idx];
    float scale, zero = 0;
    if constexpr (LUT) {
        scale = w.absmax[row * (w.k / 64) + word * PER_WORD / 64];
    } else {
        const int64_t gi = row * w.groups + (word * PER_WORD) / w.group;
        scale = __half2float(__ushort_as_half(w.scales[gi]));
        zero = w.zeros ? float(w.zeros[gi]) : float(w.const_zero);
    }
#pragma unroll
    for (int t = 0; t < PER_WORD; t++) {
        const uint32_t q = (v >> (BITS * t)) & ((1u << BITS) - 1u);
        const int pos = word * PER_WORD + t;
        const int channel = w.perm ? w.perm[pos] : pos;
        const float value = LUT ? w.table[q] * scale : scale * (float(q) - zero);
        out[row * w.k + channel] = __float2bfloat16(value);
    }
}

// Inputs that need RMSNorm, an act-order gather or zero padding up to k_padded are staged: in the ring kernel's
// shared memory when they fit, else once by a small kernel into `scratch`.
void stage_to_scratch(const QuantMatrix & w, const GemvArgs & a, GemvIn in, void * scratch, cudaStream_t s) {
    if (!scratch) QINFER_FAIL() << "qgemv: the tiled layout needs a staging buffer here";
    if (in == GemvIn::NormF32) {
        launch_kernel(mma4::stage_inputs_kernel<GemvIn::NormF32>, a.m, mma4::k_threads, 0, s, w, a, static_cast<bf16 *>(scratch));
    } else {
        launch_kernel(mma4::stage_inputs_kernel<GemvIn::Bf16>, a.m, mma4::k_threads, 0, s, w, a, static_cast<bf16 *>(scratch));
    }
}

// Bf16 inputs that need no staging are staged in shared memory all the same where they fit and are long (16-byte
// copies, then every B fragment from shared memory instead of an L2 round trip per 64-wide K block). On an H100, 7B
// GPTQ-Int4 down (k 18944) 22.0 -> 19.0 us, o_proj (k 3584) level, but 0.5B GPTQ-Int4 (o_proj 896, down 4864)
// -1.9% end to end (bench/results/2026-11-27-h100-qgemv-stage): hence from k_stage_plain_min_k. From k 3584 instead
// (7B's o_proj too) was measured on an H200: 7B +0.36%, 0.5B -2.0% (bench/results/2026-11-28-h200-3ca90f2).
constexpr int k_stage_plain_min_k = 8192;
// Plain inputs of 2-4 rows (o_proj at k 3584) staged as well lost on an H200: 7B GPTQ-Int4 batch 2 -1.2%, batch 4
// level (bench/results/2026-12-01-h200-qgemv-rows).
static bool stage_plain_input(int k) { return k >= k_stage_plain_min_k; }

void qgemv_tiled(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, void * scratch, cudaStream_t s) {
    const bool needs_stage = in == GemvIn::NormF32 || w.perm || a.k != w.k_padded;
    if ((needs_stage || stage_plain_input(a.k)) && size_t(a.m) * ring4::stage_stride(w.k_padded, a.m) * sizeof(bf16) <= ring4::k_max_stage_bytes) {
        if (in == GemvIn::NormF32) return qgemv_ring_stage_norm(w, a, out, s);
        return qgemv_ring_stage_bf16(w, a, out, s);
    }
    const bf16 * x = static_cast<const bf16 *>(a.x);
    int ldx = a.k;
    if (needs_stage) {
        stage_to_scratch(w, a, in, scratch, s);
        x = static_cast<const bf16 *>(scratch);
        ldx = w.k_padded;
    }
    qgemv_ring_global(w, x, ldx, a, out, s);
}

}  // namespace

// The deep ring's mode: 1 every code kind, 0 none, -1 affine codes, 4- and 8-bit (the default). On an H100, 7B
// GPTQ-Int4 down 25.2 -> 22.2 us and o_proj 8.1 -> 7.6, while GPTQ-Int8 lost 1.1-1.3 us and NF4 tied
// (bench/results/2026-11-27-h100-early-kv); on an H200 8-bit codes gain too: 7B Int8 down at m 1 / 4 30.4 / 31.8 ->
// 23.6 / 26.2 us, o_proj 8.4 -> 7.4, 7B GPTQ-Int8 batch 1 331.2 -> 353.7 tok/s, batch 4 1,187.8 -> 1,248.7
// (bench/results/2026-12-01-h200-int8-ring). Tests force it with set_qgemv_ring_deep.
static std::atomic<int> ring_deep_mode{-1};

bool qgemv_ring_deep(bool affine) {
    const int mode = ring_deep_mode;
    return mode == 1 || (mode == -1 && affine);
}
void set_qgemv_ring_deep(bool on) { ring_deep_mode = on ? 1 : 0; }
void reset_qgemv_ring_deep() { ring_deep_mode = -1; }

// The fast rounds' mode (qgemv_ring_launch.cuh): -1 where every K part holds one round (the default), 1 wherever
// the kernel can take them, 0 never (set_qgemv_ring_fast, for tests).
static std::atomic<int> ring_fast_mode{-1};

int qgemv_ring_fast_mode() { return ring_fast_mode; }
void set_qgemv_ring_fast(int mode) { ring_fast_mode = mode; }

// The split last wave's mode: 1 every grid's second half where the kernel can (tests), -1 the rule of
// ring_launch::split_from.
static std::atomic<int> ring_split_mode{-1};
int qgemv_ring_split_mode() { return ring_split_mode; }
void set_qgemv_ring_split(int mode) { ring_split_mode = mode; }

size_t qgemv_scratch_bytes(int k_padded, int m) { return size_t(k_padded) * m * sizeof(bf16); }

int qgemv_beside_blocks(const QuantMatrix & gate_up, int n) {
    if (!gate_up.tiled) return 0;
    const int ks = ring_launch::ring_parts<GemvOut::SiluMulBf16>(gate_up, n, 1, true, true);
    return ks ? ring_launch::ring_grid(n, 2, ks) : 0;
}

bool qgemv_pair_io_ok(const QuantMatrix & gate_up, const QuantMatrix & down) {
    return gate_up.tiled && down.tiled && !gate_up.lut && !down.lut && !down.perm && down.k == down.k_padded && down.k % 64 == 0 && gate_up.rows == 2 * down.k;
}

void qgemv(const QuantMatrix & w, const GemvArgs & a, GemvIn in, GemvOut out, void * scratch, cudaStream_t stream) {
    const int rows_needed = out == GemvOut::SiluMulBf16 ? 2 * a.n : a.n;
    if (w.rows != rows_needed || w.k != a.k) {
        QINFER_FAIL() << "qgemv: weight is [" << w.rows << ", " << w.k << "], the call needs [" << rows_needed << ", " << a.k << "]";
    }
    if (in == GemvIn::NormF32 && !a.norm_w) QINFER_FAIL() << "qgemv: NormF32 input needs norm weights";
    if (w.tiled) {
        if (w.bits != 4 && (w.bits != 8 || w.lut)) QINFER_FAIL() << "qgemv: tiled " << w.bits << "-bit codes";
        if (a.m < 1 || a.m > 8) QINFER_FAIL() << "qgemv: m = " << a.m << " (1..8 for the tiled layout)";
        if (out == GemvOut::SiluMulBf16 && a.n % 16 != 0) QINFER_FAIL() << "qgemv: gate/up of " << a.n << " rows (a multiple of 16 needed)";
        // pair_io: the output's order where it is SiluMulBf16, else the input's (bf16).
        if (a.pair_io && (a.n % 64 != 0 || a.k % 64 != 0 || (out != GemvOut::SiluMulBf16 && in != GemvIn::Bf16))) {
            QINFER_FAIL() << "qgemv: pair-ordered activations need a SiluMulBf16 output or a Bf16 input, n and k multiples of 64";
        }
        return qgemv_tiled(w, a, in, out, scratch, stream);
    }
    if (w.lut) {
        if (w.bits != 4 || a.k % 64 != 0) QINFER_FAIL() << "qgemv: lookup codes are 4-bit with k a multiple of 64";
        return dispatch_in<4, true>(w, a, in, out, stream);
    }
    if (w.bits == 4 && a.k % 32 == 0 && w.group % 32 == 0) return dispatch_in<4, false>(w, a, in, out, stream);
    if (w.bits == 8 && a.k % 16 == 0 && w.group % 16 == 0) return dispatch_in<8, false>(w, a, in, out, stream);
    QINFER_FAIL() << "qgemv: " << w.bits << "-bit codes with k " << a.k << " and group " << w.group << " are not supported";
}

void dequantize(const QuantMatrix & w, bf16 * out, cudaStream_t stream) {
    const int threads = 256;
    if (w.tiled) {
        // Whole-line stores by eight lanes per row (2.5-2.8 TB/s against 1.8-2.0 with two lanes per row, H100,
        // bench/results/2026-11-27-h100-qgemm-splitk); act-order matrices and odd k take the per-word kernel.
        if (!w.perm && w.k % 8 == 0) {
            const int64_t tasks = int64_t(w.rows_padded / 16) * (w.k_padded / 64);
            const int tiles = w.bits == 8 && !w.lut ? mma4::dequant_tiles<2>() : mma4::dequant_tiles<1>();
            const int64_t per_block = int64_t(mma4::k_warps) * tiles;
            const unsigned blocks = unsigned((tasks + per_block - 1) / per_block);
            if (w.lut) {
                mma4::dequantize_tiled_rows_kernel<1, true><<<blocks, mma4::k_threads, 0, stream>>>(w, out);
            } else if (w.bits == 8) {
                mma4::dequantize_tiled_rows_kernel<2, false><<<blocks, mma4::k_threads, 0, stream>>>(w, out);
            } else {
                mma4::dequantize_tiled_rows_kernel<1, false><<<blocks, mma4::k_threads, 0, stream>>>(w, out);
            }
            CUDA_CHECK(cudaGetLastError());
            return;
        }
        const int64_t words = int64_t(w.rows_padded) * w.k_padded / 8;  // of the low plane
        const unsigned blocks = unsigned((words + threads - 1) / threads);
        if (w.lut) {
            mma4::dequantize_tiled_kernel<1, true><<<blocks, threads, 0, stream>>>(w, out);
        } else if (w.bits == 8) {
            mma4::dequantize_tiled_kernel<2, false><<<blocks, threads, 0, stream>>>(w, out);
        } else {
            mma4::dequantize_tiled_kernel<1, false><<<blocks, threads, 0, stream>>>(w, out);
        }
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const int64_t words = int64_t(w.rows) * (w.k * w.bits / 32);
    const unsigned blocks = unsigned((words + threads - 1) / threads);
    if (w.lut) {
        dequantize_kernel<4, true><<<blocks, threads, 0, stream>>>(w, out);
    } else if (w.bits == 4) {
        dequantize_kernel<4, false><<<blocks, threads, 0, stream>>>(w, out);
    } else if (w.bits == 8) {
        dequantize_kernel<8, false><<<blocks, threads, 0, stream>>>(w, out);
    } else {
        QINFER_FAIL() << "dequantize: " << w.bits << "-bit codes are not supported";
    }
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qinfer::cuda
