#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace qinfer {

namespace {
struct DTypeInfo {
    DType type;
    const char * name;
    size_t size;
};
constexpr DTypeInfo k_dtypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::U16, "U16", 2},   {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I32, "I32", 4},   {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},   {DType::F64, "F64", 8},   {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t dtype_size(DType t) { return k_dtypes[size_t(t)].size; }
const char * dtype_name(DType t) { return k_dtypes[size_t(t)].name; }

bool dtype_from_name(std::string_view s, DType * out) {
    for (const auto & d : k_dtypes) {
        if (s == d.name) {
            *out = d.type;
            return true;
        }
    }
    return false;
}

DType dtype_from_torch_name(std::string_view s) {
    if (s == "bfloat16") return DType::BF16;
    if (s == "float16" || s == "half") return DType::F16;
    if (s == "float32" || s == "float") return DType::F32;
    QINFER_FAIL() << "unsupported torch dtype '" << s << "' (expected bfloat16, float16 or float32)";
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return uint16_t(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return uint16_t(sign);
        mant |= 0x800000;
        uint32_t shift = uint32_t(14 - exp);
        uint32_t half = 1u << (shift - 1);
        uint32_t rounded = (mant + half - 1 + ((mant >> shift) & 1)) >> shift;
        return uint16_t(sign | rounded);
    }
    uint32_t rounded = mant + 0xfff + ((mant >> 13) & 1);
    if (rounded & 0x800000) {
        rounded = 0;
        exp++;
        if (exp >= 31) return uint16_t(sign | 0x7c00);
    }
    return uint16_t(sign | (uint32_t(exp) << 10) | (rounded >> 13));
}

uint8_t f32_to_e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < std::ldexp(1.0f, -6)) {
        // Subnormals: q * 2^-9, q in 0..7; q = 8 is the smallest normal (0x08), the same bit pattern.
        return uint8_t(sign | uint8_t(std::nearbyint(a * 512.0f)));
    }
    int e = 0;
    std::frexp(a, &e);
    int exp = e - 1;                                       // a = 1.m * 2^exp, exp in -6..8
    float q = std::nearbyint(std::ldexp(a, 3 - exp));  // 8..16: the leading one and three mantissa bits
    if (q == 16.0f) {
        q = 8.0f;
        exp++;
    }
    if (exp > 8 || (exp == 8 && q > 14.0f)) return sign | 0x7e;
    return uint8_t(sign | ((exp + 7) << 3) | (int(q) - 8));
}

float e4m3_to_f32(uint8_t b) {
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    const int exp = (b >> 3) & 15, mant = b & 7;
    if (exp == 15 && mant == 7) return std::numeric_limits<float>::quiet_NaN();
    if (exp == 0) return sign * std::ldexp(float(mant), -9);
    return sign * std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
}

}  // namespace qinfer
