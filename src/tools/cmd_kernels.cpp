// qinfer bench --kernels: the quantized projections' kernels against bf16 on the same shapes (the GEMV for
// k_dense_gemv_max_m rows, cuBLASLt beyond: what the engine runs for bf16 weights), for each projection of a model's layer
// and each number of rows m. Every path a quantized shape can take is timed (the GEMV, the register-dequantizing
// GEMMs on mma.sync and on wgmma, dequantize + cuBLASLt) and the one cuda::quant_path picks is marked, so one run both
// measures the engine and shows where its rule should change. Those take plain bf16 in and out; "step gemv" is the
// quantized GEMV as the decode step runs it (RMSNorm staged in the kernel for qkv / gate_up, SiLU * up, residual
// added for o_proj / down): launch rules for the decode step are judged on it (a K-parts rule chosen on the plain
// form sped the table but not the rows, bench/results/2026-11-30-h200x2-tp-window). Weights are random codes in the
// kernels' layout (speed does not depend on the values, the checkpoint format only through bits and zero points),
// cycled through copies of at least 256 MB so that no call finds its weights in L2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/sysinfo.h"

#ifdef QINFER_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/ops.h"
#include "model/quant_repack.h"
#include "model/random_weights.h"
#include "model/qwen_cuda.h"
#endif

