// libFuzzer target: tokenizer.json parsing (vocab, merges, added tokens, split pattern) on arbitrary bytes. Any input
// must give a tokenizer or throw qinfer::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    try {
        auto t = qinfer::Tokenizer::parse(std::string(reinterpret_cast<const char *>(data), size), "fuzz");
        t->decode({0});
    } catch (const qinfer::Error &) {
    }
    return 0;
}
