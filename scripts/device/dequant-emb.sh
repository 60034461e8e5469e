# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Row-coalesced dequantization (default) against the per-word kernel (QINFER_DEQUANT=scatter), and the untied
# token embedding in host memory (default) against --embedding-on-gpu, alternating in one run. Everything lands in
# one tar in $OUT (only 8 files come back), rewritten after each run so a call cut short keeps what it measured;
# every run's JSON is kept (-N suffix).
D="$PWD/build-device/dequant-emb"
rm -rf "$D" && mkdir -p "$D"
save() { tar -C build-device -cf "$OUT/dequant-emb.tar" dequant-emb; }
n=0
for impl in rows scatter rows scatter; do
    echo "-- prefill GEMM, dequantization $impl" | tee -a "$D/dequant-emb.log"
    QINFER_DEQUANT=$impl build-device/tests/qinfer_tests --gtest_filter='CudaQuant.PrefillGemmTimings' 2>&1 |
        grep -E "^\[ kernel \]|FAILED" | tee -a "$D/dequant-emb.log"
done
for impl in rows scatter rows scatter; do
    n=$((n + 1))  # (not inside the pipeline: its commands run in subshells)
    QINFER_DEQUANT=$impl "$Q" bench --preset qwen2.5-7b --quant gptq-int4 --input-lens 30720 --gen 2048 \
        --json "$D/7b-int4-30720-$impl-$n.json" 2>&1 | tee -a "$D/dequant-emb.log" | grep -E "^\| qwen" | sed "s/^/$impl /"
    save
done
for spec in qwen2.5-7b:gptq-int4 qwen2.5-7b:bf16; do
    p=${spec%%:*} q=${spec##*:}
    for emb in host gpu host gpu; do
        flag=""; [ $emb = gpu ] && flag=--embedding-on-gpu
        n=$((n + 1))
        "$Q" bench --preset $p --quant $q --input-lens 1 --gen 2048 $flag --json "$D/$p-$q-emb-$emb-$n.json" 2>&1 |
            tee -a "$D/dequant-emb.log" | grep -E "^\| qwen" | sed "s/^/emb-$emb /"
        save
    done
done
"$Q" bench --preset qwen2.5-7b --quant awq --input-lens 1,30720 --gen 2048 --json "$D/7b-awq.json" 2>&1 |
    tee -a "$D/dequant-emb.log" | grep -E "^\| qwen"
save
