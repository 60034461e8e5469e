#!/usr/bin/env bash
# Two runs of scripts/device.sh side by side on the two GPUs of an nvidia-h200-x2 (the two arms of an A/B at the same
# time, or two unrelated jobs), on the build that is there (run `scripts/device.sh --build-only` or any stage first).
#
# usage: SIDE0="VAR=value ..." SIDE1="VAR=value ..." bash scripts/device-sides.sh STAGE...
# Side N runs the stages on GPU N with its own environment settings (SIDEn, words VAR=value: the A/B knob and any
# stage variables), its own QINFER_CACHE (two processes writing one synthetic checkpoint or config folder at once had
# to be kept apart) and its own results folder $OUT/sideN (packed into $OUT/sideN/results.tar by device.sh). Each side's
# output goes to $OUT/sideN.log; their rows and errors are printed last, then all of it is packed into $OUT/sides.tar.
# SIDES_DEADLINE: seconds from now at which both sides pack what they have (default 540; set it below what is left of
# the call).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/out}
[ $# -gt 0 ] || { echo "usage: SIDE0=\"VAR=value ...\" SIDE1=\"VAR=value ...\" bash scripts/device-sides.sh STAGE..."; exit 2; }
# The carried libraries unpacked once, here, before both sides start (a call that carries .deps replaces the folder).
if [ ! -d .deps/root/usr ] && ls .deps/*.deb >/dev/null 2>&1; then
    mkdir -p .deps/root
    for f in .deps/*.deb; do
        if command -v dpkg >/dev/null; then dpkg -x "$f" .deps/root; else (cd .deps/root && ar p "../$(basename "$f")" data.tar.xz | tar xJ); fi
    done
fi
for side in 0 1; do
    mkdir -p "$OUT/side$side"
    settings=SIDE$side
    # shellcheck disable=SC2086  # the settings split into words on purpose
    env CUDA_VISIBLE_DEVICES=$side QINFER_CACHE="/tmp/qinfer-cache-side$side" QINFER_SKIP_BUILD=1 OUT="$OUT/side$side" \
        DEVICE_DEADLINE="${SIDES_DEADLINE:-540}" ${!settings:-} bash scripts/device.sh "$@" >"$OUT/side$side.log" 2>&1 &
done
wait
for side in 0 1; do
    settings=SIDE$side
    echo "== side $side (GPU $side): ${!settings:-no settings}"
    grep -E "^Throughput|^\| qwen|rror|Failure|gpu tests|logits-ab|^tensor parallel" "$OUT/side$side.log"
done
# Both sides' logs and archives in one file (the device tool brings back eight files a call: with two rounds of four,
# the second round's had not come back, 2026-11-30).
(cd "$OUT" && tar -cf sides.tar side0.log side1.log side0 side1 && rm -rf side0.log side1.log side0 side1)
