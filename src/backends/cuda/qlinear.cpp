// Which kernel a quantized projection of m rows goes to. Measured on an H200 with `qinfer bench --kernels`
// (bench/results/2026-11-29-h200-qgemm-mma and 2026-11-30-h200x2-qgemm-rs, 7B and 0.5B shapes, 4- and 8-bit codes):
// the tiled GEMV up to its 8 rows; beyond, the register-dequantizing GEMM on Hopper's warpgroup MMAs (qgemm_rs) up to
// 256 rows, from 9 rows for 8-bit codes and from 33 for 4-bit (7B Int4 gate_up at m 64 / 128 / 256: 66 / 93 / 140 us
// against qgemm_mma's 86 / 138 / 243, the wgmma GEMM's 127 / 130 / 181 and dequantize + cuBLASLt's 183 / 186 / 206;
// 52 / 85 / 140 since qgemm_rs deals a last wave's tiles out in pieces of K, 2026-12-01-h200-rs-pieces; 49.6 / 64.0 /
// 112.1 since it copies a stage's codes in one tensor copy, 2026-12-01-h200-code-map; at m 16 / 32
// 4-bit codes keep qgemm_mma: 38.3 / 53.0 us against 46.2 / 48.4 for gate_up, 23.1 / 26.6 against 21.9 / 32.3 for
// down; at m 32 since: 51.1 / 27.8 against 52.8 / 33.7); elsewhere (and on sm_80) qgemm_mma up to 64 rows; from 128
// rows the wgmma GEMM where it pays (qgemm_pays) and dequantize + cuBLASLt otherwise (at m 512 that beats qgemm_rs on
// qkv, o_proj and down: 41 / 31 / 150 us against 48 / 47 / 228; on gate_up qgemm_rs's 230 us beat the wgmma GEMM's 306
// with the codes' tensor copies, but taking it for 257-512 rows where its tiles fill a wave left the throughput rows
// level, 92.90 / 92.51 against 93.14 / 92.37 requests/s: their steps hold ~1000 rows, 2026-12-01-h200-code-map).
// Lookup codes (NF4 / FP4) take qgemm_rs from 5 rows where it applies: its table lookups cost little beside the
// MMAs, where qgemm_mma's (two blocks an SM) do not (7B NF4 gate_up at m 8 / 16 / 32 / 64: 48.6 / 49.3 / 46.8 / 53.8
// us against qgemm_mma's 58.4 / 59.0 / 87.9 / 118.4 and dequantize + cuBLASLt's ~178; qkv at m 8 9.4 against the
// GEMV's 11.1, o_proj 8.2 / 10.9; on 0.5B's shapes at m 8 the GEMV wins, 3.2-7.3 against 6.4-8.3: hence from 12M
// codes; at m 512 dequantize + cuBLASLt wins on qkv / o_proj / down; bench/results/2026-12-02-h200-nf4-gemm).
// Since qgemm_rs takes tiles of 256 tokens from 192 rows (m64n256 MMAs, y by tensor stores) affine codes keep it up to
// 4096 rows (4-bit) and 2048 (8-bit), so that steps of ~1000 rows (`bench --throughput`) write no bf16 weight: 7B Int4
// at m 1024 / 2048 / 4096, qgemm_rs against dequantize + cuBLASLt (us): gate_up 362.5 / 717.6 / 1,498.2 against 459.4 /
// 829.8 / 1,594.0, down 195.4 / 407.2 / 755.5 against 234.0 / 445.2 / 839.9, qkv 54.9 / 98.3 / 190.5 against 61.1 /
// 104.4 / 191.9, o_proj 37.7 / 76.7 / 150.8 against 48.9 / 88.5 / 158.3 (bf16 cuBLASLt gate_up 352.5 / 697.4 / 1,525.7);
// Int8 at 4096 loses on three of four (qkv 205.2 against 191.8, gate_up 1,656.7 against 1,573.6) and wins at 2048
// (gate_up 780.2 against 817.3, qkv 105.3 / 104.7); bench/results/2026-12-02-h200-rs-wide, call 2. Beyond, prefill
// chunks dequantize. The wgmma GEMM that dequantized into shared memory (qgemm_wgmma.cu) left the rule then: qgemm_rs
// beat it on every shape from 128 to 1024 rows by 1.6-2.5x (gate_up Int4 at 512 184.2 against 298.6 us; call 3); it
// was removed when qgemm_rs's grouped mode beat it in MoE prefill too (bench/results/2026-12-03-h200-moe-rs). Lookup
// codes take the 256-token tiles too and qgemm_rs up to 2048 rows (it had dequantize + cuBLASLt from 257): 7B NF4 at
// m 1024 / 2048, qgemm_rs against dequantize + cuBLASLt (us): gate_up 403.8-415.9 / 745.5-747.7 against 448.8-473.8 /
// 784.5-791.7, down 193.5 / 405.5-406.6 against 226.5 / 422.3-425.6, qkv 56.0 / 100.6-101.0 against 60.2-60.6 /
// 102.2-102.3, o_proj 39.0 / 79.2 against 48.7-49.0 / 87.0-87.2; 7B NF4 `bench --throughput` 1000 x (100 -> 250)
// 92.03 / 91.57 -> 101.37 / 101.16 requests/s (bench/results/2026-12-02-h200-lut-wide, call 1).
#include <algorithm>