namespace qinfer {

#ifdef QINFER_CUDA
namespace {

using json = nlohmann::json;
using cuda::bf16;
using cuda::DeviceBuffer;

struct ProjShape {
    const char * model;
    const char * name;
    int n, k;
};

// The layer projections of Qwen2.5-7B and -0.5B (q/k/v and gate/up stacked as the engine stacks them), and of
// Qwen2.5-72B whole (72b) and as one rank of `--tp 2` holds it (72b-tp2: half the heads and intermediate columns), of
// Qwen2.5-32B and of Llama-3.1-8B (llama-8b).
const ProjShape k_shapes[] = {{"7b", "qkv", 4608, 3584},        {"7b", "o_proj", 3584, 3584},      {"7b", "gate_up", 37888, 3584},
                              {"7b", "down", 3584, 18944},      {"0.5b", "qkv", 1152, 896},        {"0.5b", "o_proj", 896, 896},
                              {"0.5b", "gate_up", 9728, 896},   {"0.5b", "down", 896, 4864},       {"72b", "qkv", 10240, 8192},
                              {"72b", "o_proj", 8192, 8192},    {"72b", "gate_up", 59136, 8192},   {"72b", "down", 8192, 29568},
                              {"72b-tp2", "qkv", 5120, 8192},   {"72b-tp2", "o_proj", 8192, 4096}, {"72b-tp2", "gate_up", 29568, 8192},
                              {"72b-tp2", "down", 8192, 14784}, {"32b", "qkv", 7168, 5120},        {"32b", "o_proj", 5120, 5120},
                              {"32b", "gate_up", 55296, 5120},  {"32b", "down", 5120, 27648},      {"llama-8b", "qkv", 6144, 4096},
                              {"llama-8b", "o_proj", 4096, 4096}, {"llama-8b", "gate_up", 28672, 4096}, {"llama-8b", "down", 4096, 14336}};

struct Format {
    const char * name;
    int bits;
    bool zeros;  // a zero point per group (GPTQ asym, AWQ); else the constant 2^(bits-1) (GPTQ sym)
    bool lut;    // bitsandbytes lookup codes: NF4's table, an fp32 absmax per 64 positions
};
const Format k_formats[] = {{"int4-g128", 4, true, false}, {"int8-g128", 8, false, false}, {"nf4", 4, false, true}};

// Random codes and group parameters in the tile layout (model/quant_repack.h) of an [n, k] weight: affine codes in
// groups of 128, lookup codes in bitsandbytes' blocks of 64.
RepackedQuant random_tiled(int n, int k, const Format & f, uint64_t seed) {
    RepackedQuant r;
    r.rows = n;
    r.k = k;
    r.bits = f.bits;
    r.lut = f.lut;
    r.group = f.lut ? 64 : 128;
    r.groups = (k + r.group - 1) / r.group;
    r.tiled = true;
    r.rows_padded = (n + 15) / 16 * 16;
    r.k_padded = (k + 63) / 64 * 64;
    r.codes.resize(size_t(r.rows_padded) * r.k_padded * f.bits / 32);
    for (size_t i = 0; i < r.codes.size(); i++) r.codes[i] = uint32_t(splitmix64(seed + i));
    if (f.lut) {
        r.table.assign(bnb_code_table(QuantPacking::Nf4), bnb_code_table(QuantPacking::Nf4) + 16);
        r.absmax.resize(size_t(r.rows_padded) * r.groups);
        for (size_t i = 0; i < r.absmax.size(); i++) r.absmax[i] = 0.01f + 0.01f * float(splitmix64(seed ^ (i * 31 + 7)) % 1024) / 1024.0f;
        return r;
    }
    r.scales.resize(size_t(r.rows_padded) * r.groups);
    for (size_t i = 0; i < r.scales.size(); i++) r.scales[i] = uint16_t(0x2000 + splitmix64(seed ^ (i * 31 + 7)) % 0x400);  // fp16 ~0.008-0.016
    r.const_zero = 1 << (f.bits - 1);
    if (f.zeros) {
        r.zeros.resize(r.scales.size());
        for (size_t i = 0; i < r.zeros.size(); i++) r.zeros[i] = uint8_t(splitmix64(seed ^ (i * 17 + 3)) % (1u << f.bits));
    }
    return r;
}

// count bf16 values on the device, normal with standard deviation `std` (fill_random's values of `stream`).
DeviceBuffer random_bf16(size_t count, float std, uint64_t stream) {
    std::vector<uint8_t> host(count * sizeof(bf16));
    fill_random(stream, {0.0f, std}, DType::BF16, host.data(), host.size());
    DeviceBuffer d(host.size(), "bench");
    CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
    return d;
}

// Mean microseconds of fn() over `reps` calls after `warmup`.
template <class F> double time_us(int reps, int warmup, F && fn) {
    for (int i = 0; i < warmup; i++) fn();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) fn();
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return 1e3 * double(ms) / reps;
}

// Copies of `bytes` at `src` (device) back to back, at least `total` bytes in all; returns how many.
int replicate(DeviceBuffer & dst, const void * src, size_t bytes, size_t total, const char * what) {
    const int copies = int(std::max<size_t>(1, (total + bytes - 1) / bytes));
    dst = DeviceBuffer(bytes * copies, what);
    for (int c = 0; c < copies; c++) CUDA_CHECK(cudaMemcpy(dst.as<char>() + size_t(c) * bytes, src, bytes, cudaMemcpyDeviceToDevice));
    return copies;
}

int run_kernels(const Args & a) {
    const std::vector<int> ms = a.has("m") ? a.int_list("m") : std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    const std::string models = a.str("models", "7b,0.5b"), formats = a.str("formats", "int4-g128,int8-g128");
    const std::string projs = a.str("projs", "qkv,o_proj,gate_up,down");
    const int reps = int(a.integer("reps", 50));
    const std::string json_path = a.str("json");
    a.check_unused();
    for (int m : ms) {
        if (m < 1 || m > 16384) QINFER_FAIL() << "--m entries must be in 1..16384, got " << m;
    }
    if (reps < 1) QINFER_FAIL() << "--reps must be >= 1";
    auto listed = [](const std::string & list, const std::string & item) { return ("," + list + ",").find("," + item + ",") != std::string::npos; };
    // Every entry of a name list names something (a typo would otherwise print an empty table).
    auto check_names = [](const char * flag, const std::string & list, const std::vector<std::string> & known) {
        size_t at = 0;
        while (at <= list.size()) {
            const size_t end = std::min(list.find(',', at), list.size());
            const std::string name = list.substr(at, end - at);
            if (std::find(known.begin(), known.end(), name) == known.end()) {
                std::string all;
                for (const std::string & k : known) all += (all.empty() ? "" : ", ") + k;
                QINFER_FAIL() << "--" << flag << ": unknown entry '" << name << "' (known: " << all << ")";
            }
            at = end + 1;
        }
    };
    std::vector<std::string> known_models, known_projs, known_formats;
    for (const ProjShape & sh : k_shapes) {
        if (std::find(known_models.begin(), known_models.end(), sh.model) == known_models.end()) known_models.push_back(sh.model);
        if (std::find(known_projs.begin(), known_projs.end(), sh.name) == known_projs.end()) known_projs.push_back(sh.name);
    }
    for (const Format & f : k_formats) known_formats.push_back(f.name);
    check_names("models", models, known_models);
    check_names("projs", projs, known_projs);
    check_names("formats", formats, known_formats);
    cuda::set_pdl_default(true);  // as the engine launches
    const SystemInfo sys = system_info(true);
    const size_t k_cycle = size_t(256) << 20;
    const int max_m = *std::max_element(ms.begin(), ms.end());
    json rows = json::array();
    std::printf("card: %s, commit %s; weights cycled over >= 256 MB; times are means of %d calls\n\n", sys.card.c_str(), git_commit().c_str(), reps);
    std::printf("| model | proj | n x k | format | m | bf16 us | step gemv | gemv | mma | wgmma-rs | dequant+cublaslt | rule | us | weight TB/s | TFLOP/s | x bf16 |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const ProjShape & sh : k_shapes) {
        if (!listed(models, sh.model) || !listed(projs, sh.name)) continue;
        // bf16 weights of this shape, cycled, and the inputs.
        const size_t w_bytes = size_t(sh.n) * sh.k * sizeof(bf16);
        DeviceBuffer w_all;
        const int w_copies = replicate(w_all, random_bf16(size_t(sh.n) * sh.k, 1.0f / std::sqrt(float(sh.k)), 1).get(), w_bytes, k_cycle, "bench");
        DeviceBuffer x = random_bf16(size_t(max_m) * sh.k, 1.0f, 2), y(size_t(max_m) * sh.n * sizeof(float), "bench");
        // The decode step's form of this projection (its GEMV with the engine's input and output): qkv and gate_up
        // from the fp32 residual with RMSNorm staged in the kernel (gate_up with SiLU * up), o_proj and down added
        // into the fp32 residual.
        const bool normed = std::string(sh.name) == "qkv" || std::string(sh.name) == "gate_up";
        const bool swiglu = std::string(sh.name) == "gate_up";
        const cuda::GemvIn step_in = normed ? cuda::GemvIn::NormF32 : cuda::GemvIn::Bf16;
        const cuda::GemvOut step_out = swiglu ? cuda::GemvOut::SiluMulBf16 : normed ? cuda::GemvOut::Bf16 : cuda::GemvOut::AddF32;
        DeviceBuffer residual(size_t(max_m) * sh.k * sizeof(float), "bench"), norm_w = random_bf16(size_t(sh.k), 0.1f, 3);
        CUDA_CHECK(cudaMemset(residual.get(), 0, residual.bytes()));
        for (const Format & f : k_formats) {
            if (!listed(formats, f.name)) continue;
            cuda_engine::DevLinear q = cuda_engine::upload_repacked(random_tiled(sh.n, sh.k, f, 1234));
            const size_t code_bytes = q.codes.bytes();
            DeviceBuffer codes_all;
            const int q_copies = replicate(codes_all, q.codes.get(), code_bytes, k_cycle, "bench");
            const double q_bytes = double(code_bytes + q.scales.bytes() + q.zeros.bytes() + q.absmax.bytes());
            DeviceBuffer gemv_scratch(cuda::qgemv_scratch_bytes(q.q.k_padded, cuda::k_qgemv_max_m), "bench");
            size_t scratch_bytes = size_t(sh.n) * sh.k * sizeof(bf16);  // room for every path
            scratch_bytes = std::max({scratch_bytes, cuda::qgemm_mma_scratch_bytes(q.q, max_m), cuda::qgemm_rs_scratch_bytes(q.q, max_m)});
            DeviceBuffer scratch(scratch_bytes, "bench");
            for (int m : ms) {
                int call = 0;
                const double bf16_us = time_us(reps, 3, [&] {
                    const bf16 * wp = reinterpret_cast<const bf16 *>(w_all.as<char>() + size_t(call++ % w_copies) * w_bytes);
                    if (m <= cuda_engine::k_dense_gemv_max_m) {
                        cuda::GemvArgs g;
                        g.w = wp;
                        g.n = sh.n;
                        g.k = sh.k;
                        g.x = x.get();
                        g.m = m;
                        g.y = y.get();
                        cuda::gemv(g, cuda::GemvIn::Bf16, cuda::GemvOut::Bf16, nullptr);
                    } else {
                        cuda::gemm(x.as<bf16>(), wp, m, sh.n, sh.k, y.get(), false, nullptr);
                    }
                });
                const cuda::QuantPath rule = cuda::quant_path(q.q, m);
                json row = {{"model", sh.model}, {"proj", sh.name}, {"n", sh.n}, {"k", sh.k}, {"format", f.name}, {"m", m},
                            {"bf16_us", bf16_us}, {"rule", cuda::quant_path_name(rule)}};
                char step_cell[32] = "-";
                if (m <= cuda::k_qgemv_max_m) {
                    cuda::QuantMatrix qm = q.q;
                    cuda::GemvArgs g;
                    g.n = swiglu ? sh.n / 2 : sh.n;
                    g.k = sh.k;
                    g.x = normed ? residual.get() : x.get();
                    g.m = m;
                    g.norm_w = norm_w.as<bf16>();
                    g.y = y.get();
                    const double us = time_us(reps, 3, [&] {
                        qm.codes = reinterpret_cast<const uint32_t *>(codes_all.as<char>() + size_t(call++ % q_copies) * code_bytes);
                        cuda::qgemv(qm, g, step_in, step_out, gemv_scratch.get(), nullptr);
                    });
                    std::snprintf(step_cell, sizeof step_cell, "%.1f", us);
                    row["step_gemv_us"] = us;
                }
                std::string cells = std::string(step_cell) + " | ";
                double rule_us = 0;
                for (cuda::QuantPath p : {cuda::QuantPath::Gemv, cuda::QuantPath::Mma, cuda::QuantPath::Rs, cuda::QuantPath::Dequantize}) {
                    cuda::QuantMatrix qm = q.q;
                    bool ok = true;
                    const double us = time_us(reps, 3, [&] {
                        qm.codes = reinterpret_cast<const uint32_t *>(codes_all.as<char>() + size_t(call++ % q_copies) * code_bytes);
                        ok = ok && cuda::quant_linear(p, qm, x.as<bf16>(), m, y.as<bf16>(), gemv_scratch.get(), scratch.get(), scratch.bytes(), nullptr);
                    });
                    // A path that does not apply launched nothing: no time.
                    char cell[32] = "-";
                    if (ok) std::snprintf(cell, sizeof cell, "%.1f", us);
                    cells += std::string(cell) + " | ";
                    if (ok) row[std::string(cuda::quant_path_name(p)) + "_us"] = us;
                    if (p == rule) rule_us = us;
                }
                const double tbs = q_bytes / rule_us / 1e6, tflops = 2.0 * m * sh.n * sh.k / rule_us / 1e6;
                row["rule_us"] = rule_us;
                row["weight_tb_s"] = tbs;
                row["tflop_s"] = tflops;
                row["speedup_vs_bf16"] = bf16_us / rule_us;
                rows.push_back(row);
                std::printf("| %s | %s | %d x %d | %s | %d | %.1f | %s%s | %.1f | %.2f | %.1f | %.2fx |\n", sh.model, sh.name, sh.n, sh.k, f.name, m,
                            bf16_us, cells.c_str(), cuda::quant_path_name(rule), rule_us, tbs, tflops, bf16_us / rule_us);
                std::fflush(stdout);
            }
        }
    }
    std::printf("\nbf16: the GEMV up to %d rows, cuBLASLt beyond (the engine's bf16 path). step gemv: the quantized GEMV as the\n"
                "decode step runs it (qkv / gate_up normalising the fp32 residual in the kernel, gate_up with SiLU * up, o_proj /\n"
                "down adding into the residual); the other columns take plain bf16 in and out. weight TB/s: codes, scales and\n"
                "zeros (or absmax) of the rule's path per call; x bf16: the bf16 time over the rule's.\n",
                cuda_engine::k_dense_gemv_max_m);
    write_json_output(json_path,
                      json{{"card", sys.card}, {"driver", sys.driver}, {"cuda", sys.cuda}, {"commit", git_commit()}, {"reps", reps}, {"rows", rows}});
    return 0;
}

}  // namespace
#endif

int cmd_bench_kernels(int argc, char ** argv) {
#ifdef QINFER_CUDA
    int (*run)(const Args &) = run_kernels;
#else
    int (*run)(const Args &) = nullptr;
#endif
    return gpu_bench_mode(argc, argv, "kernels",
                          "usage: qinfer bench --kernels [--models 7b,0.5b (also 72b, 72b-tp2, 32b, llama-8b)] [--formats int4-g128,int8-g128 (also nf4)]\n"
                          "                            [--projs qkv,o_proj,gate_up,down]\n"
                          "                            [--m 1,2,4,...,512] [--reps 50] [--json FILE]\n"
                          "Times each quantized projection kernel (GEMV, mma GEMM, wgmma-rs GEMM, dequantize + cuBLASLt) of Qwen2.5's\n"
                          "layer shapes (and Llama-3.1-8B's) against bf16 weights of the same shape, for each m; marks the one the engine picks. GPU only.\n",
                          run);
}

}  // namespace qinfer
