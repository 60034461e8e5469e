// GEMM for tiled 4- and 8-bit affine weights and 4-bit lookup codes (NF4 / FP4) at decode-step sizes on Hopper
// (sm_90a): y[m, n] = x[m, k] W^T with the weights dequantized in registers straight into the A operand of warpgroup
// MMAs (wgmma with A from registers, B = the tokens from shared memory), never written anywhere. The sm_80 kernel of
// the same job, qgemm_mma.cu, multiplies each dequantized fragment by 8-token column blocks with mma.sync, loading
// every B fragment by ldmatrix and scaling per-group fp32 sums: at 64 tokens it issued ~200 instructions a warp per K
// block for ~60 of arithmetic and ran at ~190 TFLOP/s (7B Int4 gate_up at m 64 0.77x bf16 cuBLASLt on an H200,
// bench/results/2026-11-29-h200-qgemm-mma). Here one wgmma.m64nBTk16 per k16 step covers a warpgroup's 64 rows and all
// BT tokens, B read by the tensor cores.
//
//   block (token tile, row tile, share of K: Deal): two or three consumer warpgroups (consumer_warps) and a producer warp;
//     consumer warp w owns 16-row block w of the 128- or 192-row tile (warpgroup h: rows 64 h .. 64 h + 63, the m64 of
//     its MMAs), over the block's K blocks. Tiles of 256 tokens (from 192 rows) hold 128 accumulators a
//     thread: their producer is a warpgroup that hands registers to the two consumer warpgroups (setmaxnreg). They
//     took 7B Int4 gate_up at m 256 / 512 / 1024 from 110.6 / 217.4 / 441.1 us to 104.7 / 200.2 / 388.4 (bf16
//     cuBLASLt 98.7 / 186.0 / 346.9) and 7B GPTQ-Int4 `bench --throughput` 1000 x (100 -> 250), whose steps hold
//     ~1000 rows and dequantized every weight before, from 92.32 / 92.00 to 102.83 / 103.10 requests/s
//     (bench/results/2026-12-02-h200-rs-wide, call 1).
//   producer: per K block one tensor copy of x as a [BT tokens][64 bf16] panel in the 128-byte swizzle wgmma reads
//     (tokens past m and positions past k arrive as zeros) and one of the tile's codes (a 3-D map over the tile
//     layout: CW row blocks x planes x 512 bytes, weight_code_tensor_map), into a stage of shared memory guarded by
//     mbarriers (full: landed; empty: every consumer warp's MMAs on it are done), STAGES deep. (A bulk copy of 512
//     bytes per row block and plane paced the kernel: with the code copies left out 7B Int4 gate_up at m 64 / 128 /
//     256 took 48.7 / 62.7 / 109.3 us against 52.4 / 78.0 / 139.4, with the x copies left out 51.1 / 75.9 / 135.1;
//     one copy a stage: 53.2 / 80.9 / 145.7 -> 49.6 / 64.0 / 112.1; bench/results/2026-12-01-h200-code-map.) (A
//     first form had every thread copy its share of each stage by cp.async, with a block barrier per stage: 7B Int4
//     gate_up at m 128 108 us, 94 this way; bf16 cuBLASLt 72; 2bef1a8, fe3fcc8.) ncu of
//     gate_up at m 128 (fa4ea6b): most stalls are consumers waiting on a stage's full barrier, the data late.
//   dequantization: a lane's 16 bytes per plane and K block are its A fragments of four k16 steps (the GEMV's tile
//     layout, qgemv_ring.cuh); each register pair becomes q - z exactly (LOP3 into 128 + q, one HSUB2; 8-bit: the
//     high plane's 16 (hi - zh) added, still exact: |q - z| < 256), then one HMUL2 by the group's scale rounded to
//     bf16. So each weight is bf16(bf16(s) (q - z)), two roundings where cuda::dequantize rounds s (q - z) once
//     (vLLM's Marlin also keeps bf16 scales for bf16 activations); the tests bound the difference. Lookup codes:
//     each register's pair from the table of 256 bf16 pairs in shared memory (one copy a lane, in place of stages),
//     times the group's absmax rounded to bf16.
//   MMAs: a K block's four k16 steps go in two groups of two, each with its own A registers (16 a thread in all); the
//     wait for the group before comes after each commit, so a group's dequantization runs while the one before
//     multiplies; when the K block before is done its stage goes back to the producer.
//   epilogue: bf16 y (tiles of 256 tokens: by stmatrix into shared memory and a tensor store a warpgroup), or for a
//     piece of a tile whose K is dealt to several blocks its fp32 sums into the scratch,
//     added in piece order by add_pieces_kernel (deterministic). K is dealt out where the grid is under half a wave,
//     and for the tiles of a last, partial wave (shape_for). (The pieces adding their tile's sums themselves, each
//     its share once a per-tile count says all have stored theirs, no add_pieces launch: 7B GPTQ-Int4 batch 64
//     13,796.17 / 13,803.18 -> 13,663.53 / 13,663.56 tok/s, -1.0%; bench/results/2026-12-02-h200-rs-silu, call 2.)
//     SwiGLU (silu_mul): a tile's CW / 2 gate row blocks beside the same features' up row blocks, y = SiLU(gate) *
//     up [m, rows / 2], in the epilogue of whole tiles and in add_pieces_kernel for pieces.
// Grouped mode (moe_qgemm, MoE prefill): block (x, y) is the routing's row tile x of sorted rows, all of one expert,
//   times row tile y of that expert's rows in the stacked matrix (its codes and group parameters from the expert's
//   first row block on), all of K, whole tiles only. Against the GEMM that dequantized into shared memory
//   (qgemm_wgmma.cu, ~285 TFLOP/s), with 128-row tiles: Qwen2-57B-A14B GPTQ-Int4 at 30720 186.23 / 186.19 -> 192.80 /
//   192.86 tok/s (time to first token 2.46 -> 2.08 s), Qwen1.5-MoE-A2.7B GPTQ-Int4 312.80 / 312.82 -> 314.89 / 314.94
//   (0.554 -> 0.510 s; bench/results/2026-12-03-h200-moe-rs, call 1). Tiles of 256 rows (NT 32; an expert's last
//   tile of 128 rows or fewer as m64n128 MMAs) lost to these: 57B 193.63 / 193.56 -> 191.52 / 191.53 tok/s, the
//   grouped launches 0.935 -> 1.070 s of its prefill (kernel trace); A2.7B 314.61 / 314.26 -> 312.85 / 312.59 (call 2).
// Grid (1-D): tiles with token tiles fastest, so the token tiles of one row tile run together and read its codes
// from L2; a tile's pieces side by side.
// Act-order weights, k not a multiple of 8 and unaligned x take x gathered into bf16 [m, k_padded] first (the
// scratch's head), as the other fused GEMMs do.
#include <cuda.h>

