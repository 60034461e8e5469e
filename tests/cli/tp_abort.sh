#!/usr/bin/env bash
# Tensor parallel on two GPUs (device stage tp): a call that outlasts QINFER_TP_TIMEOUT aborts the ranks'
# collectives and exits non-zero (not by a signal) within a bound, with an error line naming the timeout.
set -u
q="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
QINFER_TP_TIMEOUT=0.001 timeout -k 10 60 "$q" bench --preset tiny-qwen2 --tp 2 --input-lens 2000 --gen 4000 >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ] || ! grep -q "QINFER_TP_TIMEOUT" "$tmp/err"; then
    echo "FAIL tp-timeout: rc=$rc after ${took}s; stderr:"
    tail -5 "$tmp/err" | sed 's/^/    /'
    exit 1
fi
echo "ok   tp-timeout: rc=$rc after ${took}s: $(grep QINFER_TP_TIMEOUT "$tmp/err" | head -1)"
