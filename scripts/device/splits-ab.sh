# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Decode grid in whole waves (the default) against the previous rule (QINFER_DECODE_SPLITS=fill), 7B with YaRN at
# 129024 (the row it is for) and 30720, 256 generated, same run.
for sp in fill waves fill waves; do
    echo "-- QINFER_DECODE_SPLITS=$sp"
    QINFER_DECODE_SPLITS=$sp "$Q" bench --preset qwen2.5-7b-yarn --input-lens 30720,129024 --gen 256 2>&1 |
        tee -a "$OUT/splits-ab.log" | grep -E "^\| qwen"
done