#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_tiles.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"
#include "backends/cuda/tensor_map.h"
#include "backends/cuda/wgmma.cuh"

namespace qinfer::cuda {

namespace {

// Consumer warps per block for BT = 8 NT tokens, and blocks per SM (registers: the accumulators are BT / 2 floats a
// thread). Every consumer warpgroup of a block multiplies the same x panel; 12 warps (+ the producer: 13, four a
// scheduler, 128 registers) for 128 tokens' 64 accumulators read x from L2 fewer times than 8 (7B Int4 gate_up at m
// 256 156 -> 139 us, m 128 94 -> 92). For 64 tokens 16 warps lost (gate_up 67 -> 103 us at m 64: 148 blocks, one a
// SM, a second wave of 16) to 8 warps two blocks an SM (66 us; bench/results/2026-11-30-h200x2-qgemm-rs).
__host__ __device__ constexpr int consumer_warps(int nt) { return nt == 16 ? 12 : 8; }
// Tiles of 256 tokens (NT 32) hold 128 accumulators a thread: at 9 warps ptxas grants 168 registers (three warps on
// one SM quarter) and serialised their m64n256 MMAs (C7512), so the producer comes as a warpgroup of its own that
// hands registers to the consumers with setmaxnreg (one warp copies, three leave), as attention_prefill_tma does.
__host__ __device__ constexpr bool producer_warpgroup(int nt) { return nt == 32; }
__host__ __device__ constexpr int block_threads(int nt) { return 32 * consumer_warps(nt) + (producer_warpgroup(nt) ? 128 : 32); }
__host__ __device__ constexpr int reg_blocks(int nt) { return nt <= 2 ? 3 : nt <= 8 ? 2 : 1; }

// Row tiles of a launch: CW row blocks each, or with SwiGLU CW / 2 row blocks of the gate half and the same
// features' row blocks of the up half.
int row_tiles(const QuantMatrix & w, int nt, bool swiglu) {
    const int rbs = swiglu ? consumer_warps(nt) / 2 : consumer_warps(nt), n_rb = swiglu ? w.rows_padded / 32 : w.rows_padded / 16;
    return (n_rb + rbs - 1) / rbs;
}

// A kernel's shape for PLANES planes of codes (LUT: lookup codes, one plane) and BT = 8 NT tokens: a stage is one
// K block. Lookup codes keep their pair table (32 copies, mma4::fill_pair_table) after the barriers, in place of
// stages.
template <int PLANES, bool LUT, int NT> struct RsShape {
    static constexpr int BT = 8 * NT;
    static constexpr int CW = consumer_warps(NT);
    static constexpr int code_bytes = CW * PLANES * 512;  // the row blocks' codes of one K block
    static constexpr int panel_bytes = BT * 128;          // x: [BT tokens][64 bf16]
    static constexpr int stage_bytes = code_bytes + panel_bytes;
    static constexpr int BLOCKS = reg_blocks(NT);
    static constexpr int lut_copies = LUT ? 32 : 0;
    static constexpr int lut_bytes = 256 * lut_copies * 4;
    static constexpr int STAGES = std::min(8, int((227 * 1024 / BLOCKS - 2048 - lut_bytes) / stage_bytes));
    static constexpr size_t bar_offset = size_t(STAGES) * stage_bytes;
    static constexpr size_t lut_offset = bar_offset + 2 * STAGES * sizeof(uint64_t);
    static constexpr size_t smem = lut_offset + lut_bytes + 1024;  // + the base's 1024-byte alignment
    static_assert(code_bytes % 1024 == 0 && panel_bytes % 1024 == 0, "panels keep the swizzle's 1024-byte alignment");
    static_assert(STAGES >= 3 && smem * BLOCKS <= 228 * 1024 - BLOCKS * 1024, "the blocks fit an SM's shared memory");
    static_assert(!LUT || PLANES == 1, "lookup codes are 4-bit");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A group's parameters as this lane needs them: rows g (lo) and g + 8 (hi) of its row block, the scale as a bf16 pair.
template <int PLANES> struct RsParams {
    uint32_t s_lo, s_hi;
    uint32_t zz_lo[PLANES], zz_hi[PLANES];  // bf16x2 pairs subtracted from each plane (128 + zl; 2048 + 16 zh)
};

__device__ __forceinline__ uint32_t bf16_pair(uint16_t half_bits) {
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16(__half2float(__ushort_as_half(half_bits))))) * 0x10001u;
}

// Lookup codes: the group's absmax rounded to bf16 multiplies the table's pairs (no zero point).
template <int PLANES> __device__ __forceinline__ RsParams<PLANES> unpack_params(const mma4::LutParams & r) {
    RsParams<PLANES> p{};
    p.s_lo = uint32_t(__bfloat16_as_ushort(__float2bfloat16(r.absmax[0]))) * 0x10001u;
    p.s_hi = uint32_t(__bfloat16_as_ushort(__float2bfloat16(r.absmax[1]))) * 0x10001u;
    return p;
}

template <int PLANES> __device__ __forceinline__ RsParams<PLANES> unpack_params(const mma4::RawParams & r) {
    RsParams<PLANES> p;
    p.s_lo = bf16_pair(r.s[0]);
    p.s_hi = bf16_pair(r.s[1]);
    const uint32_t low_mask = PLANES == 1 ? 0xFFu : 15u;
    p.zz_lo[0] = (0x4300u + (uint32_t(r.z[0]) & low_mask)) * 0x10001u;  // 128 + z, exact up to 255
    p.zz_hi[0] = (0x4300u + (uint32_t(r.z[1]) & low_mask)) * 0x10001u;
    if constexpr (PLANES == 2) {
        p.zz_lo[1] = (0x4500u + (uint32_t(r.z[0]) >> 4)) * 0x10001u;  // 2048 + 16 zh
        p.zz_hi[1] = (0x4500u + (uint32_t(r.z[1]) >> 4)) * 0x10001u;
    }
    return p;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
    __nv_bfloat162 d = __hmul2(x, y);
    return *reinterpret_cast<uint32_t *>(&d);
}

// A fragments of k16 step j from this lane's code words: registers 0, 2 rows g, 1, 3 rows g + 8. Lookup codes: the
// pairs from the table at this lane's copy (lut_lane), times the absmax.
template <int PLANES, bool LUT>
__device__ __forceinline__ void dequantize_step(const uint4 (&cw)[PLANES], int j, const RsParams<PLANES> & p, const uint32_t * lut_lane,
                                                uint32_t (&a)[4]) {
    constexpr uint32_t mask = 0x000F000Fu;
    const uint32_t lo_word = reinterpret_cast<const uint32_t *>(&cw[0])[j];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const bool hi_row = r & 1;
        if constexpr (LUT) {
            a[r] = bf16x2_mul(mma4::lut_pair(lut_lane, 32, lo_word, r), hi_row ? p.s_hi : p.s_lo);
            continue;
        }
        uint32_t v = mma4::bf16x2_sub(mma4::lop3_and_or(lo_word >> (4 * r), mask, 0x43004300u), hi_row ? p.zz_hi[0] : p.zz_lo[0]);
        if constexpr (PLANES == 2) {
            const uint32_t hi_word = reinterpret_cast<const uint32_t *>(&cw[1])[j];
            v = mma4::bf16x2_add(v, mma4::bf16x2_sub(mma4::lop3_and_or(hi_word >> (4 * r), mask, 0x45004500u), hi_row ? p.zz_hi[1] : p.zz_lo[1]));
        }
        a[r] = bf16x2_mul(v, hi_row ? p.s_hi : p.s_lo);
    }
}
#endif

