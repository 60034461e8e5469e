# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Eight test processes at once: two OpenMP threads each, not sixteen (oversubscribed, the CPU suites took minutes).
(cd build-device && OMP_NUM_THREADS=2 ctest --output-on-failure -j8 >"$OUT/ctest.log" 2>&1)
note "tests: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
build-device/tests/qinfer_tests --gtest_filter='*GoldenCuda*' 2>&1 | grep -E "^\[ golden \]" | head -40 || true
grep -E "FAILED|Failure" -A4 "$OUT/ctest.log" | head -60 || true
