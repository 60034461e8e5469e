// Element types of checkpoint tensors and their conversions to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace qinfer {

enum class DType : uint8_t {
    BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2,
};

size_t dtype_size(DType t);
const char * dtype_name(DType t);              // safetensors spelling: "BF16"
bool dtype_from_name(std::string_view s, DType * out);
DType dtype_from_torch_name(std::string_view s);  // "bfloat16" -> BF16; throws on unknown

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// fp8 e4m3 ("e4m3fn": no infinities, max 448, NaN = 0x7f/0xff): round to nearest even, saturating at +-448.
uint8_t f32_to_e4m3(float f);
float e4m3_to_f32(uint8_t b);

// Round-trips a float through the type (for tolerances and synthetic weights).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace qinfer
