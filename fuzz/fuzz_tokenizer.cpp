// libFuzzer target: the tokenizer on arbitrary bytes. Encoding must succeed (invalid UTF-8 read as U+FFFD) or
// throw qinfer::Error in strict mode; decoding arbitrary ids, in one piece or streamed, must give valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/check.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static std::unique_ptr<qinfer::Tokenizer> tok = qinfer::Tokenizer::load_dir(QINFER_ASSETS_DIR "/tokenizers/qwen3-tokenizer");
    const std::string text(reinterpret_cast<const char *>(data), size);
    std::vector<int> ids = tok->encode(text, qinfer::Tokenizer::Invalid::Replace);
    try {
        tok->encode(text);
    } catch (const qinfer::Error &) {
    }
    // The same bytes read as ids.
    std::vector<int> raw;
    for (size_t i = 0; i + 3 <= size; i += 3) raw.push_back(int((data[i] | data[i + 1] << 8 | data[i + 2] << 16) % tok->size()));
    for (const auto & seq : {ids, raw}) {
        const std::string once = tok->decode(seq, size % 2 == 0);
        if (qinfer::utf8_replace_invalid(once) != once) __builtin_trap();
        qinfer::Tokenizer::Stream stream(*tok, size % 2 == 0);
        std::string streamed;
        for (int id : seq) streamed += stream.push(id);
        streamed += stream.flush();
        if (qinfer::utf8_replace_invalid(streamed) != streamed) __builtin_trap();
    }
    return 0;
}
