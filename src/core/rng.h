// Deterministic random numbers for synthetic weights: a value depends only on (seed, stream, index), so
// tensors come out the same whatever the order, sharding or thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace qinfer {

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

inline uint64_t hash_string(const std::string & s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a, then mixed
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return splitmix64(h);
}

// Standard normal value number `i` of a stream (Box-Muller on two hashed uniforms).
inline float normal_at(uint64_t stream, uint64_t i) {
    uint64_t a = splitmix64(stream ^ (2 * i)), b = splitmix64(stream ^ (2 * i + 1) ^ 0x5bd1e995ull);
    double u1 = (double(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = double(b >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace qinfer
