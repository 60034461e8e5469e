# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# `qinfer bench --bandwidth`: how fast one kernel reads regions of GPU memory of each size (BW_SIZES_MB, default the
# command's: 8 to 622 MB, the sizes of 7B / 0.5B projections, a 7B layer's int8 KV cache at 129024 keys, lm_head), by
# 16-byte loads and by bulk copies into shared memory, also in a paged KV cache's layout.
"$Q" bench --bandwidth ${BW_SIZES_MB:+--sizes-mb "$BW_SIZES_MB"} --json "$OUT/bandwidth.json" 2>&1 | tee "$OUT/bandwidth.log" ||
    note "bandwidth: failed"
