// libFuzzer target: the safetensors header parser on arbitrary bytes. Any input must either parse or throw
// qinfer::Error; crashes, hangs and sanitizer reports are bugs.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    try {
        qinfer::SafetensorsHeader h = qinfer::parse_safetensors(data, size, "fuzz");
        for (const auto & t : h.tensors) {
            // Every accepted tensor lies inside the input.
            if (h.data_start + t.end > size) __builtin_trap();
        }
    } catch (const qinfer::Error &) {
    }
    return 0;
}
