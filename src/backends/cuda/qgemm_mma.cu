// GEMM for tiled 4- and 8-bit affine weights and 4-bit lookup codes (bitsandbytes NF4 / FP4) at decode-step sizes
// (the rule, qlinear.cpp, gives it 5-64 rows: those of a continuous-batching step; any m works), on mma.sync (sm_80 and
// up): y[m, n] = x[m, k] W^T, weights dequantized in registers, straight from the codes, never written anywhere. The
// arithmetic is the tensor-core GEMV's (qgemv_ring.cuh): each lane's 16 bytes of codes per plane and 64-wide K block
// are its A fragments of four k16 steps, made bf16 pairs q - z exactly (LOP3 into 128 + q, one HSUB2; 8-bit: the
// high plane's 16 (hi - zh) beside it), or for lookup codes each register's pair read from a table of the 256 bf16
// pairs in shared memory by its code byte (mma4::fill_pair_table); the products accumulate in fp32 per quantization
// group and each group's sums are scaled by its fp16 scale (lookup codes: fp32 absmax) in fp32 into the totals.
// Where the GEMV multiplies one B column block of 8 tokens, this kernel multiplies NT of them (BT = 8 NT tokens) with
// each dequantized fragment, so the dequantization is paid once per BT tokens.
//
//   block (token tile, row tile, K split): W warps (8; 6 at up to 32 tokens where that deals the grid more evenly over the
//     SMs: shape_for), warp w owns 16-row block w of the 16 W-row tile and all BT tokens, over the split's K blocks;
//     the per-group sums and totals are 8 NT floats per lane.
//   stages: KPS K blocks at a time, each warp's codes (KPS x 512 bytes per plane: 2 KB, 1 KB for 64 tokens; each warp
//     copies its own) and the block's x tile (BT tokens x 64 KPS) go into shared memory by cp.async, k_stages stages deep, so the
//     bytes in flight do not depend on registers (a first form kept a ring of 4 K blocks of codes in each lane's
//     registers: 7B Int4 gate_up took 50.6 us at m 16, 1.41 TB/s, and 146.7 us at m 64 on an H200, against bf16
//     cuBLASLt's 73.3 / 74.3; bench/results/2026-11-29-h200-qgemm-mma). One block barrier per stage. x's 16-byte
//     chunks are XOR-swizzled by token within each 128-byte K block (chunk c of token r at c ^ (r % 8)), so that
//     each ldmatrix.x4 (B fragments of two 8-token column blocks for one k16 step) reads 8 distinct banks per phase;
//     tokens past m and positions past k arrive as zeros. Group parameters are read from global memory a group ahead.
//   epilogue: bf16 y, or with K split the split's fp32 sums into the scratch, added in split order by
//     mma4::reduce_splits_kernel (deterministic: the same bits on every call). (The splits of a tile as one
//     thread-block cluster adding through distributed shared memory instead, no reduce kernel: 7B GPTQ-Int4 batch 16
//     -10% on an H200; bench/results/2026-12-01-h200-mma-warps.) SwiGLU tiles (silu_mul, K not split):
//     warps 0 .. W / 2 - 1 hold gate row blocks, the others the matching up row blocks, whose sums reach the gate warps
//     through shared memory; y is then SiLU(gate) * up, [m, rows / 2] (7B GPTQ-Int4 batch 16 +3.1% on an H200 against GEMM +
//     silu_mul; bench/results/2026-12-01-h200-norm-ahead).
// Grid: token tiles fastest, so the token tiles of one row tile run together and read its codes from L2.
// Act-order weights, k not a multiple of 8 and unaligned x take x gathered into bf16 [m, k_padded] first (the
// scratch's head), as qgemm_rs does.
#include <algorithm>
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops.h"
#include "backends/cuda/qgemv_mma.cuh"

