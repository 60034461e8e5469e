#!/usr/bin/env bash
# Builds qinfer and runs every test: unit and golden tests (ctest), bad-input checks through the binary, and the
# fuzz targets for a bounded time (FUZZ_SECONDS each, default 60). CUDA kernel tests run when a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")

# Every unit and model test again under AddressSanitizer, LeakSanitizer and UBSan (~30 s of tests on two cores): the
# scheduler's soak with cancellations and preemptions from four threads, the server's concurrency and overload tests,
# the CPU's tensor parallel (ranks in threads), the quantized repack (whose code packing this build once caught
# reading a shift before it was set) and the checkpoint loaders (a misaligned float load of a bitsandbytes table).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQINFER_CUDA=OFF -DQINFER_NATIVE=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" >/dev/null
cmake --build build-asan -j"$(nproc)" --target qinfer_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 OMP_NUM_THREADS=2 \
    build-asan/tests/qinfer_tests --gtest_brief=1
echo "sanitizers: every unit and model test clean"

# The tokenizer on megabytes of real text against the reference implementation (npm package, node).
bash scripts/tokenizer_check.sh build/qinfer

# Fuzzing: a separate clang build with sanitizers; the committed corpus is copied, never modified.
fuzz_seconds=${FUZZ_SECONDS:-60}
cmake -S . -B build-fuzz -G Ninja -DQINFER_FUZZ=ON -DQINFER_TESTS=OFF -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQINFER_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_tokenizer_json fuzz_serve_request fuzz_rendezvous
for target in safetensors config tokenizer tokenizer_json serve_request rendezvous; do
    corpus=$(mktemp -d)
    cp fuzz/corpus/$target/* "$corpus"/
    echo "fuzz_$target: ${fuzz_seconds}s"
    if ! build-fuzz/fuzz/fuzz_$target "$corpus" -max_total_time="$fuzz_seconds" -max_len=65536 -timeout=10 \
        -print_final_stats=1 >"$corpus.log" 2>&1; then
        grep -E "ERROR|SUMMARY|Test unit written" -A3 "$corpus.log" | head -30
        echo "fuzz_$target: FAILED"
        exit 1
    fi
    grep -E "^stat::number_of_executed_units" "$corpus.log"
    build-fuzz/fuzz/fuzz_$target "$corpus" -runs=0 >/dev/null 2>&1 || { echo "fuzz_$target: a corpus input fails"; exit 1; }
    rm -rf "$corpus" "$corpus.log"
done
echo "fuzz: 6 passed, 0 failed"
