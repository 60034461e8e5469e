# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The issue-5 record in one call: the quantized tests, then each format at 2048 generated next to BF16 of the same
# shapes, and a decode profile of 7B GPTQ-Int4.
F="$OUT/final"
mkdir -p "$F"
(cd build-device && ctest -R "Quant|GoldenCuda|quant" -j16 --output-on-failure >"$F/ctest-quant.log" 2>&1)
note "quant tests: $(grep -E 'tests passed|tests failed' "$F/ctest-quant.log" | tail -1)"
grep -E "golden \] cuda .*(gptq|awq|autoround|nf4)" "$F/ctest-quant.log" | head -12
grep -E "FAILED|Failure" -A4 "$F/ctest-quant.log" | head -30
tar -C "$OUT" -cf "$OUT/final.tar" final
for spec in ${FINAL_SPECS:-qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:bf16:1 qwen2.5-7b:awq:1 qwen2.5-0.5b:bf16:1 qwen2.5-0.5b:gptq-int4:1 qwen2.5-7b:gptq-int8:1}; do
    IFS=: read -r p q lens <<<"$spec"
    "$Q" bench --preset "$p" --quant "$q" --input-lens "$lens" --json "$F/bench-$p-$q.json" --csv "$F/bench-$p-$q.csv" \
        >"$F/bench-$p-$q.log" 2>&1
    grep -E "^\| qwen" "$F/bench-$p-$q.log"
    if [ "$p:$q" = qwen2.5-7b:gptq-int4 ]; then
        QINFER_PROFILE=1 "$Q" bench --preset "$p" --quant "$q" --input-lens 1 --gen 256 >"$F/profile-7b-int4.log" 2>&1
        grep -E "gemv|^\| qwen" "$F/profile-7b-int4.log" | grep -v lm_head
    fi
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
    tar -C "$OUT" -cf "$OUT/final.tar" final
done
rm -rf "$F"