namespace qinfer::cuda {

namespace {

constexpr int k_stages = 3;  // stages in shared memory

// Blocks of `warps` 16-row blocks over the weight's rows (SwiGLU tiles: half of them from each half, as many).
int row_tiles(const QuantMatrix & w, int warps) { return (w.rows_padded / 16 + warps - 1) / warps; }

// K blocks a stage holds: 16 KB of codes a stage for 8 warps (8 KB for 64 tokens, whose x tile is the larger).
__host__ __device__ constexpr int stage_kbs(int nt, int planes) { return (nt >= 8 ? 2 : 4) / planes; }

// Blocks per SM (the launch bound, and what the shared memory allows): three for 16 tokens (72 KB each for 4-bit
// codes and 8 warps), so that the row blocks of 7B's gate_up (2368 warps' worth) run in one wave; two otherwise, and
// for lookup codes, whose pair table takes 16-32 KB more.
__host__ __device__ constexpr int blocks_per_sm(int nt, bool lut) { return nt <= 2 && !lut ? 3 : 2; }

// A kernel's shape for PLANES planes of codes (LUT: lookup codes, one plane), NT 8-token column blocks and W warps
// (each one 16-row block).
template <int PLANES, bool LUT, int NT, int W> struct MmaShape {
    static constexpr int threads = 32 * W;
    static constexpr int BT = 8 * NT;                           // tokens per block
    static constexpr int KPS = stage_kbs(NT, PLANES);           // K blocks per stage
    static constexpr int TILE = 32 * PLANES;                    // uint4 of codes per row block and K block
    static constexpr int code_chunks = W * KPS * TILE;          // uint4 of codes per stage
    static constexpr int x_chunks = BT * KPS * 8;               // uint4 of x per stage
    static constexpr int stage_chunks = code_chunks + x_chunks;
    static constexpr size_t stages_bytes = size_t(k_stages) * stage_chunks * 16;
    static constexpr int blocks = blocks_per_sm(NT, LUT);
    // Lookup codes: the pair table after the stages (mma4::fill_pair_table), one copy a lane where two blocks still
    // fit an SM, else 16.
    static constexpr int lut_copies = !LUT ? 0 : (stages_bytes + 32 * 1024) * blocks <= 226 * 1024 ? 32 : 16;
    static constexpr size_t smem = stages_bytes + size_t(256) * lut_copies * 4;
    static_assert(smem * blocks <= 228 * 1024 - blocks * 1024, "the blocks fit an SM's shared memory");
};

// ldmatrix.x4: lane l gives the address of row l % 8 of matrix l / 8; register i receives matrix i's fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t & r0, uint32_t & r1, uint32_t & r2, uint32_t & r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// A group's parameters as this lane needs them: rows g (lo) and g + 8 (hi) of its row block.
template <int PLANES> struct GroupParams {
    float s_lo, s_hi;
    uint32_t zz_lo[PLANES], zz_hi[PLANES];  // bf16x2 pairs subtracted from each plane (128 + zl; 2048 + 16 zh)
};

using mma4::RawParams;
using mma4::load_params;

// Lookup codes: the absmax scales the group's fp32 sums (no zero point).
template <int PLANES> __device__ __forceinline__ GroupParams<PLANES> unpack_params(const mma4::LutParams & r) {
    GroupParams<PLANES> p{};
    p.s_lo = r.absmax[0];
    p.s_hi = r.absmax[1];
    return p;
}

template <int PLANES> __device__ __forceinline__ GroupParams<PLANES> unpack_params(const RawParams & r) {
    GroupParams<PLANES> p;
    p.s_lo = __half2float(__ushort_as_half(r.s[0]));
    p.s_hi = __half2float(__ushort_as_half(r.s[1]));
    // 128 + z is exact in bf16 up to 255 (z of 4-bit codes, v1's stored zero + 1 included), so its bits are 0x4300 + z;
    // 8-bit codes subtract their zero's low nibble there and 16 times its high nibble from the high plane.
    const uint32_t low_mask = PLANES == 1 ? 0xFFu : 15u;
    p.zz_lo[0] = (0x4300u + (uint32_t(r.z[0]) & low_mask)) * 0x10001u;
    p.zz_hi[0] = (0x4300u + (uint32_t(r.z[1]) & low_mask)) * 0x10001u;
    if constexpr (PLANES == 2) {
        p.zz_lo[1] = (0x4500u + (uint32_t(r.z[0]) >> 4)) * 0x10001u;  // 2048 + 16 zh
        p.zz_hi[1] = (0x4500u + (uint32_t(r.z[1]) >> 4)) * 0x10001u;
    }
    return p;
}

template <int PLANES, bool LUT, int NT, int W>
__global__ void __launch_bounds__(32 * W, blocks_per_sm(NT, LUT))
    qgemm_mma_kernel(QuantMatrix w, const bf16 * __restrict__ x, int ldx, int m, bf16 * __restrict__ y, float * __restrict__ partial,
                     int half_rb) {
    using Sh = MmaShape<PLANES, LUT, NT, W>;
    constexpr int BT = Sh::BT, KPS = Sh::KPS, TILE = Sh::TILE, threads = Sh::threads, C = Sh::lut_copies;
    static_assert(NT % 2 == 0, "ldmatrix.x4 takes two 8-token column blocks");
    static_assert(!LUT || PLANES == 1, "lookup codes are 4-bit");
    static_assert(W % 2 == 0, "SwiGLU tiles take half the warps each");
    extern __shared__ __align__(128) uint4 smem[];  // [stage][codes: warp, K block, plane, lane | x: token, K block, chunk], table

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int nkb = w.k_padded / 64, n = w.rows, G = w.groups, n_rb = w.rows_padded / 16;
    // K splits begin on even K blocks, so that groups of 128 line up with every split's stages (the fixed-group stages
    // below).
    const int pairs = (nkb + 1) / 2;
    const int kb_begin = 2 * int(int64_t(blockIdx.z) * pairs / gridDim.z), kb_end = min(nkb, 2 * int(int64_t(blockIdx.z + 1) * pairs / gridDim.z));
    const int n_stages = (kb_end - kb_begin + KPS - 1) / KPS;
    // Row blocks: tile t's warps own row blocks W t .. W t + W - 1. SwiGLU tiles (half_rb > 0: the gate half's row
    // blocks): its first W / 2 warps own gate row blocks (W / 2) t .., the others the up row blocks half_rb + (W / 2)
    // t .., both halves cut at half_rb in the last tile.
    const int tok0 = blockIdx.x * BT;
    int rb;
    bool active;
    if (half_rb) {
        const int local = blockIdx.y * (W / 2) + warp % (W / 2);
        active = local < half_rb;
        rb = local + (warp >= W / 2 ? half_rb : 0);
    } else {
        rb = blockIdx.y * W + warp;
        active = rb < n_rb;
    }
    const uint4 * codes = reinterpret_cast<const uint4 *>(w.codes);

    // Each warp copies its own row block's codes (KPS K blocks, contiguous in the tiled layout: n_cc chunks a lane);
    // the block's threads copy x together (n_xc chunks a thread, the last step partly).
    static_assert(KPS * TILE % 32 == 0 && threads % (KPS * 8) == 0);
    constexpr int n_cc = KPS * TILE / 32, x_rows = threads / (KPS * 8), n_xc = (Sh::x_chunks + threads - 1) / threads;
    const uint4 * c_src = codes + (size_t(active ? rb : 0) * nkb + kb_begin) * TILE + lane;
    const int x_r0 = threadIdx.x / (KPS * 8), x_ch = threadIdx.x % (KPS * 8);
    unsigned x_toks_ok = 0;  // bit i: this thread's chunk i is a token of the tile below m
#pragma unroll
    for (int i = 0; i < n_xc; i++) x_toks_ok |= unsigned(x_r0 + i * x_rows < BT && tok0 + x_r0 + i * x_rows < m) << i;
    const bf16 * x_src = x + size_t(min(tok0 + x_r0, m - 1)) * ldx + x_ch * 8;
    // Stage st's codes: this warp's KPS K blocks from kb_begin + st KPS.
    auto load_codes = [&](int st) {
        if (!active) return;
        uint4 * dst = smem + size_t(st % k_stages) * Sh::stage_chunks + warp * (KPS * TILE) + lane;
        const uint4 * src = c_src + size_t(st) * KPS * TILE;
#pragma unroll
        for (int i = 0; i < n_cc; i++) {
            const bool valid = kb_begin + st * KPS + 32 * i / TILE < kb_end;
            cp_async16(dst + 32 * i, valid ? src + 32 * i : codes, valid);
        }
    };
    // Stage st's x: BT tokens x KPS K blocks, chunk low 3 bits XOR-ed with the token.
    auto load_x = [&](int st) {
        uint4 * dst = smem + size_t(st % k_stages) * Sh::stage_chunks + Sh::code_chunks + (x_ch & ~7);
        const int pos = (kb_begin + st * KPS) * 64 + x_ch * 8;
#pragma unroll
        for (int i = 0; i < n_xc; i++) {
            const int tok = x_r0 + i * x_rows;
            if (tok >= BT) break;
            const bool valid = pos < ldx && (x_toks_ok >> i & 1u);
            cp_async16(dst + tok * (KPS * 8) + ((x_ch ^ tok) & 7), valid ? x_src + (size_t(i) * x_rows * ldx + (kb_begin + st * KPS) * 64) : x, valid);
        }
    };
    // The stages whose K blocks all lie inside the split and x's row (all but the last at most) are loaded from
    // pointers advanced a stage at a time, without the per-chunk bounds, modulo and 64-bit index arithmetic of the two
    // loaders above, which load the rest. (Those paths were ~111 of the ~561 instructions a warp took per stage of 7B
    // Int4 gate_up at m 16, ncu; this way gate_up at m 16 / 24 / 32 34.2 / 50.9 / 51.3 -> 32.7 / 48.6 / 48.9 us, down at
    // 24 / 32 27.6 / 27.9 -> 26.6 / 27.0, down at 16 23.6 -> 24.1, qkv / o_proj level; bench/results/2026-12-02-h200-lut-wide,
    // call 5.)
    const int full_stages = max(0, min((kb_end - kb_begin) / KPS, (ldx / 64 - kb_begin) / KPS));
    const uint32_t smem_base = uint32_t(__cvta_generic_to_shared(smem));
    const uint32_t c_dst0 = smem_base + uint32_t(warp * (KPS * TILE) + lane) * 16;
    const uint4 * c_next = c_src;
    const bf16 * x_next[n_xc];
    uint32_t x_dst[n_xc];
    int x_step[n_xc];
    unsigned x_in_tile = 0;  // bit i: this thread's chunk i is a token row of the tile
#pragma unroll
    for (int i = 0; i < n_xc; i++) {
        const int tok = x_r0 + i * x_rows;
        x_in_tile |= unsigned(tok < BT) << i;
        const bool ok = x_toks_ok >> i & 1u;
        x_next[i] = ok ? x_src + (size_t(i) * x_rows * ldx + size_t(kb_begin) * 64) : x;
        x_step[i] = ok ? KPS * 64 : 0;
        x_dst[i] = smem_base + uint32_t(Sh::code_chunks + (x_ch & ~7) + tok * (KPS * 8) + ((x_ch ^ tok) & 7)) * 16;
    }
    auto load_codes_full = [&](int buf) {
        if (!active) return;
        const uint32_t dst = c_dst0 + uint32_t(buf * Sh::stage_chunks) * 16;
#pragma unroll
        for (int i = 0; i < n_cc; i++) cp_async16(dst + 32 * 16 * i, c_next + 32 * i, true);
        c_next += KPS * TILE;
    };
    auto load_x_full = [&](int buf) {
#pragma unroll
        for (int i = 0; i < n_xc; i++) {
            if (!(x_in_tile >> i & 1u)) continue;
            cp_async16(x_dst[i] + uint32_t(buf * Sh::stage_chunks) * 16, x_next[i], x_toks_ok >> i & 1u);
            x_next[i] += x_step[i];
        }
    };
    // The first stages' codes and the first group's parameters do not depend on the kernel ahead.
#pragma unroll
    for (int st = 0; st < k_stages - 1; st++) {
        if (st < full_stages) load_codes_full(st);
        else if (st < n_stages) load_codes(st);
    }
    const int64_t row0 = int64_t(active ? rb : 0) * 16 + g;
    // Groups are multiples of 32 positions (cuda_quant_unsupported): a group starts only at k16 step 0 or 2 of a block.
    int gi = min(kb_begin * 64 / w.group, G - 1);
    int group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;  // first position past the current group
    GroupParams<PLANES> par = unpack_params<PLANES>(mma4::load_group<LUT>(w, row0, gi));
    mma4::GroupRaw<LUT> next = mma4::load_group<LUT>(w, row0, min(gi + 1, G - 1));
    const bool groups64 = w.group % 64 == 0;  // groups start only at a K block's first position
    uint32_t * lut = reinterpret_cast<uint32_t *>(smem + size_t(k_stages) * Sh::stage_chunks);  // LUT: the pair table
    if constexpr (LUT) mma4::fill_pair_table(w.table, lut, C, threads);  // (ready at the first stage's barrier)
    const uint32_t * lut_lane = lut + (LUT ? lane % C : 0);                // this lane's copy of the table

    pdl_wait();  // x comes from the kernel ahead
#pragma unroll
    for (int st = 0; st < k_stages - 1; st++) {
        if (st < full_stages) load_x_full(st);
        else if (st < n_stages) load_x(st);
        cp_async_commit();
    }
    int load_buf = k_stages - 1;  // the buffer of the stage loaded next

    float c[NT][4] = {}, tot[NT][4] = {};
    auto flush = [&]() {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            tot[nt][0] = fmaf(par.s_lo, c[nt][0], tot[nt][0]);
            tot[nt][1] = fmaf(par.s_lo, c[nt][1], tot[nt][1]);
            tot[nt][2] = fmaf(par.s_hi, c[nt][2], tot[nt][2]);
            tot[nt][3] = fmaf(par.s_hi, c[nt][3], tot[nt][3]);
        }
    };
    auto clear = [&]() {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
    };
    auto take_next = [&]() {
        gi++;
        par = unpack_params<PLANES>(next);
        next = mma4::load_group<LUT>(w, row0, min(gi + 1, G - 1));
    };
    auto next_group = [&]() {
        flush();
        clear();
        take_next();
        group_end = gi == G - 1 ? INT_MAX : group_end + w.group;
    };
    // ldmatrix addresses: lane l reads token 16 pair + 8 (l / 16) + l % 8, chunk 2 j + (l / 8) % 2 of k16 step j. Less
    // the stage and K block they are worked out once: a token's low 3 bits are l % 8 in every 16-token pair, so only
    // j's chunk XOR differs. Stages rotate through their buffers. (Against addresses, buffer indices and loader
    // predicates worked out per use: 7B shapes 1-8% faster, SASS main loop 812 -> 782 instructions at 16 tokens;
    // bench/results/2026-11-29-h200-batch1.)
    const int lr = (lane / 16) * 8 + lane % 8, lhalf = (lane / 8) % 2;
    const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(smem));
    uint32_t xoff[4];
#pragma unroll
    for (int j = 0; j < 4; j++) xoff[j] = uint32_t(lr * (KPS * 8) + ((2 * j + lhalf) ^ (lane % 8))) * 16;
    constexpr uint32_t pair_bytes = 16 * (KPS * 8) * 16;  // 16 tokens of x in a stage
    int buf = 0;
    const uint4 * scodes_lane = smem + size_t(warp) * KPS * TILE + lane;
    uint32_t sx = smem0 + uint32_t(Sh::code_chunks * 16);
    // Stage st's top: it is complete and every warp is done with the buffer loaded next, which takes stage
    // st + k_stages - 1.
    auto stage_top = [&](int st) {
        cp_async_wait<k_stages - 2>();
        __syncthreads();
        if (st + k_stages - 1 < full_stages) {
            load_codes_full(load_buf);
            load_x_full(load_buf);
        } else if (st + k_stages - 1 < n_stages) {
            load_codes(st + k_stages - 1);
            load_x(st + k_stages - 1);
        }
        load_buf = load_buf == k_stages - 1 ? 0 : load_buf + 1;
        cp_async_commit();
    };
    auto stage_bottom = [&]() {
        buf = buf == k_stages - 1 ? 0 : buf + 1;
        sx = smem0 + uint32_t((size_t(buf) * Sh::stage_chunks + Sh::code_chunks) * 16);
    };
    // K block kbl of the stage in buffer buf, at position pos0. group_checks: a group may start inside it (checked at
    // j = 0 and 2); fresh: a group starts at it and c holds the last group's sums, already flushed.
    auto k_block = [&](int kbl, int pos0, bool group_checks, bool fresh) {
        const uint4 * scodes = scodes_lane + buf * Sh::stage_chunks;
        uint4 cw[PLANES];
#pragma unroll
        for (int p = 0; p < PLANES; p++) cw[p] = scodes[kbl * TILE + p * 32];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (group_checks && (j == 0 || (j == 2 && !groups64)) && pos0 + 16 * j >= group_end) next_group();
            uint32_t b[NT][2];
#pragma unroll
            for (int pr = 0; pr < NT / 2; pr++) {
                ldmatrix_x4(sx + xoff[j] + uint32_t(kbl * 128) + pr * pair_bytes, b[2 * pr][0], b[2 * pr][1], b[2 * pr + 1][0],
                            b[2 * pr + 1][1]);
            }
            auto multiply = [&](const uint32_t (&fr)[4], bool first) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (first) mma4::mma_bf16_fresh(c[nt], fr, b[nt][0], b[nt][1]);
                    else mma4::mma_bf16(c[nt], fr, b[nt][0], b[nt][1]);
                }
            };
            if constexpr (LUT) {
                const uint32_t word = reinterpret_cast<const uint32_t *>(&cw[0])[j];
                const uint32_t fr[4] = {mma4::lut_pair(lut_lane, C, word, 0), mma4::lut_pair(lut_lane, C, word, 1),
                                        mma4::lut_pair(lut_lane, C, word, 2), mma4::lut_pair(lut_lane, C, word, 3)};
                multiply(fr, fresh && j == 0);
                continue;
            }
            constexpr uint32_t mask = 0x000F000Fu;
