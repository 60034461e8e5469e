# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The tensor-core decode kernels' lazy rescale (O and l rescaled only when a row's maximum moved; QINFER_DECODE_LAZY=0
# rescales every tile): the attention, KV and golden tests with it on (the default; off is the path tested before),
# the kernels at 7B's shapes (bf16, int8, fp8 caches) with each setting, then rows with each, alternated LAZY_REPS
# times (default 2): LAZY_SPECS, preset:quant:kv:len (~6 min in all with the defaults).
build-device/tests/qinfer_tests --gtest_filter='*Attention*:*KvBackends*:*GoldenCuda*' >"$OUT/lazy-tests.log" 2>&1
note "attention/KV/golden tests, lazy on: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/lazy-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/lazy-tests.log" | head -20
for lz in 0 1; do
    for t in Qwen7BShapes Qwen7BQuantCaches; do
        QINFER_DECODE_LAZY=$lz QINFER_DECODE_TIMING_LEN=${LAZY_LEN:-129024} build-device/tests/qinfer_tests --gtest_filter="CudaDecodeTimings.$t" 2>&1 |
            grep -E "^\[ kernel \].*tensor copies|FAILED" | sed "s/^/lazy $lz /" | tee -a "$OUT/lazy-ab.log"
    done
done
for rep in $(seq "${LAZY_REPS:-2}"); do
    for spec in ${LAZY_SPECS:-qwen2.5-7b-yarn:gptq-int4:int8:129024 qwen2.5-0.5b:bf16:bf16:1}; do
        IFS=: read -r p q kv len <<<"$spec"
        for lz in 0 1; do
            QINFER_DECODE_LAZY=$lz "$Q" bench --preset "$p" --quant "$q" --kv-dtype "$kv" --input-lens "$len" --gen "${AB_GEN:-2048}" \
                --json "$OUT/lazy-$p-$q-$kv-$lz-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/lazy $lz /" | tee -a "$OUT/lazy-ab.log"
        done
    done
done
