// Throwaway timing of repack_quant (not committed): best of 3 per case.
#include <chrono>
#include <cstdio>
#include "model/quant_repack.h"
#include "unit/quant_helpers.h"
using namespace qinfer;
using namespace qinfer::test;
int main() {
    struct C { const char * name; QuantScheme s; int n, k; };
    const C cases[] = {{"gptq4 g128 n8192 k3584", gptq_scheme(4, 128, true, QuantPacking::GptqV1), 8192, 3584},
                       {"gptq4 g128 n3584 k18944", gptq_scheme(4, 128, false, QuantPacking::GptqV2), 3584, 18944},
                       {"gptq4 act n4096 k3584", gptq_scheme(4, 128, true, QuantPacking::GptqV1, true), 4096, 3584},
                       {"awq g128 n8192 k3584", gptq_scheme(4, 128, false, QuantPacking::AwqGemm), 8192, 3584},
                       {"gptq8 g128 n8192 k3584", gptq_scheme(8, 128, true, QuantPacking::GptqV1), 8192, 3584},
                       {"nf4 n8192 k3584", bnb_scheme(QuantPacking::Nf4, false), 8192, 3584}};
    for (const C & c : cases) {
        auto ql = make_quant_linear(c.s, c.n, c.k, 1);
        double best = 1e9;
        uint64_t sum = 0;
        for (int rep = 0; rep < 3; rep++) {
            const auto t0 = std::chrono::steady_clock::now();
            RepackedQuant r = repack_quant({&ql->l}, true);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            for (size_t i = 0; i < r.codes.size(); i += 4097) sum += r.codes[i];
        }
        std::printf("%-28s %8.1f ms  (%.1f Mcodes/s)  check %llu\n", c.name, best * 1e3, double(c.n) * c.k / best / 1e6, (unsigned long long)sum);
    }
}