#pragma unroll
            for (int p = 0; p < PLANES; p++) {
                const uint32_t magic = p == 0 ? 0x43004300u : 0x45004500u;  // 128, or 2048 (the high plane)
                const uint32_t word = reinterpret_cast<const uint32_t *>(&cw[p])[j];
                const uint32_t fr[4] = {mma4::bf16x2_sub(mma4::lop3_and_or(word, mask, magic), par.zz_lo[p]),
                                        mma4::bf16x2_sub(mma4::lop3_and_or(word >> 4, mask, magic), par.zz_hi[p]),
                                        mma4::bf16x2_sub(mma4::lop3_and_or(word >> 8, mask, magic), par.zz_lo[p]),
                                        mma4::bf16x2_sub(mma4::lop3_and_or(word >> 12, mask, magic), par.zz_hi[p])};
                multiply(fr, fresh && j == 0 && p == 0);
            }
        }
    };
    int st = 0;
    // Groups of GKB whole K blocks (GPTQ / AWQ's 128, bitsandbytes' 64) that tile the stages (K splits begin on even K
    // blocks): in the full stages a group ends at fixed K blocks, so they run without a bounds or group check, as
    // straight-line code from barrier to barrier; a group's first k16 step starts its sums from zero. The checked loop
    // below takes the tail and other group sizes. (Against ec03430's kernel, the checked loop for every stage, in a
    // build that differed only in taking 112 registers, which keeps the two blocks an SM of 24-32 tokens and of lookup
    // codes: 7B Int4 at m 24 / 32 gate_up 48.6 / 48.9 -> 43.5 / 43.9 us, down 26.6 / 26.8 -> 24.5 / 24.7; NF4 gate_up
    // at m 16 56.7 -> 37.8; Int8 gate_up at 16-32 3-5% slower, down 3% faster; bench/results/2026-12-02-h200-mma-fixed,
    // call 2.)
    constexpr int GKB = LUT ? 1 : 2;
    if (KPS % GKB == 0 && w.group == 64 * GKB) {
        for (; st < full_stages; st++) {
            stage_top(st);
            if (active) {
#pragma unroll
                for (int kbl = 0; kbl < KPS; kbl++) {
                    k_block(kbl, 0, false, kbl % GKB == 0);
                    if (kbl % GKB == GKB - 1) {
                        flush();
                        take_next();
                    }
                }
            }
            stage_bottom();
        }
        // The tail (checked) starts at group gi's first position, c cleared.
        clear();
        group_end = gi == G - 1 ? INT_MAX : (gi + 1) * w.group;
    }
    for (; st < n_stages; st++) {
        stage_top(st);
        if (active) {
            int kb = kb_begin + st * KPS;
#pragma unroll
            for (int kbl = 0; kbl < KPS; kbl++, kb++) {
                if (kb >= kb_end) break;
                k_block(kbl, kb * 64, true, false);
            }
        }
        stage_bottom();
    }
    cp_async_wait<0>();
    if (half_rb) {  // SwiGLU: the up warps hand their sums to the gate warps through the stages' shared memory
        flush();
        __syncthreads();  // every warp is done with the stages
        float * up = reinterpret_cast<float *>(smem) + size_t(warp % (W / 2)) * NT * 4 * 32 + lane;  // [gate warp][nt][i][lane]
        if (warp >= W / 2 && active) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) up[(nt * 4 + i) * 32] = tot[nt][i];
            }
        }
        __syncthreads();
        if (warp >= W / 2 || !active) return;
        const int inter = n / 2;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = rb * 16 + g + (i >= 2 ? 8 : 0), tok = tok0 + 8 * nt + 2 * t + (i & 1);
                if (row >= inter || tok >= m) continue;
                y[size_t(tok) * inter + row] = __float2bfloat16(silu_mul_rounded(tot[nt][i], up[(nt * 4 + i) * 32]));
            }
        }
        return;
    }
    if (!active) return;
    flush();

    // Lane (g, t) holds rows g, g + 8 and tokens 2t, 2t + 1 of each 8-token column block.
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = rb * 16 + g + (i >= 2 ? 8 : 0), tok = tok0 + 8 * nt + 2 * t + (i & 1);
            if (row >= n || tok >= m) continue;
            if (partial) partial[(size_t(blockIdx.z) * m + tok) * n + row] = tot[nt][i];
            else y[size_t(tok) * n + row] = __float2bfloat16(tot[nt][i]);
        }
    }
}

