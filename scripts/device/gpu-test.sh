# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Every GPU test (kernels against the CPU, end-to-end goldens, batches, KV dtypes) without the CPU-only suites, with
# the failures' full messages; the kernel timing lines; then the quantized-attention tests repeated (a flaky case).
# GPU_TEST_SKIP: a gtest negative filter, e.g. '*Timings*' (the kernel timing tests: a minute and more);
# GPU_TEST_FILTER: the tests to run instead of all of them (parameterised suites carry a prefix: 'Shapes/CudaMoeDecode.X/0'
# matches '*CudaMoeDecode*', not 'CudaMoeDecode.*'); FLAKY_REPEAT=0 leaves the repetition out.
t_test=$(date +%s)
timeout ${GPU_TEST_TIMEOUT:-900} build-device/tests/qinfer_tests \
    --gtest_filter="${GPU_TEST_FILTER:-Cuda*:*Attention*:*Gemv*:*GoldenCuda*:*cuda*:*KvBackends*:*ArgmaxRows*:*CudaMoe*:*DummyWeights*}${GPU_TEST_SKIP:+-$GPU_TEST_SKIP}" \
    >"$OUT/gpu-test.log" 2>&1
note "gpu tests ($(( $(date +%s) - t_test )) s): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/gpu-test.log" | tr '\n' ' ')"
grep -E "^\[ kernel \]|^\[ kv \]" "$OUT/gpu-test.log"
grep -E "Failure" -A6 "$OUT/gpu-test.log" | head -60
if [ "${FLAKY_REPEAT:-5}" != 0 ]; then
    build-device/tests/qinfer_tests --gtest_filter='Kinds/QuantAttention.*' --gtest_repeat=${FLAKY_REPEAT:-5} >"$OUT/flaky.log" 2>&1
    note "quant attention x${FLAKY_REPEAT:-5}: $(grep -c '^\[  FAILED  \].*GetParam' "$OUT/flaky.log") failures"
    grep -E "Failure" -A6 "$OUT/flaky.log" | head -30
fi