// How a launch deals its tiles (token tile, row tile; tile t = row tile * token_tiles + token tile) to blocks: tiles
// [0, whole) one block each over all of K (y written directly), tiles [whole, tiles) `pieces` blocks each over
// consecutive shares of K (fp32 sums into the scratch, [piece block][BT tokens][16 CW rows], added by
// add_pieces_kernel in piece order). Block b < whole is tile b; block whole + j pieces + z is piece z of tile whole + j.
struct Deal {
    int token_tiles, tiles, whole, pieces;
    int blocks() const { return whole + (tiles - whole) * pieces; }
};

// GROUPED launches (moe_qgemm): block (x, y) multiplies the routing's row tile x of BT sorted rows by row tile y of
// its expert's w_rows rows in the stacked matrix (expert e's rows from e w_rows), all of K; y [sorted rows, w_rows]
// (SwiGLU: [sorted rows, w_rows / 2], the expert's gate rows then its up rows).
struct RsGroups {
    const int * offsets = nullptr, * tiles = nullptr;  // MoeRouting's, built with tile_rows = BT
    int n_experts = 0, w_rows = 0;
};

// half_rb > 0: SwiGLU over a stacked [gate; up] weight of 2 half_rb row blocks. A tile's warps 0 .. CW / 2 - 1 own
// gate row blocks, the others the same features' up row blocks (codes: two boxes of CW / 2 row blocks, code_map's box);
// a whole tile's up warps hand their sums to the gate warps through the stages' shared memory, and y [m, rows / 2] =
// silu(bf16(gate)) * bf16(up) (transformers rounds both before silu_mul); a piece's sums go to the scratch as they
// are, and add_pieces_kernel applies the SwiGLU.
template <int PLANES, bool LUT, int NT, bool GROUPED = false>
__global__ void __launch_bounds__(block_threads(NT), RsShape<PLANES, LUT, NT>::BLOCKS)
    qgemm_rs_kernel(QuantMatrix w, int m, bf16 * __restrict__ y, float * __restrict__ partial, Deal deal, int half_rb,
                    const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap code_map,
                    const __grid_constant__ CUtensorMap y_map, int tma_store, RsGroups grp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Sh = RsShape<PLANES, LUT, NT>;
    constexpr int BT = Sh::BT, S = Sh::STAGES, CW = Sh::CW;
    // With a producer warpgroup an SM quarter holds a producer warp and two consumer warps: 40 x 32 + 2 x 232 x 32 <= 16K.
    constexpr int k_producer_registers = 40, k_consumer_registers = 232;
    extern __shared__ unsigned char smem_raw[];  // [stage][codes: row block, plane, lane | x: token, chunk], barriers
    unsigned char * smem = smem_raw + ((1024 - sm90::smem_addr(smem_raw) % 1024) % 1024);
    uint64_t * full = reinterpret_cast<uint64_t *>(smem + Sh::bar_offset), * empty = full + S;

    const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    MoeTile tl{0, 0, 0};  // GROUPED: the block's routing row tile (its tokens from row0) and expert
    if constexpr (GROUPED) {
        if (!moe_tile_of(grp.tiles, grp.offsets, grp.n_experts, blockIdx.x, BT, tl)) return;  // past the step's tiles
    }
    // n, n_rb: the rows and row blocks of the weight (GROUPED: of one expert, from row block rb_base of the matrix).
    const int nkb = w.k_padded / 64, n = GROUPED ? grp.w_rows : w.rows, G = w.groups, n_rb = GROUPED ? grp.w_rows / 16 : w.rows_padded / 16;
    const int rb_base = tl.expert * n_rb, m_end = GROUPED ? tl.row0 + tl.rows : m;  // tokens [tok0, m_end) are stored
    const int piece_block = GROUPED ? -1 : int(blockIdx.x) - deal.whole;  // >= 0: a piece of a tile whose K is dealt out
    const int tile = piece_block < 0 ? int(blockIdx.x) : deal.whole + piece_block / deal.pieces;
    const int z = piece_block < 0 ? 0 : piece_block % deal.pieces, shares = piece_block < 0 ? 1 : deal.pieces;
    const int kb_begin = int(int64_t(z) * nkb / shares), kb_end = int(int64_t(z + 1) * nkb / shares);
    const int nk = kb_end - kb_begin;
    const int tile_rbs = half_rb ? CW / 2 : CW;  // row blocks of the weight (of each half) a tile covers
    const int tok0 = GROUPED ? tl.row0 : (tile % deal.token_tiles) * BT, rb0 = (GROUPED ? int(blockIdx.y) : tile / deal.token_tiles) * tile_rbs;
    const int present = min(tile_rbs, (half_rb ? half_rb : n_rb) - rb0);  // row blocks of this tile inside the weight (half)

    uint32_t * lut = reinterpret_cast<uint32_t *>(smem + Sh::lut_offset);  // LUT: the pair table
    if constexpr (LUT) mma4::fill_pair_table(w.table, lut, 32, block_threads(NT));
    sm90::init_stage_barriers(full, empty, S, CW);  // (its block barrier also makes the table ready)

    if (warp >= CW) {  // the producer
        if constexpr (producer_warpgroup(NT)) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(k_producer_registers));
            if (warp != CW) return;
        }
        if (lane == 0) {
            sm90::prefetch_tensor_map(&x_map);
            sm90::prefetch_tensor_map(&code_map);
        }
        pdl_wait();  // x comes from the kernel ahead
        for (int i = 0; i < nk; i++) {
            const int kb = kb_begin + i, s = i % S;
            if (i >= S) sm90::mbar_wait(&empty[s], (i / S - 1) & 1);
            unsigned char * stage = smem + size_t(s) * Sh::stage_bytes;
            if (lane == 0) {  // the box's row blocks past the weight arrive as zeros, counted in its bytes
                sm90::mbar_arrive_expect_tx(&full[s], uint32_t(Sh::panel_bytes + Sh::code_bytes));
                sm90::tma_load_2d(stage + Sh::code_bytes, &x_map, &full[s], kb * 64, tok0);
                sm90::tma_load_3d(stage, &code_map, &full[s], 0, kb * PLANES, rb_base + rb0);
                if (half_rb) sm90::tma_load_3d(stage + Sh::code_bytes / 2, &code_map, &full[s], 0, kb * PLANES, rb_base + half_rb + rb0);
            }
        }
        return;
    }

    // Consumers. Row blocks past the weight multiply stale shared memory; their outputs are never stored.
    if constexpr (producer_warpgroup(NT)) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(k_consumer_registers));
    const int local = half_rb ? warp % (CW / 2) : warp;  // SwiGLU: warps w and CW / 2 + w hold one feature's gate and up
    const int rb = (half_rb && warp >= CW / 2 ? half_rb : 0) + rb0 + local;
    const bool active = local < present;
    const int64_t row0 = int64_t(active ? rb_base + rb : 0) * 16 + g;
    // Groups are multiples of 32 positions (cuda_quant_unsupported): a group starts only at k16 step 0 or 2 of a block.
    int gi = min(kb_begin * 64 / w.group, G - 1);
    int group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;  // first position past the current group
    RsParams<PLANES> par = unpack_params<PLANES>(mma4::load_group<LUT>(w, row0, gi));
    mma4::GroupRaw<LUT> next = mma4::load_group<LUT>(w, row0, min(gi + 1, G - 1));

    float d[BT / 2];