// A launch's shape: BT tokens per block (16, 32 or 64), warps per block (8, or 6 at up to 32 tokens where that spreads
// the grid more evenly over the SMs) and the K splits (mma4::k_splits), each split at least two stages long.
struct Shape {
    int nt, warps, splits;
};

int warps_override = 0;  // set_qgemm_mma_warps

// 8-token column blocks per block for m tokens.
int nt_for(int m) { return m <= 16 ? 2 : m <= 32 ? 4 : 8; }

Shape shape_with(const QuantMatrix & w, int m, int nt, int warps) {
    Shape sh{nt, warps, 1};
    const int kps = stage_kbs(nt, w.bits / 4);
    const int64_t blocks = int64_t((m + 8 * nt - 1) / (8 * nt)) * row_tiles(w, warps);
    sh.splits = mma4::k_splits(blocks, int64_t(sm_count()) * blocks_per_sm(nt, w.lut), (w.k_padded / 64) / (2 * kps));
    return sh;
}

// Warp-K blocks of the busiest SM, the grid dealt round the SMs: what sets a launch's time where every SM issues
// at the same pace. (ncu of 7B Int4 gate_up at 16 tokens in 296 blocks of 8 warps: SMs active 72% of the elapsed
// cycles, the 32 of three blocks last. In 395 blocks of 6 warps, three on every SM but one: 41.0 -> 35.9 us, 7B
// GPTQ-Int4 batch 16 +1.9% on an H200; bench/results/2026-12-01-h200-mma-warps. At 32 tokens, two blocks an SM, the
// same rule: 7B Int4 gate_up with SwiGLU 56.6 -> 51.1 us, batch 32 +2.0%; bench/results/2026-12-01-h200-rs-pieces.)
int64_t busiest_sm(const QuantMatrix & w, int m, const Shape & sh) {
    const int64_t blocks = int64_t((m + 8 * sh.nt - 1) / (8 * sh.nt)) * row_tiles(w, sh.warps) * sh.splits;
    const int nkb = w.k_padded / 64;
    return (blocks + sm_count() - 1) / sm_count() * sh.warps * ((nkb + sh.splits - 1) / sh.splits);
}

