#!/usr/bin/env bash
# The one script for the GPU machine: unpack the carried Debian packages, build everything (-j16), run every test
# (the CUDA kernel tests included), optionally make the transformers goldens, run the benchmarks, print a table last.
#
# usage: scripts/device.sh [stage ...]   (default: test bench)
# Each stage is a file in scripts/device/ whose comment says what it runs; the loop near the end runs the named ones
# in a fixed order after the build. Main ones: gpu-test (every CUDA test), rows (ROW_SPECS), bench-full (the seed table
# with transformers on the same card), bench-quant, long, memory-tables; the others are the A/B runs behind
# bench/results and docs/perf-log.md.
# Results land in $OUT (the device tool brings that folder back).
# Set QINFER_COMMIT to the hash computed where you commit (QINFER_COMMIT=1a2b3c4 bash scripts/device.sh ...): the
# device's copy of the tree can carry a stale .git, so `git rev-parse` run there named an old commit (2026-11-26).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# A device's $OUT has held earlier sessions' files: those over an hour old (no call runs that long) move out of the
# way, so that they neither join this run's archive nor come back beside it.
mkdir -p /tmp/qinfer-stale-out && find "$OUT" -type f -mmin +60 -exec mv -t /tmp/qinfer-stale-out {} + 2>/dev/null
stages=${*:-test bench}
has() { [[ " $stages " == *" $1 "* ]]; }
summary=()
note() { summary+=("$1"); echo "== $1"; }
# ab_configs TAG REPS "SPECS" "PICKED" CONFIG...: `qinfer bench` (AB_GEN tokens generated, default 2048) for each
# preset:quant:lengths spec under each CONFIG ("name VAR=value ...") whose name is in PICKED, alternated REPS times;
# rows to $OUT/TAG.log, each led by AB_LABEL (default none) and the config's name, one JSON per run
# ($OUT/TAG-preset-quant-name-rep.json).
ab_configs() {
    local tag=$1 reps=$2 specs=$3 picked=" $4 " rep spec p q lens c name envs
    shift 4
    for rep in $(seq "$reps"); do
        for spec in $specs; do
            IFS=: read -r p q lens <<<"$spec"
            for c in "$@"; do
                read -r name envs <<<"$c"
                [[ $picked == *" $name "* ]] || continue
                env $envs "$Q" bench --preset "$p" --quant "$q" --input-lens "$lens" --gen "${AB_GEN:-2048}" --json "$OUT/$tag-$p-$q-$name-$rep.json" 2>&1 |
                    grep -E "^\| qwen" | sed "s/^/${AB_LABEL:-}$name /" | tee -a "$OUT/$tag.log"
            done
        done
    done
}
# ab VAR "VALUES" "SPECS" TAG: ab_configs with the environment variable VAR at each value in turn, AB_REPS times
# (default 2); rows led by "TAG value".
ab() {
    local var=$1 values=$2 specs=$3 tag=$4 v configs=()
    for v in $values; do configs+=("$v $var=$v"); done
    AB_LABEL="$tag " ab_configs "$tag" "${AB_REPS:-2}" "$specs" "$values" "${configs[@]}"
}
# ncu_decode TAG KERNEL SKIP LEN TEST SECTION...: one launch of the kernels matching KERNEL (a regex), after SKIP of
# them, in the gtest TEST run with QINFER_DECODE_TIMING_LEN=LEN, profiled by ncu with the named sections: details to
# $OUT/TAG.txt, per-instruction samples (SASS) to $OUT/TAG-sass.csv.gz, ncu's own output to $OUT/TAG-run.txt, the
# headline lines printed. Nothing where ncu is missing.
ncu_decode() {
    local tag=$1 kernel=$2 skip=$3 len=$4 test=$5 section sections=()
    shift 5
    command -v ncu >/dev/null || return 0
    for section in "$@"; do sections+=(--section "$section"); done
    QINFER_DECODE_TIMING_LEN=$len timeout 240 ncu --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
        "${sections[@]}" -f -o "/tmp/$tag" build-device/tests/qinfer_tests --gtest_filter="$test" >"$OUT/$tag-run.txt" 2>&1
    ncu -i "/tmp/$tag.ncu-rep" --page details >"$OUT/$tag.txt" 2>&1
    ncu -i "/tmp/$tag.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/$tag-sass.csv.gz"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slot|No Eligible|Executed Ipc" \
        "$OUT/$tag.txt" | head -30
}

# Carried .deb files (scripts/fetch-device-deps.sh): unpack into .deps/root.
if ls .deps/*.deb >/dev/null 2>&1; then
    mkdir -p .deps/root
    for f in .deps/*.deb; do
        if command -v dpkg >/dev/null; then dpkg -x "$f" .deps/root; else (cd .deps/root && ar p "../$(basename "$f")" data.tar.xz | tar xJ); fi
    done
fi
[ -n "${QINFER_COMMIT:-}" ] || echo "warning: QINFER_COMMIT is not set; results will name the device checkout's HEAD"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/gpu: /'
nvcc --version | tail -1
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
t0=$(date +%s)
cmake -S . -B build-device -G "$gen" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr" \
    -DCMAKE_CUDA_ARCHITECTURES="90a" >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-device -j16 >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
note "build: ok in $(( $(date +%s) - t0 )) s"
Q=$PWD/build-device/qinfer

ran=""
# The stages, in this order, each a file in scripts/device/ (its comment says what it runs and why).
for stage in goldens quant-goldens chat test quant-test batch-test kernels bench quant-quick quant-tune final-quant \
    hf-quick bench-full bench-quant kv-test long pdl-ab max-batch decode-ab rope-ab rope-pdl pdl-skip pdl-matrix \
    tma-ab early-kv-ab ring-deep-ab chunk-long pdl-exit gpu-test attn-test attn-profile tune splits-ab qgemv decode-profile ring-ab tile-ab \
    tile-profile gemv-ab dequant-ab chunk-ab chunk-small prefill-ab wave-ab prefill-profile decode-attn \
    decode-stages decode-ncu decode-tma split-keys q8-decode q8-ncu q8-stages qgemv-ncu qgemv-stage-ab qgemm-ab decode-trace combine-pdl-ab rows3-ab qgemv-knobs qstage-k-ab qring-fast-ab lazy-ab half-ab kv-prefill rows dequant-emb memory-tables; do
    if has "$stage"; then source "scripts/device/$stage.sh"; ran+=" $stage "; fi
done
for stage in $stages; do [[ "$ran" == *" $stage "* ]] || note "stage $stage: not in device.sh's list of stages (not run)"; done
# Everything in one archive: the device tool brings back at most eight files.
(cd "$OUT" && tar -cf results.tar --exclude=results.tar --exclude=goldens.tar --exclude=final.tar . &&
    find . -type f ! -name results.tar ! -name goldens.tar ! -name final.tar -delete)
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