#pragma unroll
    for (int i = 0; i < BT / 2; i++) d[i] = 0.0f;
    sm90::fence_operands(d);
    // The split's i-th K block into d, in two groups of two k16 steps with their own A registers (af[h]): each group's
    // dequantization runs while the group before it multiplies; the stage of the K block before goes back to the
    // producer once its last group is done. (Two groups in flight with two sets of A registers alternating by K
    // block: ptxas serialised every MMA of that form (C7513, a wait after each), and it measured within -5% / +3% of
    // this one (7B Int4 gate_up m 128 92.3 -> 87.7 us, m 64 65.8 -> 65.0, down m 64 27.7 -> 28.6; a674f7c): the
    // overlap of dequantization and MMAs is not what bounds this kernel.)
    uint32_t af[2][2][4];  // [half of the K block][k16 step of the half][register]
    // The stage and its phase are counted, not divided out of i (S is 6 for 8-bit codes at 64 tokens); the x panels'
    // descriptors are the first stage's plus a stage's and a k16 step's 16-byte units (the address field holds shared
    // addresses / 16, under 2^14: no carry leaves it); the codes come from a base taken once. (Derived from i and
    // each stage's address, 182 instructions a warp per K block had ~40 of such arithmetic at m 64 (ncu); this way 7B
    // Int4 gate_up at m 64 / 128 / 256 49.8 / 64.5 / 112.4 -> 47.6 / 62.7 / 109.2 us, Int8 62.3 -> 58.5 at m 64;
    // bench/results/2026-12-01-h200-code-map, call 5.)
    const uint64_t desc_x0 = sm90::desc128(sm90::smem_addr(smem + Sh::code_bytes), 16, 1024);
    const uint4 * codes_mine = reinterpret_cast<const uint4 *>(smem) + warp * PLANES * 32 + lane;
    int s = 0, phase = 0, s_prev = S - 1;
    for (int i = 0; i < nk; i++) {
        const int kb = kb_begin + i;
        sm90::mbar_wait(&full[s], phase);
        uint4 cw[PLANES];
#pragma unroll
        for (int p = 0; p < PLANES; p++) cw[p] = codes_mine[s * (Sh::stage_bytes / 16) + p * 32];
        const uint64_t desc_x = desc_x0 + uint64_t(s * (Sh::stage_bytes / 16));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (kb * 64 + 32 * h >= group_end) {
                gi++;
                group_end = gi == G - 1 ? INT_MAX : group_end + w.group;
                par = unpack_params<PLANES>(next);
                next = mma4::load_group<LUT>(w, row0, min(gi + 1, G - 1));
            }
#pragma unroll
            for (int jj = 0; jj < 2; jj++) dequantize_step<PLANES, LUT>(cw, 2 * h + jj, par, lut + lane, af[h][jj]);
            sm90::wgmma_fence();
#pragma unroll
            for (int jj = 0; jj < 2; jj++) sm90::wgmma_rs_kmajor<BT>(d, af[h][jj], desc_x + 2 * (2 * h + jj));
            sm90::wgmma_commit();
            sm90::wgmma_wait<1>();  // the group before is done: its A registers are free
            if (h == 0 && i > 0) {  // ... and it was the K block before's last: that stage goes back
                __syncwarp();
                if (lane == 0) sm90::mbar_arrive(&empty[s_prev]);
            }
        }
        s_prev = s;
        if (++s == S) {
            s = 0;
            phase ^= 1;
        }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operands(d);
    static_assert(size_t(S) * Sh::stage_bytes >= size_t(CW / 2) * (BT / 2) * 32 * sizeof(float), "the up warps' sums fit in the stages");

    // Lane (g, t) holds rows g, g + 8 and tokens 2t, 2t + 1 of each 8-token column block: d[4 nt + i].
    float * sums = piece_block < 0 ? nullptr : partial + size_t(piece_block) * BT * 16 * CW;  // [BT][16 CW]: warp w's rows at 16 w
    if (NT == 32 && tma_store && !sums && !half_rb) {
        // A whole tile of 256 tokens: its outputs by stmatrix into the stages, as y_map's box [BT tokens][64 rows] a
        // warpgroup in the 128-byte swizzle, then one tensor store a warpgroup (rows past n and tokens past m are not
        // written), instead of 128 two-byte stores a thread, each instruction's over 8 rows x 4 tokens (7B Int4 at m
        // 1024: gate_up 383.2 -> 362.5 us, o_proj 42.5 -> 37.7, qkv 57.1 -> 54.9; 7B GPTQ-Int4 `bench --throughput`
        // 1000 x (100 -> 250) 103.04 / 102.63 -> 105.62 / 105.72 requests/s; bench/results/2026-12-02-h200-rs-wide).
        sm90::named_barrier(1, 32 * CW);  // every consumer's MMAs are done with the stages
        const int wg = warp / 4, wi = warp % 4, mat = lane / 8, r = lane % 8;
        unsigned char * box = smem + size_t(wg) * BT * 128;
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            // Matrix mat: 8-token block nt + mat / 2, rows g (mat even) or g + 8 of this warp's; lane 8 mat + r gives
            // token row r's 16 bytes, chunk 2 wi + mat % 2 of the token's 128, swizzled by the token (r).
            const int tok = 8 * (nt + mat / 2) + r, chunk = 2 * wi + mat % 2;
            auto pair = [&](int i) {
                __nv_bfloat162 v = __floats2bfloat162_rn(d[i], d[i + 1]);
                return *reinterpret_cast<uint32_t *>(&v);
            };
            sm90::stmatrix_x4_trans(sm90::smem_addr(box + tok * 128 + ((chunk ^ r) * 16)), pair(4 * nt), pair(4 * nt + 2), pair(4 * nt + 4),
                                    pair(4 * nt + 6));
        }
        sm90::fence_proxy_async_smem();
        sm90::named_barrier(2 + wg, 128);
        const int row0_wg = (rb0 + 4 * wg) * 16;
        if (wi == 0 && lane == 0 && row0_wg < n) {
            sm90::tma_store_2d(&y_map, box, row0_wg, tok0);
            sm90::bulk_commit_and_wait_read();
        }
        return;
    }
    if (half_rb && !sums) {  // a whole SwiGLU tile: the up warps' sums to the gate warps through the stages
        sm90::named_barrier(1, 32 * CW);  // every consumer is done with the stages (their copies have all landed)
        float * up = reinterpret_cast<float *>(smem) + size_t(local) * (BT / 2) * 32 + lane;  // [gate warp][d index][lane]
        if (warp >= CW / 2) {
#pragma unroll
            for (int i = 0; i < BT / 2; i++) up[i * 32] = d[i];
        }
        sm90::named_barrier(1, 32 * CW);
        if (warp >= CW / 2 || !active) return;
        const int inter = n / 2;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rb * 16 + g + (e >= 2 ? 8 : 0), tok = tok0 + 8 * nt + 2 * t + (e & 1);
                if (tok >= m_end) continue;
                y[size_t(tok) * inter + row] = __float2bfloat16(silu_mul_rounded(d[4 * nt + e], up[(4 * nt + e) * 32]));
            }
        }
        return;
    }
    if (!active) return;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = rb * 16 + g + (e >= 2 ? 8 : 0), tok = tok0 + 8 * nt + 2 * t + (e & 1);
            if (row >= n || tok >= m_end) continue;
            if (sums) sums[size_t(tok - tok0) * 16 * CW + warp * 16 + g + (e >= 2 ? 8 : 0)] = d[4 * nt + e];
            else y[size_t(tok) * n + row] = __float2bfloat16(d[4 * nt + e]);
        }
    }