Shape shape_for(const QuantMatrix & w, int m) {
    const int nt = nt_for(m);
    const Shape eight = shape_with(w, m, nt, 8);
    if (nt > 4) return eight;
    const Shape six = shape_with(w, m, nt, 6);
    if (warps_override) return warps_override == 6 ? six : eight;
    return busiest_sm(w, m, six) < busiest_sm(w, m, eight) ? six : eight;
}

// y = x W^T (SwiGLU tiles where half_rb > 0) in blocks of W warps, K split `splits` ways.
template <int PLANES, bool LUT, int NT, int W>
bool run_with(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, int splits, int half_rb, void * scratch, size_t scratch_bytes,
              cudaStream_t stream) {
    using Sh = MmaShape<PLANES, LUT, NT, W>;
    auto kernel = qgemm_mma_kernel<PLANES, LUT, NT, W>;
    static PerDevice<size_t> configured;  // once per instantiation
    allow_dynamic_smem(kernel, Sh::smem, configured);
    return mma4::run_split_gemm(w, x, m, y, splits, scratch, scratch_bytes, stream, [&](const bf16 * xin, int ldx, int s, float * partial) {
        const dim3 grid((m + Sh::BT - 1) / Sh::BT, row_tiles(w, W), s);
        launch_kernel(kernel, grid, dim3(Sh::threads), Sh::smem, stream, w, xin, ldx, m, y, partial, half_rb);
    });
}

