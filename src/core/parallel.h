// Thread parallelism for the CPU backend (OpenMP when available).
#pragma once

#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace qinfer {

inline int max_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

inline void set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

// Calls fn(i) for i in [0, n), split statically across threads.
template <typename F> void parallel_for(int64_t n, F && fn) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) fn(i);
}

}  // namespace qinfer