#else
    __trap();  // launched only where qgemm_rs_applies (an sm_90a build on a compute capability 9.0 device)
#endif
}

// The pieces' sums added in piece order (the same bits on every call): y [m, n] (bf16) of tiles [whole, tiles) from
// sums [(tile - whole) pieces + z][BT][R] (fp32). Grid: (quads of a tile's BT x R sums / 256, tiles - whole); a thread
// adds four consecutive rows of one token in 16-byte loads, in 32-bit index arithmetic. (A first form, one value a
// thread with 64-bit divisions for its indices, had 7B Int4 qkv at m 64 at 13.4 us in one call against 11.5 in
// earlier calls of the old reduce; bench/results/2026-12-01-h200-rs-pieces, call 2. Not compared in one call.)
// SWIGLU: a tile's local rows [0, R / 2) are gate rows, [R / 2, R) the same features' up rows (qgemm_rs_kernel's
// half_rb); a thread adds four of each and writes y [m, n / 2] = silu(bf16(gate)) * bf16(up).
template <bool SWIGLU>
__global__ void add_pieces_kernel(const float * __restrict__ sums, Deal deal, int BT, int R, int m, int n, bf16 * __restrict__ y) {
    pdl_wait();
    const int j = blockIdx.y, tile = deal.whole + j, rows_out = SWIGLU ? R / 2 : R, quads = rows_out / 4, n_out = SWIGLU ? n / 2 : n;
    const int q = blockIdx.x * blockDim.x + threadIdx.x;  // R is a multiple of 16
    if (q >= BT * quads) return;
    const int local = 4 * (q % quads), tok = (tile % deal.token_tiles) * BT + q / quads, row = (tile / deal.token_tiles) * rows_out + local;
    if (tok >= m || row >= n_out) return;
    const int stride = BT * R / 4;  // float4 per piece
    const float4 * p = reinterpret_cast<const float4 *>(sums) + size_t(j) * deal.pieces * stride + (q / quads) * (R / 4) + local / 4;
    auto add = [](float4 & a, const float4 & b) {
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
    };
    // Pieces 1-15 asked for at once (SWIGLU: 1-7, both halves), then added in order. (One dependent load a piece: 7B
    // Int4 at m 64 qkv 12.2 -> 11.4 us this way, o_proj 11.9 -> 10.8, down 29.9 -> 28.6; at m 128 qkv 16.6 -> 17.3,
    // the 80 registers leaving three blocks an SM; bench/results/2026-12-01-h200-rs-pieces, call 4.)
    constexpr int k_ahead = SWIGLU ? 7 : 15, halves = SWIGLU ? 2 : 1;
    const int half_offset = R / 8;  // float4s from a gate row's four to its up row's
    float4 sum[halves], v[halves][k_ahead];
#pragma unroll
    for (int h = 0; h < halves; h++) sum[h] = p[h * half_offset];
#pragma unroll
    for (int u = 0; u < k_ahead; u++) {
#pragma unroll
        for (int h = 0; h < halves; h++) {
            if (1 + u < deal.pieces) v[h][u] = p[size_t(1 + u) * stride + h * half_offset];
        }
    }
#pragma unroll
    for (int u = 0; u < k_ahead; u++) {
#pragma unroll
        for (int h = 0; h < halves; h++) {
            if (1 + u < deal.pieces) add(sum[h], v[h][u]);
        }
    }
    for (int z = 1 + k_ahead; z < deal.pieces; z++) {
#pragma unroll
        for (int h = 0; h < halves; h++) add(sum[h], p[size_t(z) * stride + h * half_offset]);
    }
    float e[4] = {sum[0].x, sum[0].y, sum[0].z, sum[0].w};
    if constexpr (SWIGLU) {
        const float u[4] = {sum[halves - 1].x, sum[halves - 1].y, sum[halves - 1].z, sum[halves - 1].w};
#pragma unroll
        for (int i = 0; i < 4; i++) e[i] = silu_mul_rounded(e[i], u[i]);
    }
    bf16 * out = y + size_t(tok) * n_out + row;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (row + i < n_out) out[i] = __float2bfloat16(e[i]);
    }
}

