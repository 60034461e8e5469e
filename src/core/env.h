// Environment variables that select kernels or tune them (QINFER_*): read once by each caller into a static.
#pragma once

#include <cstdlib>
#include <cstring>

namespace qinfer {

// True when the variable is set to exactly `value`.
inline bool env_is(const char * name, const char * value) {
    const char * e = std::getenv(name);
    return e && std::strcmp(e, value) == 0;
}

// A three-way switch: 1 when the variable is "1", 0 when it is "0", else -1 (the caller's default rule).
inline int env_mode(const char * name) { return env_is(name, "1") ? 1 : env_is(name, "0") ? 0 : -1; }

// The variable as an integer (atoi), or `fallback` when it is unset.
inline int env_int(const char * name, int fallback) {
    const char * e = std::getenv(name);
    return e ? std::atoi(e) : fallback;
}

}  // namespace qinfer