#include "backends/cuda/ops.h"

namespace qinfer::cuda {

namespace {
// Rows up to which the register-dequantizing GEMM (qgemm_mma) is taken over dequantize + cuBLASLt.
constexpr int k_mma_max_m = 64;
// Rows up to which the register-sourced wgmma GEMM (qgemm_rs) is taken where it applies (4-bit affine, 8-bit affine,
// lookup codes), and up to which its gate/up tiles write SiLU(gate) * up themselves (quant_linear_silu).
constexpr int k_rs_max_m_int4 = 4096, k_rs_max_m_int8 = 2048, k_rs_max_m_lut = 2048, k_rs_silu_max_m = 64;
int rs_max_m(const QuantMatrix & w) { return w.lut ? k_rs_max_m_lut : w.bits == 8 ? k_rs_max_m_int8 : k_rs_max_m_int4; }
// Codes from which the GEMM takes over from the tiled GEMV at 5 to 8 rows (affine, lookup codes).
constexpr int64_t k_mma_large_codes = int64_t(32) << 20, k_lut_large_codes = int64_t(12) << 20;
}  // namespace

QuantPath quant_path(const QuantMatrix & w, int m) {
    // 5 to 8 rows: the GEMM on large weights (7B Int4 at m 8: gate_up 39.3 us against the GEMV's 56.2, down 22.6 /
    // 37.9), the GEMV on the rest (qkv 9.9 / 9.4, o_proj 9.6 / 9.1; 0.5B's four 5.2-9.4 / 4.9-6.4).
    const int64_t codes = int64_t(w.rows_padded) * w.k_padded;
    const bool large = codes >= (w.lut ? k_lut_large_codes : k_mma_large_codes);
    if (m <= k_qgemv_rowwise_max_m) return QuantPath::Gemv;
    if (w.tiled && m <= k_qgemv_max_m && !(large && qgemm_mma_applies(w))) return QuantPath::Gemv;
    // Lookup codes at 9-16 rows (one 16-token tile) on weights of 32 M codes or more (7B gate_up, down) take qgemm_mma,
    // whose full stages run straight-line where groups tile them: 7B NF4 at m 16, qgemm_mma against qgemm_rs, gate_up
    // 37.8 against 49.2 us, down 23.4 against 23.7; on qkv / o_proj qgemm_rs is as fast or faster (9.7 against 9.75,
    // 8.7 against 9.5); bench/results/2026-12-02-h200-mma-fixed, call 2.
    const bool lut_mma = w.lut && m >= 9 && m <= 16 && codes >= k_mma_large_codes;
    if (!lut_mma && m <= rs_max_m(w) && m >= (w.lut ? 5 : w.bits == 8 ? 9 : 33) && qgemm_rs_applies(w)) return QuantPath::Rs;
    if (m <= k_mma_max_m && qgemm_mma_applies(w)) return QuantPath::Mma;
    return QuantPath::Dequantize;
}

const char * quant_path_name(QuantPath path) {
    switch (path) {
        case QuantPath::Gemv: return "gemv";
        case QuantPath::Mma: return "mma";
        case QuantPath::Rs: return "wgmma-rs";
        case QuantPath::Dequantize: return "dequantize+cublaslt";
    }
    return "?";
}

size_t quant_linear_scratch_bytes(const QuantMatrix & w, int m) {
    // Each path's scratch function answers for every m' <= its rows (they take the most over m' themselves), so each
    // path is asked once, at the most rows <= m it takes; past qgemm_rs's largest m every path dequantizes, so the
    // rows beyond that add nothing but m itself. (Asking every path at every m' cost O(m^2) shapes a projection.)
    int most_rows[4] = {0, 0, 0, 0};  // by QuantPath
    for (int mm = 1; mm <= std::min(m, k_rs_max_m_int4); mm++) most_rows[int(quant_path(w, mm))] = mm;
    most_rows[int(quant_path(w, m))] = m;
    size_t most = 0;
    for (int p = 0; p < 4; p++) {
        const int mm = most_rows[p];
        if (mm == 0) continue;
        switch (QuantPath(p)) {
            case QuantPath::Gemv: break;
            case QuantPath::Mma: most = std::max(most, qgemm_mma_scratch_bytes(w, mm)); break;
            case QuantPath::Rs: most = std::max(most, qgemm_rs_scratch_bytes(w, mm)); break;
            case QuantPath::Dequantize: most = std::max(most, size_t(w.rows) * w.k * sizeof(bf16)); break;
        }
    }
    return most;
}

bool quant_linear(QuantPath path, const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * gemv_scratch, void * scratch,
                  size_t scratch_bytes, cudaStream_t stream) {
    switch (path) {
        case QuantPath::Gemv: {
            if (m > (w.tiled ? k_qgemv_max_m : k_qgemv_rowwise_max_m)) return false;
            GemvArgs a;
            a.n = w.rows;
            a.k = w.k;
            a.x = x;
            a.m = m;
            a.y = y;
            qgemv(w, a, GemvIn::Bf16, GemvOut::Bf16, gemv_scratch, stream);
            return true;
        }
        case QuantPath::Mma: return qgemm_mma(w, x, m, y, scratch, scratch_bytes, stream);
        case QuantPath::Rs: return qgemm_rs(w, x, m, y, scratch, scratch_bytes, stream);
        case QuantPath::Dequantize: {
            if (!scratch || scratch_bytes < size_t(w.rows) * w.k * sizeof(bf16)) return false;
            bf16 * dq = static_cast<bf16 *>(scratch);
            dequantize(w, dq, stream);
            gemm(x, dq, m, w.rows, w.k, y, false, stream);
            return true;
        }
    }
    return false;
}

bool quant_linear_silu(QuantPath path, const QuantMatrix & w, const bf16 * x, int m, bf16 * act, void * scratch, size_t scratch_bytes,
                       cudaStream_t stream) {
    // qgemm_rs's SwiGLU tiles (CW / 2 gate row blocks beside their up row blocks) at up to 64 rows. On an H200, 7B
    // GPTQ-Int4 at batch 64: 13,921.05 / 13,905.03 -> 14,026.04 / 13,966.42 tok/s (+0.6%); at batch 128 (with a K-piece
    // fixup that lost, in both arms) 18,001.44 / 18,008.95 -> 17,952.11 / 17,959.61 (-0.3%), alternated twice
    // (bench/results/2026-12-02-h200-rs-silu, calls 1-2). (Tiles of 64 + 64 rows before the last wave was dealt in K
    // pieces: level at batch 64, bench/results/2026-12-01-h200-norm-ahead.)
    if (path == QuantPath::Rs && m <= k_rs_silu_max_m) return qgemm_rs(w, x, m, act, scratch, scratch_bytes, stream, true);
    return path == QuantPath::Mma && qgemm_mma(w, x, m, act, scratch, scratch_bytes, stream, true);
}

}  // namespace qinfer::cuda