int slots_override = 0;  // set_qgemm_rs_slots
// Rows from which affine codes take tiles of 256 tokens (two consumer warpgroups of m64n256 MMAs, one block an SM).
// 7B Int4 at m 136 / 160 / 192 / 224, 128-token tiles against 256 (us; bench/results/2026-12-02-h200-rs-wide, call 2):
// gate_up 117.3 / 109.8 / 105.8 / 108.0 against 127.6 / 120.2 / 104.6 / 102.7, down 62.9 / 62.1 / 62.1 / 62.4 against
// 74.2 / 63.7 / 59.3 / 56.2, qkv 23.3 / 23.1 / 23.0 / 23.4 against 26.0 / 24.7 / 20.9 / 21.0 (Int8 alike). Lookup
// codes alike: 7B NF4 at m 192 / 256, 128-token tiles against 256, gate_up 125.0 / 126.2 against 104.6 / 103.4 us, qkv
// 26.7 / 27.3 against 22.4 / 23.0, down 71.8 / 72.8 against 56.4 / 58.0 (bench/results/2026-12-02-h200-lut-wide).
constexpr int k_rs_wide_min_m = 192;

// A launch's shape: BT = 8 nt tokens per block (16, 32, 64, 128 or 256; more rows take several token tiles) and how its
// tiles are dealt to blocks, every piece at least four K blocks long:
// - a grid under half a wave of `slots` (blocks resident at once) splits every tile's K into up to a wave
//   (mma4::k_splits);
// - else tiles fill whole waves and those of a last, partial wave are split into as many pieces as fill it: 7B's
//   gate_up at m 128 is 198 tiles of 192 rows on 132 slots, 132 whole tiles and 66 in two halves, where the second
//   wave held 66 whole tiles beside 66 idle SMs (ncu: SMs active 72% of the elapsed cycles); at m 64, 296 tiles of 128
//   rows on 264 slots, 264 whole and 32 in eight pieces. On an H200 (bench/results/2026-12-01-h200-rs-pieces): 7B
//   Int4 gate_up at m 48 / 64 66.7 / 67.6 -> 51.5 / 52.3 us, at m 100 / 128 90.8 / 92.2 -> 83.0 / 85.3; Int8 79.4 /
//   80.1 -> 61.0 / 62.2 and 100.1 / 101.9 -> 90.1 / 92.5; 7B GPTQ-Int4 batch 64 +8.9%, batch 128 +2.3%.
struct Shape {
    int nt;
    Deal deal;
};

