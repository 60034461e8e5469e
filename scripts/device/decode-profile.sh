# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Where a batch-1 decode step of the small models goes: eager per-op profiles (0.5B/1.5B/7B BF16, 0.5B GPTQ-Int4),
# the duration of every kernel of the captured 0.5B step (ncu, one graph node at a time), and per-instruction stall
# samples of the 4-bit ring GEMV on 7B's gate_up shape.
for spec in ${PROFILE_SPECS:-qwen2.5-0.5b:bf16 qwen2.5-1.5b:bf16 qwen2.5-7b:bf16 qwen2.5-0.5b:gptq-int4}; do
    QINFER_PROFILE=1 "$Q" bench --preset ${spec%%:*} --quant ${spec##*:} --input-lens 1 --gen 256 2>&1 |
        tee -a "$OUT/decode-profile.log" | grep -v "^bench:" | head -16
done
if command -v ncu >/dev/null; then
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv "$Q" bench --preset qwen2.5-0.5b \
        --input-lens 1 --gen 3 2>"$OUT/ncu-0.5b-kernels.err" | gzip >"$OUT/ncu-0.5b-kernels.csv.gz"
    timeout 200 ncu --clock-control none --kernel-name-base mangled -k "regex:qgemv_ring_kernel.*GemvOutE3" --launch-count 1 \
        --section WarpStateStats --section SourceCounters -f -o /tmp/ring-gate-up \
        build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' >/dev/null 2>&1
    # The report itself (~20 MB) stays on the device: the tar of $OUT must stay under the 16 MiB a file may have.
    ncu -i /tmp/ring-gate-up.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ring-gate-up-sass.csv.gz"
    ncu -i /tmp/ring-gate-up.ncu-rep --page details >"$OUT/ring-gate-up-details.txt" 2>&1
fi
