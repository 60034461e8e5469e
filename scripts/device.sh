#!/usr/bin/env bash
# The one script for the GPU machine: unpack the carried Debian packages, build everything (-j every core), then run the named
# stages in the order given, and print a summary last.
#
# usage: QINFER_COMMIT=<hash> bash scripts/device.sh STAGE...   (default: gpu-test)
# A stage is a file scripts/device/STAGE.sh (its comment says what it runs and which variables it reads): gpu-test
# (every CUDA test), test (every test), rows (batch-1 rows), ab (this tree against a baseline commit, alternated),
# bench-full (the seed table with transformers on the same card), bench-quant, long, memory-tables, max-batch,
# decode-trace, prefill-trace (a long prompt's prefill, kernel by kernel), bandwidth (bench --bandwidth), ncu (one kernel's counters), kernels-ab (bench --kernels under an env switch, alternated, with SASS
# instruction counts), decode-ab (decode attention timings and long-context rows under an env switch, alternated), logits-ab (one forward pass's logits under two settings of an A/B knob, compared), moe (issue 35's MoE rows), tp (issue 36's tensor-parallel tests and rows, on a machine of
# several GPUs), tp-nodes (tensor parallel as two processes: the multi-host path), throughput (continuous batching against transformers), serve-load (`qinfer serve` under concurrent
# clients), goldens / chat (transformers' goldens for tests/data).
# Results land in $OUT (the device tool brings that folder back) as one results.tar. Set QINFER_COMMIT to the hash of
# the tree you send: the device's copy can carry a stale .git, so `git rev-parse` there named an old commit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# A device's $OUT has held earlier sessions' files: those over an hour old (no call runs that long) move out of the
# way, so that they neither join this run's archive nor come back beside it.
mkdir -p /tmp/qinfer-stale-out && find "$OUT" -type f -mmin +60 -exec mv -t /tmp/qinfer-stale-out {} + 2>/dev/null
# --build-only: build, run nothing. QINFER_SKIP_BUILD=1: use the build that is there (stages run side by side on
# several GPUs: CUDA_VISIBLE_DEVICES and OUT set per run).
build_only=0
[ "${1:-}" = --build-only ] && { build_only=1; shift; }
stages=("${@:-gpu-test}")
[ $build_only = 1 ] && stages=()
for stage in "${stages[@]+"${stages[@]}"}"; do
    [ -f "scripts/device/$stage.sh" ] || { echo "device.sh: no stage '$stage' (the files in scripts/device/)"; exit 2; }
done
summary=()
note() { summary+=("$1"); echo "== $1"; }
# Everything in $OUT into one archive (appended to, as the deadline may have packed part already): the device tool
# brings back at most eight files, and none that a stage left behind when the call's time ran out.
pack() {
    (cd "$OUT" && find . -type f ! -name results.tar ! -name goldens.tar -print0 | sort -z | xargs -0 -r tar -rf results.tar &&
        find . -type f ! -name results.tar ! -name goldens.tar -delete)
}
# DEVICE_DEADLINE (seconds, default 560): past it, whatever the stages wrote so far is packed, so that a call the
# device tool stops at its limit (600 s) still brings every file back.
# Its output goes nowhere: a background process holding the call's stdout would keep the call open.
( sleep "${DEVICE_DEADLINE:-560}" && pack ) >/dev/null 2>&1 &
packer=$!
trap 'pkill -P "$packer" sleep 2>/dev/null; kill "$packer" 2>/dev/null' EXIT

# Carried .deb files (scripts/fetch-device-deps.sh): unpack into .deps/root, once (stages side by side on several
# GPUs skip the build and find them there: four unpacking into one folder at once had failed; scripts/device-sides.sh
# unpacks before it starts them). A call that carries .deps replaces the folder, unpacked files and all: with
# QINFER_SKIP_BUILD=1 and no .deps/root the binary found no libutf8proc (2026-11-30, call 2), so then they are
# unpacked too.
if { [ "${QINFER_SKIP_BUILD:-0}" != 1 ] || [ ! -d .deps/root/usr ]; } && ls .deps/*.deb >/dev/null 2>&1; then
    mkdir -p .deps/root
    for f in .deps/*.deb; do
        if command -v dpkg >/dev/null; then dpkg -x "$f" .deps/root; else (cd .deps/root && ar p "../$(basename "$f")" data.tar.xz | tar xJ); fi
    done
fi
# Libraries unpacked there (cpp-httplib and Brotli) are found at run time too.
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -n "${QINFER_COMMIT:-}" ] || echo "warning: QINFER_COMMIT is not set; results will name the device checkout's HEAD"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/gpu: /'
nvcc --version | tail -1
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
t0=$(date +%s)
[ "${QINFER_SKIP_BUILD:-0}" = 1 ] || cmake -S . -B build-device -G "$gen" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr" \
    -DCMAKE_CUDA_ARCHITECTURES="90a" -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
# QINFER_BUILD_TARGET: one target (e.g. qinfer, the binary alone: no tests) where the call's time is short.
[ "${QINFER_SKIP_BUILD:-0}" = 1 ] || cmake --build build-device -j"${QINFER_JOBS:-$(nproc)}" ${QINFER_BUILD_TARGET:+--target "$QINFER_BUILD_TARGET"} >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
note "build: ok in $(( $(date +%s) - t0 )) s"
# QINFER_BIN: another binary for the stages (e.g. build-base/qinfer, the ab stage's baseline, for a serve pair).
Q=${QINFER_BIN:-$PWD/build-device/qinfer}
export QINFER_ASSETS=${QINFER_ASSETS:-$PWD/assets}  # another tree's binary finds the tokenizers here

for stage in "${stages[@]+"${stages[@]}"}"; do
    t_stage=$(date +%s)
    # shellcheck source=/dev/null
    source "scripts/device/$stage.sh"
    note "stage $stage: $(( $(date +%s) - t_stage )) s"
done
pkill -P "$packer" sleep 2>/dev/null
kill "$packer" 2>/dev/null
pack
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