Shape shape_for(const QuantMatrix & w, int m, bool swiglu) {
    Shape sh;
    sh.nt = m <= 16 ? 2 : m <= 32 ? 4 : m <= 64 ? 8 : m < k_rs_wide_min_m ? 16 : 32;
    const int token_tiles = (m + 8 * sh.nt - 1) / (8 * sh.nt), tiles = token_tiles * row_tiles(w, sh.nt, swiglu);
    const int64_t slots = int64_t(slots_override > 0 ? slots_override : sm_count()) * reg_blocks(sh.nt);
    const int most = (w.k_padded / 64) / 4;
    int whole, pieces;
    if (2 * int64_t(tiles) < slots) {  // every tile in pieces
        whole = 0;
        pieces = mma4::k_splits(tiles, slots, most);
    } else {  // whole waves whole, the last wave's tiles in pieces
        whole = int(tiles / slots * slots);
        const int last_wave = tiles - whole;
        pieces = last_wave > 0 ? int(std::clamp<int64_t>(slots / last_wave, 1, std::max(1, most))) : 1;
    }
    if (pieces == 1) whole = tiles;
    sh.deal = Deal{token_tiles, tiles, whole, pieces};
    return sh;
}

// Bytes of a shape's piece sums.
size_t piece_bytes(const Shape & sh) {
    const int rows = 16 * consumer_warps(sh.nt);
    return size_t(sh.deal.tiles - sh.deal.whole) * sh.deal.pieces * 8 * sh.nt * rows * sizeof(float);
}

template <int PLANES, bool LUT, int NT>
void launch(const QuantMatrix & w, const bf16 * x, int ldx, int m, bf16 * y, const Deal & deal, bool swiglu, float * partial, cudaStream_t stream) {
    using Sh = RsShape<PLANES, LUT, NT>;
    CUtensorMap x_map;
    if (!cache_tensor_map(&x_map, x, m, ldx, Sh::BT)) QINFER_FAIL() << "qgemm_rs: the tensor map of x [" << m << ", " << ldx << "] was refused";
    CUtensorMap code_map;
    const int half_rb = swiglu ? w.rows_padded / 32 : 0;
    if (!weight_code_tensor_map(&code_map, w.codes, w.rows_padded / 16, w.k_padded / 64, PLANES, swiglu ? Sh::CW / 2 : Sh::CW))
        QINFER_FAIL() << "qgemm_rs: the tensor map of the codes (" << w.rows_padded / 16 << " row blocks x " << w.k_padded / 64 << " K blocks) was refused";
    CUtensorMap y_map{};
    const int tma_store = NT == 32 && !swiglu && cache_tensor_map(&y_map, y, m, w.rows, Sh::BT);
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(qgemm_rs_kernel<PLANES, LUT, NT>, Sh::smem, configured);
    launch_kernel(qgemm_rs_kernel<PLANES, LUT, NT>, dim3(deal.blocks()), dim3(block_threads(NT)), Sh::smem, stream, w, m, y, partial, deal, half_rb, x_map,
                  code_map, y_map, tma_store, RsGroups{});
    CUDA_CHECK(cudaGetLastError());
    if (deal.whole < deal.tiles) {
        const int quads = Sh::BT * 4 * Sh::CW / (swiglu ? 2 : 1);  // BT x 16 CW sums a tile, four a thread (SwiGLU: four of each half)
        launch_kernel(swiglu ? add_pieces_kernel<true> : add_pieces_kernel<false>, dim3((quads + 255) / 256, deal.tiles - deal.whole), dim3(256), 0,
                      stream, static_cast<const float *>(partial), deal, Sh::BT, 16 * Sh::CW, m, w.rows, y);
        CUDA_CHECK(cudaGetLastError());
    }
}

template <int PLANES, bool LUT>
void launch_for(int nt, const QuantMatrix & w, const bf16 * x, int ldx, int m, bf16 * y, const Deal & deal, bool swiglu, float * partial,
                cudaStream_t stream) {
    if (nt == 2) launch<PLANES, LUT, 2>(w, x, ldx, m, y, deal, swiglu, partial, stream);
    else if (nt == 4) launch<PLANES, LUT, 4>(w, x, ldx, m, y, deal, swiglu, partial, stream);
    else if (nt == 8) launch<PLANES, LUT, 8>(w, x, ldx, m, y, deal, swiglu, partial, stream);
    else if (nt == 16) launch<PLANES, LUT, 16>(w, x, ldx, m, y, deal, swiglu, partial, stream);
    else launch<PLANES, LUT, 32>(w, x, ldx, m, y, deal, swiglu, partial, stream);
}

