# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Programmatic dependent launch (QINFER_PDL=1): the end-to-end GPU tests under it, then decode speed with and without.
QINFER_PDL=1 build-device/tests/qinfer_tests --gtest_filter='*GoldenCuda*:*Batch*:*CudaSampling*:*KvBackends*:*QuantGemv*' 2>&1 |
    tee "$OUT/pdl-test.log" | grep -E "FAILED|Failure|PASSED" | head -20
for spec in qwen2.5-0.5b:bf16 qwen2.5-7b:bf16 qwen2.5-0.5b:gptq-int4 qwen2.5-7b:gptq-int4; do
    p=${spec%%:*} q=${spec##*:}
    for pdl in 0 1 0 1; do
        echo "-- $p $q QINFER_PDL=$pdl"
        QINFER_PDL=$pdl "$Q" bench --preset $p --quant $q --input-lens 1 --gen 512 --json "$OUT/pdl-ab-$p-$q-$pdl.json" 2>&1 |
            tee -a "$OUT/pdl-ab.log" | grep -E "^\| qwen"
    done
done