template <int PLANES, bool LUT, int NT>
bool run(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, const Shape & sh, int half_rb, void * scratch, size_t scratch_bytes,
         cudaStream_t stream) {
    if constexpr (NT <= 4) {
        if (sh.warps == 6) return run_with<PLANES, LUT, NT, 6>(w, x, m, y, sh.splits, half_rb, scratch, scratch_bytes, stream);
    }
    return run_with<PLANES, LUT, NT, 8>(w, x, m, y, sh.splits, half_rb, scratch, scratch_bytes, stream);
}

template <int PLANES, bool LUT>
bool run_for(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, const Shape & sh, int half_rb, void * scratch, size_t scratch_bytes,
             cudaStream_t stream) {
    if (sh.nt == 2) return run<PLANES, LUT, 2>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
    if (sh.nt == 4) return run<PLANES, LUT, 4>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
    return run<PLANES, LUT, 8>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
}

}  // namespace

bool qgemm_mma_applies(const QuantMatrix & w) { return w.tiled && (w.bits == 4 || (w.bits == 8 && !w.lut)) && w.group > 0; }

size_t qgemm_mma_scratch_bytes(const QuantMatrix & w, int m) {
    if (!qgemm_mma_applies(w)) return 0;
    // Either warp count's splits (set_qgemm_mma_warps may pick the other one).
    return mma4::split_gemm_scratch_bytes(w, m, [&](int mm) {
        const int nt = nt_for(mm);
        return std::max(shape_with(w, mm, nt, 6).splits, shape_with(w, mm, nt, 8).splits);
    });
}

bool qgemm_mma(const QuantMatrix & w, const bf16 * x, int m, bf16 * y, void * scratch, size_t scratch_bytes, cudaStream_t stream,
               bool silu_mul) {
    if (!qgemm_mma_applies(w) || m <= 0) return false;
    const Shape sh = shape_for(w, m);
    // SwiGLU tiles: half of each tile's row blocks from each half of the stacked weight, K whole.
    const bool tiles_fit = w.rows == w.rows_padded && w.rows % 32 == 0;
    if (silu_mul && !(tiles_fit && sh.splits == 1)) return false;
    const int half_rb = silu_mul ? w.rows / 32 : 0;
    if (w.lut) return run_for<1, true>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
    if (w.bits == 4) return run_for<1, false>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
    return run_for<2, false>(w, x, m, y, sh, half_rb, scratch, scratch_bytes, stream);
}

void set_qgemm_mma_warps(int warps) { warps_override = warps == 6 || warps == 8 ? warps : 0; }

}  // namespace qinfer::cuda