// A grouped launch (moe_qgemm) over x bf16 [x_rows, w.k], the sorted rows: tiles of 128 tokens (NT 16; one routing
// row tile) x 192 rows (96 gate and 96 up rows with SwiGLU), every tile whole. Launched without PDL: its blocks read
// the routing before the producer's pdl_wait.
template <int PLANES>
void launch_grouped(const QuantMatrix & w, const bf16 * x, int x_rows, const RsGroups & grp, int max_tiles, bool swiglu, bf16 * y, cudaStream_t stream) {
    constexpr int NT = 16;
    using Sh = RsShape<PLANES, false, NT>;
    static_assert(Sh::BT == k_moe_qgemm_rows, "a block's tokens are one routing row tile");
    CUtensorMap x_map;
    if (!cache_tensor_map(&x_map, x, x_rows, w.k, Sh::BT)) QINFER_FAIL() << "MoE qgemm: the tensor map of the sorted rows [" << x_rows << ", " << w.k << "] was refused";
    CUtensorMap code_map;
    if (!weight_code_tensor_map(&code_map, w.codes, w.rows_padded / 16, w.k_padded / 64, PLANES, swiglu ? Sh::CW / 2 : Sh::CW))
        QINFER_FAIL() << "MoE qgemm: the tensor map of the codes (" << w.rows_padded / 16 << " row blocks x " << w.k_padded / 64 << " K blocks) was refused";
    const int n_rb = grp.w_rows / 16, half_rb = swiglu ? n_rb / 2 : 0;
    const int row_tiles = swiglu ? (half_rb + Sh::CW / 2 - 1) / (Sh::CW / 2) : (n_rb + Sh::CW - 1) / Sh::CW;
    static PerDevice<size_t> configured;
    allow_dynamic_smem(qgemm_rs_kernel<PLANES, false, NT, true>, Sh::smem, configured);
    const CUtensorMap y_map{};
    qgemm_rs_kernel<PLANES, false, NT, true><<<dim3(max_tiles, row_tiles), block_threads(NT), Sh::smem, stream>>>(w, x_rows, y, nullptr, Deal{1, 1, 1, 1}, half_rb,
                                                                                                            x_map, code_map, y_map, 0, grp);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool moe_qgemm_apply(const MoeQuantExperts & w) { return moe_qexperts_apply(w) && qgemm_rs_applies(w.gate_up) && qgemm_rs_applies(w.down); }

void moe_qgemm(const bf16 * xn, int c, int top_k, const MoeQuantExperts & w, const MoeRouting & r, bf16 * act, bf16 * out, cudaStream_t stream) {
    QINFER_CHECK(moe_qgemm_apply(w)) << "MoE qgemm: the experts' layout or this device does not take the grouped kernel";
    const int rows = c * top_k;
    if (rows <= 0) return;
    // The tensor copies need the sorted rows' inputs contiguous: gathered into `out`, free until down writes it.
    gather_rows(xn, r.token_of, rows, w.hidden, out, stream);
    const int max_tiles = moe_max_tiles(rows, k_moe_qgemm_rows, w.n_experts);
    RsGroups grp{r.offsets, r.tiles, w.n_experts, 2 * w.inter};
    if (w.gate_up.bits == 4) launch_grouped<1>(w.gate_up, out, rows, grp, max_tiles, true, act, stream);
    else launch_grouped<2>(w.gate_up, out, rows, grp, max_tiles, true, act, stream);
    grp.w_rows = w.hidden;
    if (w.down.bits == 4) launch_grouped<1>(w.down, act, rows, grp, max_tiles, false, out, stream);
    else launch_grouped<2>(w.down, act, rows, grp, max_tiles, false, out, stream);
}

bool qgemm_rs_applies(const QuantMatrix & w) { return sm90a_device() && qgemm_mma_applies(w); }

size_t qgemm_rs_scratch_bytes(const QuantMatrix & w, int m) {
    if (!qgemm_rs_applies(w)) return 0;
    size_t pieces = 0;
    for (int mm = 1; mm <= m; mm++) {
        for (bool swiglu : {false, true}) pieces = std::max(pieces, piece_bytes(shape_for(w, mm, swiglu)));
    }
    return mma4::gather_scratch_bytes(w, m) + pieces;
}

bool qgemm_rs(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t scratch_bytes, cudaStream_t stream, bool silu_mul) {
    if (!qgemm_rs_applies(w) || m <= 0) return false;
    if (silu_mul && !(w.rows == w.rows_padded && w.rows % 32 == 0)) return false;  // halves of whole row blocks
    Shape sh = shape_for(w, m, silu_mul);
    const mma4::GemmInput in = mma4::gemm_input(w, x, m, scratch, scratch_bytes, stream);
    if (!in.x) return false;
    float * partial = nullptr;
    if (sh.deal.whole < sh.deal.tiles) {
        partial = mma4::partial_scratch(scratch, scratch_bytes, in.scratch_used, piece_bytes(sh));
        if (!partial) sh.deal = Deal{sh.deal.token_tiles, sh.deal.tiles, sh.deal.tiles, 1};  // no room: every tile whole
    }
    if (w.lut) launch_for<1, true>(sh.nt, w, in.x, in.ldx, m, y, sh.deal, silu_mul, partial, stream);
    else if (w.bits == 4) launch_for<1, false>(sh.nt, w, in.x, in.ldx, m, y, sh.deal, silu_mul, partial, stream);
    else launch_for<2, false>(sh.nt, w, in.x, in.ldx, m, y, sh.deal, silu_mul, partial, stream);
    return true;
}

void set_qgemm_rs_slots(int sms) { slots_override = sms > 0 ? sms : 0; }

}  // namespace qinfer::cuda
