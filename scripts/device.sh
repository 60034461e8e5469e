#!/usr/bin/env bash
# The one script for the GPU machine: unpack the carried Debian packages, build everything (-j16), run every test
# (the CUDA kernel tests included), optionally make the transformers goldens, run the benchmarks, print a table last.
#
# usage: scripts/device.sh [goldens] [quant-goldens] [chat] [test] [kernels] [bench] [quant-quick] [hf-quick] [bench-full]
#                          [bench-quant] [quant-tune] [quant-test] [final-quant] [batch-test] [memory-tables] [kv-test] [long] [decode-ab] [max-batch] [pdl-ab]
#                          [gpu-test] [attn-test] [attn-profile] [tune] [splits-ab] [qgemv] [dequant-emb] [decode-profile] [ring-ab] [tile-ab] [tile-profile] [gemv-ab] [dequant-ab] [chunk-ab] [chunk-small] [prefill-ab] [wave-ab] [prefill-profile] [rows] [decode-attn] [decode-stages] [rope-ab] [rope-pdl] [pdl-skip] [pdl-exit] [pdl-matrix]
#                          (default: test bench)
# Results land in $OUT (the device tool brings that folder back).
# Set QINFER_COMMIT to the hash computed where you commit (QINFER_COMMIT=1a2b3c4 bash scripts/device.sh ...): the
# device's copy of the tree can carry a stale .git, so `git rev-parse` run there named an old commit (2026-11-26).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stages=${*:-test bench}
has() { [[ " $stages " == *" $1 "* ]]; }
summary=()
note() { summary+=("$1"); echo "== $1"; }

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

if has goldens; then
    t0=$(date +%s)
    rm -rf "$OUT/goldens"
    if python3 scripts/make_goldens.py "$Q" "$OUT/goldens" 2>&1 | tee "$OUT/goldens.log" | grep -vE "^\s*$" | tail -20; then
        tar -C "$OUT" -cf "$OUT/goldens.tar" goldens && rm -rf "$OUT/goldens"
        note "goldens: made in $(( $(date +%s) - t0 )) s"
    else
        note "goldens: FAILED (see goldens.log)"
    fi
fi
if has quant-goldens; then
    rm -rf "$OUT/goldens"
    if python3 scripts/make_goldens.py "$Q" "$OUT/goldens" --quant-only 2>&1 | tee "$OUT/goldens.log" | tail -8; then
        tar -C "$OUT" -cf "$OUT/goldens.tar" goldens && rm -rf "$OUT/goldens"
        note "quant goldens: made"
    else
        note "quant goldens: FAILED (see goldens.log)"
    fi
fi
if has chat; then
    python3 scripts/make_chat_goldens.py "$OUT/chat_goldens.json" 2>&1 | tail -2
fi
if has test; then
    # Eight test processes at once: two OpenMP threads each, not sixteen (oversubscribed, the CPU suites took minutes).
    (cd build-device && OMP_NUM_THREADS=2 ctest --output-on-failure -j8 >"$OUT/ctest.log" 2>&1)
    note "tests: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
    build-device/tests/qinfer_tests --gtest_filter='*GoldenCuda*' 2>&1 | grep -E "^\[ golden \]" | head -40 || true
    grep -E "FAILED|Failure" -A4 "$OUT/ctest.log" | head -60 || true
fi
if has quant-test; then
    build-device/tests/qinfer_tests --gtest_filter='*Quant*:*GoldenCuda*' 2>&1 | grep -E "golden \] cuda .*(gptq|awq|autoround|nf4)|FAILED|Failure|PASSED|Expected|actual|exception" | head -40
fi
# Static batches on the GPU: the batched kernels against the CPU, and a batch step against each sequence alone.
if has batch-test; then
    build-device/tests/qinfer_tests --gtest_filter='*Batch*:*ArgmaxRows*' 2>&1 | tee "$OUT/batch-test.log" |
        grep -E "FAILED|Failure|PASSED|Expected|actual|exception|OK \]" | head -40
fi
if has kernels; then
    build-device/tests/qinfer_tests --gtest_filter='*Attention*:*Gemv*:*Quant*' 2>&1 | grep -E "^\[ kernel \]|FAILED|Failure|PASSED" | tee "$OUT/kernels.log" | head -20
fi
if has bench; then
    for p in qwen2.5-0.5b qwen2.5-7b; do
        QINFER_PROFILE=1 "$Q" bench --preset "$p" --input-lens 1,6144 --gen 256 --json "$OUT/quick-$p.json" 2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:" | tail -24
    done
fi
# Quantized decode, short: BF16 and each 4/8-bit format of one model in the same run.
if has quant-quick; then
    for q in ${QUICK_QUANTS:-bf16 gptq-int4 awq gptq-int8 nf4}; do
        QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 256 --json "$OUT/quick-7b-$q.json" 2>&1 |
            tee -a "$OUT/bench.log" | grep -v "^bench:" | tail -20
    done
fi
# Warps per row group of the quantized GEMVs (QINFER_QKS), per format: the decode profile's GEMV lines and tokens/s.
if has quant-tune; then
    for q in ${TUNE_QUANTS:-gptq-int4}; do
        for ks in 0 1 2 4 8; do
            echo "-- $q QINFER_QKS=$ks"
            QINFER_QKS=$ks QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 128 2>&1 |
                tee -a "$OUT/tune.log" | grep -E "gemv|^\| qwen" | grep -v lm_head
        done
    done
fi
# The issue-5 record in one call: the quantized tests, then each format at 2048 generated next to BF16 of the same
# shapes, and a decode profile of 7B GPTQ-Int4.
if has final-quant; then
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
fi
if has hf-quick; then
    "$Q" synth --preset qwen2.5-0.5b --out /tmp/synth-qwen2.5-0.5b >/dev/null
    python3 scripts/hf_bench.py /tmp/synth-qwen2.5-0.5b --model qwen2.5-0.5b --input-lens 1 --gen 64 --modes compiled --out "$OUT/hf-quick.json" 2>&1 | tail -3
fi
# The seed table for BF16 (issue 4): qinfer at the seeds' input lengths with 2048 generated, and transformers on the
# same weights and card (input 1, 256 generated: its eager mode runs at ~15 tokens/s) for the ratios.
if has bench-full; then
    for p in qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b; do
        d=/tmp/synth-$p
        "$Q" synth --preset "$p" --out "$d" >/dev/null
        for m in compiled eager; do  # one process per mode: a crash in one leaves the other
            python3 scripts/hf_bench.py "$d" --model "$p" --input-lens 1 --gen 256 --modes $m --out "$OUT/hf-$m-$p.json" 2>&1 | grep '^{' || echo "hf $m: failed"
        done
        "$Q" bench --model "$d" --name "$p" --json "$OUT/bench-$p.json" --csv "$OUT/bench-$p.csv" \
            --baseline "$(ls "$OUT"/hf-*-$p.json 2>/dev/null | paste -sd,)" \
            2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:"
        rm -rf "$d"
    done
fi
# The quantized rows (issue 5): each format against BF16 of the same shapes on the same card, in one run.
if has bench-quant; then
    for spec in qwen2.5-7b:bf16 qwen2.5-7b:gptq-int4 qwen2.5-7b:awq qwen2.5-7b:gptq-int8 qwen2.5-7b:nf4 qwen2.5-0.5b:bf16 qwen2.5-0.5b:gptq-int4; do
        p=${spec%%:*} q=${spec##*:}
        lens=1,30720
        [ "$q" = nf4 ] && lens=1
        "$Q" bench --preset "$p" --quant "$q" --input-lens $lens --json "$OUT/bench-$p-$q.json" --csv "$OUT/bench-$p-$q.csv" \
            2>&1 | tee -a "$OUT/bench.log" | grep -v "^bench:"
        rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
    done
fi
# Quantized KV caches on the GPU: kernels and end to end against the CPU cache of the same dtype.
if has kv-test; then
    build-device/tests/qinfer_tests --gtest_filter='*QuantAttention*:*CudaKv*:*KvBackends*:*Batch*cuda*:*LongContext*' 2>&1 |
        tee "$OUT/kv-test.log" | grep -E "^\[ kv \]|FAILED|Failure|PASSED|Expected|actual|exception" | head -40
fi
# Issue 6's long rows: Qwen2.5-7B with YaRN at 63488 and 129024 input tokens, BF16 and Int4 weights, and the decode
# speed of each KV dtype at 129024.
if has long; then
    for spec in ${LONG_SPECS:-bf16:bf16:63488,129024 gptq-int4:bf16:129024 bf16:int8:129024 bf16:fp8:129024 bf16:int4:129024}; do
        IFS=: read -r q kv lens <<<"$spec"
        "$Q" bench --preset qwen2.5-7b-yarn --quant $q --kv-dtype $kv --input-lens $lens --json "$OUT/long-7b-$q-kv$kv.json" 2>&1 |
            tee -a "$OUT/long.log" | grep -E "^\| qwen"
    done
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
fi
# Programmatic dependent launch (QINFER_PDL=1): the end-to-end GPU tests under it, then decode speed with and without.
if has pdl-ab; then
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
fi
# The largest batch of Qwen2.5-7B at 8192 + 16 tokens per KV dtype and weight format (buffers allocated, nothing run).
if has max-batch; then
    for q in ${MAXB_QUANTS:-bf16 gptq-int4}; do
        for kv in bf16 fp8 int8 int4; do
            "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --max-batch --input-lens 8192 --gen 16 \
                --json "$OUT/max-batch-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/max-batch.log" | grep -E "^\| qwen"
        done
    done
fi
# Attention A/B: the older kernels (QINFER_DECODE_ATTN=simt, QINFER_PREFILL_ATTN=tiled) against the defaults (tensor-core
# decode, pipelined prefill), kernels and end to end, same run.
if has decode-ab; then
    build-device/tests/qinfer_tests --gtest_filter='*Attention*' 2>&1 | grep -E "^\[ kernel \]|FAILED|PASSED" | tee "$OUT/decode-ab-kernels.log"
    for p in qwen2.5-0.5b qwen2.5-7b; do
        for k in simt:tiled tc:pipelined; do
            echo "-- $p attention ${k%%:*} / ${k##*:}"
            QINFER_DECODE_ATTN=${k%%:*} QINFER_PREFILL_ATTN=${k##*:} "$Q" bench --preset $p --input-lens 1,6144,30720 --gen 256 \
                --json "$OUT/attn-ab-$p-${k%%:*}.json" 2>&1 | tee -a "$OUT/decode-ab.log" | grep -E "^\| qwen"
        done
    done
fi
# Every GPU test (kernels against the CPU, end-to-end goldens, batches, KV dtypes) without the CPU-only suites, with
# the failures' full messages; the kernel timing lines; then the quantized-attention tests repeated (a flaky case).
# The QKV GEMV with bias/RoPE/cache store fused (default) against the two kernels (QINFER_FUSED_ROPE=0), alternated:
# the CUDA op tests (the fused kernel's among them) and the end-to-end GPU tests, then decode speed (ROPE_AB_SPECS preset:lengths) under each.
if has rope-ab; then
    build-device/tests/qinfer_tests --gtest_filter='CudaOps.*:*GoldenCuda*:*Batch*:*KvBackends*:*ArgmaxRows*' >"$OUT/rope-test.log" 2>&1
    note "fused rope, ops, golden, batch tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/rope-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/rope-test.log" | head -20
    for spec in ${ROPE_AB_SPECS:-qwen2.5-0.5b:1 qwen2.5-1.5b:1 qwen2.5-7b:1}; do
        for fr in 0 1 0 1; do
            QINFER_FUSED_ROPE=$fr "$Q" bench --preset ${spec%%:*} --input-lens ${spec##*:} --gen 2048 \
                --json "$OUT/rope-ab-${spec%%:*}-$fr-$RANDOM.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/fused $fr /" | tee -a "$OUT/rope-ab.log"
        done
    done
fi
# Why the fused QKV RoPE slowed 0.5B (head_dim 64): fused x PDL alternated on 0.5B, eager per-op profiles of both,
# and PDL on 7B BF16 (off by default over 8 GB) at 1 and 30720 now that its decode attention takes 104 KB per block.
if has rope-pdl; then
    for rep in 1 2; do
        for cfg in 0:0 1:0 0:1 1:1; do
            QINFER_FUSED_ROPE=${cfg%%:*} QINFER_PDL=${cfg##*:} "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 2048 \
                --json "$OUT/rope-pdl-0.5b-${cfg/:/-}-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/fused:pdl $cfg /" | tee -a "$OUT/rope-pdl.log"
        done
    done
    for fr in 0 1; do
        QINFER_FUSED_ROPE=$fr QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 64 2>&1 |
            grep -E "^  |profile" | sed "s/^/fused $fr /" | tee -a "$OUT/rope-pdl-profile.log"
    done
    for rep in 1 2; do
        for pdl in 0 1; do
            QINFER_PDL=$pdl "$Q" bench --preset qwen2.5-7b --input-lens 1,30720 --gen 2048 \
                --json "$OUT/rope-pdl-7b-$pdl-$rep.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/pdl $pdl /" | tee -a "$OUT/rope-pdl.log"
        done
    done
fi
# Which early launch costs under PDL (QINFER_PDL_SKIP: the decode attention / its combine launched without it):
# 0.5B with the fused QKV RoPE (lost 3.6% under PDL at 6a70101) and 7B BF16 with PDL forced on at 1 and 30720
# (-6.9% at 30720), each against the defaults, alternated.
if has pdl-skip; then
    for rep in 1 2; do
        for cfg in default none attention combine attention,combine; do
            if [ $cfg = default ]; then e=""; else e="QINFER_FUSED_ROPE=1 QINFER_PDL_SKIP=$cfg"; fi
            env $e "$Q" bench --preset qwen2.5-0.5b --input-lens 1 --gen 2048 --json "$OUT/pdl-skip-0.5b-$cfg-$rep.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-skip.log"
        done
    done
    for rep in $(seq ${PDL_SKIP_7B_REPS:-2}); do
        for cfg in default none attention attention,combine; do
            if [ $cfg = default ]; then e=""; else e="QINFER_PDL=1 QINFER_PDL_SKIP=$cfg"; fi
            env $e "$Q" bench --preset qwen2.5-7b --input-lens 1,30720 --gen 2048 --json "$OUT/pdl-skip-7b-$cfg-$rep.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-skip.log"
        done
    done
fi
# The same question answered by builds whose kernels let dependents launch later (CMake QINFER_PDL_TRIGGER: loop =
# after the GEMV / decode attention main loops, exit = as blocks exit): 0.5B fused/unfused and 7B PDL on at 1 and
# 30720, the three builds alternated.
# Which decode-attention launches should go without programmatic dependent launch, per model: every model with PDL
# on, the split kernel and/or its combine launched normally (QINFER_PDL_SKIP), each model's current default first.
if has pdl-matrix; then
    for spec in ${PDL_MATRIX_SPECS:-qwen2.5-0.5b:bf16:1,30720 qwen2.5-1.5b:bf16:1,30720 qwen2.5-7b:bf16:1,6144,30720 qwen2.5-7b:gptq-int4:1,30720}; do
        IFS=: read -r p q lens <<<"$spec"
        for cfg in default none combine attention,combine; do
            if [ $cfg = default ]; then e=""; else e="QINFER_PDL=1 QINFER_PDL_SKIP=$cfg"; fi
            env $e "$Q" bench --preset $p --quant $q --input-lens $lens --gen 2048 --json "$OUT/pdl-matrix-$p-$q-$cfg.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/pdl-matrix.log"
        done
        rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
    done
fi
if has pdl-exit; then
    for trig in loop exit; do
        cmake -S . -B build-$trig -G "$gen" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr" \
            -DCMAKE_CUDA_ARCHITECTURES="90a" -DQINFER_TESTS=OFF -DQINFER_PDL_TRIGGER=$trig >"$OUT/cmake-$trig.log" 2>&1 &&
            cmake --build build-$trig -j16 --target qinfer >"$OUT/build-$trig.log" 2>&1
        note "trigger-$trig build: $([ -x build-$trig/qinfer ] && echo ok || echo FAILED)"
    done
    for rep in $(seq ${PDL_EXIT_REPS:-1}); do
        for bin in "$Q" build-loop/qinfer build-exit/qinfer; do
            tag=$([ "$bin" = "$Q" ] && echo start || basename "$(dirname "$bin")")
            for fr in 0 1; do
                QINFER_FUSED_ROPE=$fr "$bin" bench --preset qwen2.5-0.5b --input-lens 1 --gen 2048 --json "$OUT/pdl-exit-0.5b-$tag-$fr-$rep.json" 2>&1 |
                    grep -E "^\| qwen" | sed "s/^/$tag fused $fr /" | tee -a "$OUT/pdl-exit.log"
            done
            QINFER_PDL=1 "$bin" bench --preset qwen2.5-7b --input-lens 1,30720 --gen 2048 --json "$OUT/pdl-exit-7b-$tag-$rep.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/$tag pdl 1 /" | tee -a "$OUT/pdl-exit.log"
        done
    done
fi
if has gpu-test; then
    # GPU_TEST_SKIP: a gtest negative filter, e.g. '*Timings*' (the kernel timing tests: a minute and more).
    t_test=$(date +%s)
    timeout ${GPU_TEST_TIMEOUT:-900} build-device/tests/qinfer_tests \
        --gtest_filter="Cuda*:*Attention*:*Gemv*:*GoldenCuda*:*cuda*:*KvBackends*:*ArgmaxRows*${GPU_TEST_SKIP:+-$GPU_TEST_SKIP}" \
        >"$OUT/gpu-test.log" 2>&1
    note "gpu tests ($(( $(date +%s) - t_test )) s): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/gpu-test.log" | tr '\n' ' ')"
    grep -E "^\[ kernel \]|^\[ kv \]" "$OUT/gpu-test.log"
    grep -E "Failure" -A6 "$OUT/gpu-test.log" | head -60
    build-device/tests/qinfer_tests --gtest_filter='Kinds/QuantAttention.*' --gtest_repeat=${FLAKY_REPEAT:-5} >"$OUT/flaky.log" 2>&1
    note "quant attention x${FLAKY_REPEAT:-5}: $(grep -c '^\[  FAILED  \].*GetParam' "$OUT/flaky.log") failures"
    grep -E "Failure" -A6 "$OUT/flaky.log" | head -30
fi
# The attention kernels alone (CPU-reference checks and their timings), quicker than gpu-test.
if has attn-test; then
    build-device/tests/qinfer_tests --gtest_filter="${ATTN_TEST_FILTER:-*Attention*}" >"$OUT/attn-test.log" 2>&1
    note "attention tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/attn-test.log" | tr '\n' ' ')"
    grep -E "^\[ kernel \] attention_prefill" "$OUT/attn-test.log"
    grep -E "Failure" -A6 "$OUT/attn-test.log" | head -40
fi
# Where the wgmma prefill kernel's time goes: ncu on its first launch at 4097 keys (d 128, 14/2 heads, bf16 cache):
# speed of light, occupancy, warp stall reasons, and per-instruction stall samples (SASS, gzip).
if has attn-profile && command -v ncu >/dev/null; then
    timeout 200 ncu --clock-control none -k "regex:attention_prefill_wgmma_kernel" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
        -f -o /tmp/attn-wgmma build-device/tests/qinfer_tests --gtest_filter='Lengths/Attention.*/15' >"$OUT/attn-profile.err" 2>&1
    ncu -i /tmp/attn-wgmma.ncu-rep --page details >"$OUT/attn-profile-details.txt" 2>&1
    ncu -i /tmp/attn-wgmma.ncu-rep --page raw --csv 2>&1 | gzip >"$OUT/attn-profile-raw.csv.gz"
    ncu -i /tmp/attn-wgmma.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/attn-profile-sass.csv.gz"
    grep -E "Duration|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers|Issue Slots Busy" "$OUT/attn-profile-details.txt" | head -12
fi
# Knobs timed in one run: decode splits per SM (QINFER_DECODE_BLOCKS_PER_SM) on the kernels, the BF16 GEMV's weight
# prefetch ahead of the fused RMSNorm (QINFER_GEMV_PREFETCH, alternated), prefill chunk size (QINFER_PREFILL_CHUNK) on
# 7B's time to first token at 30720.
if has tune; then
    for b in ${TUNE_BLOCKS:-2 3 4 8}; do
        echo "-- QINFER_DECODE_BLOCKS_PER_SM=$b"
        QINFER_DECODE_BLOCKS_PER_SM=$b build-device/tests/qinfer_tests \
            --gtest_filter='Lengths/Attention.*/15:Lengths/Attention.*/13:LongContext/*' 2>&1 | grep -E "attention_decode \(tensor" | tee -a "$OUT/tune.log"
    done
    for p in qwen2.5-0.5b qwen2.5-7b; do
        for pf in 0 1 0 1; do
            echo "-- $p QINFER_GEMV_PREFETCH=$pf"
            QINFER_GEMV_PREFETCH=$pf "$Q" bench --preset $p --input-lens 1 --gen 512 2>&1 | tee -a "$OUT/tune.log" | grep -E "^\| qwen"
        done
    done
    for ch in ${TUNE_CHUNKS:-1024 2048 4096}; do
        echo "-- QINFER_PREFILL_CHUNK=$ch"
        QINFER_PREFILL_CHUNK=$ch "$Q" bench --preset qwen2.5-7b --input-lens 30720 --gen 32 2>&1 | tee -a "$OUT/tune.log" | grep -E "^\| qwen"
    done
fi
# Decode grid in whole waves (the default) against the previous rule (QINFER_DECODE_SPLITS=fill), 7B with YaRN at
# 129024 (the row it is for) and 30720, 256 generated, same run.
if has splits-ab; then
    for sp in fill waves fill waves; do
        echo "-- QINFER_DECODE_SPLITS=$sp"
        QINFER_DECODE_SPLITS=$sp "$Q" bench --preset qwen2.5-7b-yarn --input-lens 30720,129024 --gen 256 2>&1 |
            tee -a "$OUT/splits-ab.log" | grep -E "^\| qwen"
    done
fi
# The 4-bit GEMV: kernels on 7B shapes with the bf16 GEMV for scale (QGEMV_KS="0 2 4": forced K splits, 0 = the
# default rule), hardware counters of the qkv and gate_up kernels, a decode-step profile of 7B GPTQ-Int4.
if has qgemv; then
    for ks in ${QGEMV_KS:-0}; do
        echo "-- QINFER_QKS=$ks"
        QINFER_QKS=$ks build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
            grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/qgemv.log"
    done
    if command -v ncu >/dev/null; then
        for re in GemvOutE0 GemvOutE3; do
            timeout 120 ncu --clock-control none --kernel-name-base mangled -k "regex:qgemv_ring_kernel.*$re" --launch-count 1 \
                --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
                build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' >"$OUT/ncu-ring-$re.txt" 2>&1
            grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Warp Cycles Per Issued" "$OUT/ncu-ring-$re.txt" | head -14
        done
    fi
    QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant gptq-int4 --input-lens 1 --gen 256 2>&1 | tee "$OUT/profile-7b-int4.log" | grep -E "gemv|attention|norm|^\| qwen"
fi
# Where a batch-1 decode step of the small models goes: eager per-op profiles (0.5B/1.5B/7B BF16, 0.5B GPTQ-Int4),
# the duration of every kernel of the captured 0.5B step (ncu, one graph node at a time), and per-instruction stall
# samples of the 4-bit ring GEMV on 7B's gate_up shape.
if has decode-profile; then
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
fi
# Decode GEMV prologue and codes prefetch: RMSNorm staging in float4 batches (default) vs the per-256 loop
# (QINFER_QSTAGE=scalar), and 4-bit codes requested into L2 ahead of the ring kernel's registers
# (QINFER_QGEMV_L2AHEAD blocks): kernel timings on 7B shapes, the quantized/GEMV tests with the prefetch on, and
# decode speed of 7B/0.5B (Int4 and BF16), configurations alternated in the same run.
if has ring-ab; then
    for cfg in ${RING_CFGS:-scalar:0 vec:0 vec:6 vec:12 vec:24}; do
        echo "-- stage ${cfg%%:*} l2-ahead ${cfg##*:}"
        QINFER_QSTAGE=${cfg%%:*} QINFER_QGEMV_L2AHEAD=${cfg##*:} build-device/tests/qinfer_tests \
            --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/ring-ab.log"
    done
    QINFER_QGEMV_L2AHEAD=${TEST_AHEAD:-12} build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Gemv*:*GoldenCuda*' >"$OUT/ring-test.log" 2>&1
    note "quant/gemv/golden tests (vec staging, l2 ahead ${TEST_AHEAD:-12}): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/ring-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/ring-test.log" | head -40
    for rep in 1 2; do
        for spec in ${RING_BENCH:-qwen2.5-7b:gptq-int4 qwen2.5-0.5b:gptq-int4}; do
            for cfg in ${RING_BENCH_CFGS:-scalar:0 vec:0 vec:12}; do
                QINFER_QSTAGE=${cfg%%:*} QINFER_QGEMV_L2AHEAD=${cfg##*:} "$Q" bench --preset ${spec%%:*} --quant ${spec##*:} \
                    --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/ring-ab.log"
            done
        done
        for spec in ${BF16_BENCH:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
            for st in scalar vec; do
                QINFER_QSTAGE=$st "$Q" bench --preset $spec --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" | sed "s/^/$st /" |
                    tee -a "$OUT/ring-ab.log"
            done
        done
    done
fi
# 8-bit and bitsandbytes codes in the tile layout (default) against the untiled fp32 kernels (QINFER_QTILE=affine4):
# the quantized/GEMV/golden tests, then 7B decode speed per format, alternated in the same run.
if has tile-ab; then
    build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Gemv*:*GoldenCuda*' >"$OUT/tile-test.log" 2>&1
    note "quant/gemv/golden tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tile-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/tile-test.log" | head -40
    grep -E "golden \] cuda .*(int8|nf4|fp4)" "$OUT/tile-test.log" | head -8
    for q in ${TILE_QUANTS:-gptq-int8 nf4}; do
        for rep in 1 2; do
            for cfg in affine4 all; do
                QINFER_QTILE=$cfg "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" |
                    sed "s/^/$cfg /" | tee -a "$OUT/tile-ab.log"
            done
        done
        QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 128 2>&1 | grep -E "gemv|^\| qwen" |
            grep -v lm_head | tee -a "$OUT/tile-ab.log"
        rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
    done
fi
# Kernel timings of every tiled format on 7B shapes, the quantized GEMV tests, and per-instruction stall samples of
# the 8-bit and lookup gate_up kernels (reports stay on the device; the per-instruction CSVs come back gzipped).
if has tile-profile; then
    build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" |
        tee "$OUT/tile-kernels.log"
    build-device/tests/qinfer_tests --gtest_filter='*QuantGemv*:CudaQuant.Dequantize*' >"$OUT/tile-test.log" 2>&1
    note "quant GEMV tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tile-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/tile-test.log" | head -20
    if command -v ncu >/dev/null; then
        for codes in 1 2; do
            timeout 150 ncu --clock-control none --kernel-name-base mangled -k "regex:qgemv_ring_kernelILNS1_5CodesE${codes}ELNS0_7GemvOutE3" \
                --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
                -f -o /tmp/ring-codes$codes build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' >/dev/null 2>&1
            ncu -i /tmp/ring-codes$codes.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ring-codes$codes-sass.csv.gz"
            ncu -i /tmp/ring-codes$codes.ncu-rep --page details >"$OUT/ring-codes$codes-details.txt" 2>&1
            grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Block Limit" \
                "$OUT/ring-codes$codes-details.txt" | head -12
        done
    fi
fi
# The balanced BF16 GEMV against the row kernels (QINFER_GEMV_BALANCED=0): the GEMV tests, kernel timings, then decode
# of 0.5B / 1.5B / 7B BF16 with the settings alternated (GEMV_AB_MODES: values of QINFER_GEMV_BALANCED), and a decode
# profile of 7B per GEMV_AB_PROFILE setting.
if has gemv-ab; then
    build-device/tests/qinfer_tests --gtest_filter='*Gemv.*:*GoldenCuda*:*Batch*' >"$OUT/gemv-test.log" 2>&1
    note "gemv/golden/batch tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/gemv-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/gemv-test.log" | head -30
    build-device/tests/qinfer_tests --gtest_filter='CudaOps.GemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee "$OUT/gemv-kernels.log"
    for p in ${GEMV_AB_PRESETS:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
        for rep in 1 2; do
            for b in ${GEMV_AB_MODES:-0 1}; do
                QINFER_GEMV_BALANCED=$b "$Q" bench --preset $p --input-lens 1 --gen 512 --json "$OUT/gemv-ab-$p-$b-$rep.json" 2>&1 |
                    grep -E "^\| qwen" | sed "s/^/balanced=$b /" | tee -a "$OUT/gemv-ab.log"
            done
        done
    done
    for b in ${GEMV_AB_PROFILE-0 1}; do
        QINFER_GEMV_BALANCED=$b QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --input-lens 1 --gen 128 2>&1 |
            grep -E "^  |profile" | sed "s/^/balanced=$b /" | tee -a "$OUT/gemv-ab.log"
    done
fi
# Prefill dequantization: the quantized tests and goldens, the prefill GEMM timings per format; then programmatic
# dependent launch on 7B BF16 (off by default above 8 GB of checkpoint), alternated.
if has dequant-ab; then
    build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Dequant*:*GoldenCuda*' >"$OUT/dequant-test.log" 2>&1
    note "quant tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/dequant-test.log" | tr '\n' ' ')"
    grep -E "Failure" -A6 "$OUT/dequant-test.log" | head -30
    grep -E "^\[ kernel \] prefill" "$OUT/dequant-test.log"
    for rep in 1 2; do
        for pdl in 0 1; do
            QINFER_PDL=$pdl "$Q" bench --preset qwen2.5-7b --input-lens 1 --gen 512 --json "$OUT/pdl-7b-$pdl-$rep.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/pdl=$pdl /" | tee -a "$OUT/pdl-ab.log"
        done
    done
fi
# Prefill pass length for dequantized weights (each pass dequantizes every projection once): 7B GPTQ-Int4 at 30720
# with QINFER_PREFILL_CHUNK forced, alternated.
if has chunk-ab; then
    n_chunk=0
    for c in 1024 4096 2048 1024 4096; do
        n_chunk=$((n_chunk + 1))  # (not inside the pipeline: its commands run in subshells)
        QINFER_PREFILL_CHUNK=$c "$Q" bench --preset qwen2.5-7b --quant gptq-int4 --input-lens 30720 --gen 2048 \
            --json "$OUT/chunk-7b-int4-$c-$n_chunk.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/chunk=$c /" | tee -a "$OUT/chunk-ab.log"
    done
fi
# The same for the small BF16 models at 30720 (their activations per token are a quarter / half of 7B's).
if has chunk-small; then
    for spec in qwen2.5-0.5b:1024 qwen2.5-0.5b:4096 qwen2.5-1.5b:1024 qwen2.5-1.5b:2048 qwen2.5-0.5b:1024 qwen2.5-0.5b:4096 qwen2.5-1.5b:1024 qwen2.5-1.5b:2048; do
        p=${spec%%:*} c=${spec##*:}
        QINFER_PREFILL_CHUNK=$c "$Q" bench --preset $p --input-lens 30720 --gen 2048 --json "$OUT/chunk-$p-$c.json" 2>&1 |
            grep -E "^\| qwen" | sed "s/^/chunk=$c /" | tee -a "$OUT/chunk-small.log"
    done
fi
# Prefill attention kernels end to end: QINFER_PREFILL_ATTN=pipelined (mma.sync) against the default (=auto: wgmma
# where it runs), alternated, at 30720 (time to first token and speed incl. prefill). The runs of this session's results
# (12ba010..506c63c) were labelled "wgmma": the default at 12ba010 and 29e214f, a forcing value at 506c63c (since
# removed); each ran the wgmma kernel.
if has prefill-ab; then
    for spec in ${PREFILL_AB_SPECS:-qwen2.5-0.5b:30720 qwen2.5-7b:30720}; do
        p=${spec%%:*} lens=${spec##*:}
        n_ab=0
        for k in pipelined auto pipelined auto; do
            n_ab=$((n_ab + 1))  # (not inside the pipeline: its commands run in subshells)
            QINFER_PREFILL_ATTN=$k "$Q" bench --preset $p --input-lens $lens --gen ${PREFILL_AB_GEN:-2048} \
                --json "$OUT/prefill-ab-$p-$k-$n_ab.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/attn=$k /" | tee -a "$OUT/prefill-ab.log"
        done
    done
fi
# The row GEMV (gate_up of 7B, lm_head) as one wave of resident blocks striding over the rows (QINFER_GEMV_WAVE=1)
# (the default) against one block per row group (=0), with programmatic dependent launch off and on for 7B: kernel
# timings under both grids, then decode, alternated.
if has wave-ab; then
    for w in 0 1; do
        QINFER_GEMV_WAVE=$w build-device/tests/qinfer_tests --gtest_filter='CudaOps.GemvTimings' 2>&1 | grep -E "^\[ kernel \]" |
            sed "s/^/wave=$w /" | tee -a "$OUT/wave-kernels.log"
    done
    for spec in ${WAVE_AB_SPECS:-qwen2.5-7b:0 qwen2.5-7b:1 qwen2.5-1.5b:1 qwen2.5-0.5b:1}; do
        p=${spec%%:*} pdl=${spec##*:}
        for w in 0 1 0 1; do
            QINFER_PDL=$pdl QINFER_GEMV_WAVE=$w "$Q" bench --preset $p --input-lens 1 --gen 512 --json "$OUT/wave-ab-$p-pdl$pdl-$w.json" 2>&1 |
                grep -E "^\| qwen" | sed "s/^/pdl=$pdl wave=$w /" | tee -a "$OUT/wave-ab.log"
        done
    done
fi
# Where the first token's time goes: per-op GPU time of the prefill (QINFER_PROFILE=1; PREFILL_PROFILE_SPECS
# preset:quant:length), 16 tokens generated.
if has prefill-profile; then
    for spec in ${PREFILL_PROFILE_SPECS:-qwen2.5-7b:bf16:30720 qwen2.5-7b:gptq-int4:30720}; do
        IFS=: read -r p q lens <<<"$spec"
        echo "-- $p $q $lens" | tee -a "$OUT/prefill-profile.log"
        QINFER_PROFILE=1 "$Q" bench --preset $p --quant $q --input-lens $lens --gen 16 2>&1 | grep -E "^  |profile" | tee -a "$OUT/prefill-profile.log"
    done
fi
# Decode attention on 7B's shapes (CudaDecodeTimings, caches of several layers in turn) for each blocks-per-SM
# setting in DECODE_BPS, then ncu of one 30720-key step (the split kernel and its combine; the 2048-key case runs
# first: 48 layers x 22 calls of each kernel are skipped).
if has decode-attn; then
    for bps in ${DECODE_BPS:-3 2 4 3}; do
        echo "-- blocks per SM $bps" | tee -a "$OUT/decode-attn.log"
        QINFER_DECODE_BLOCKS_PER_SM=$bps build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 |
            grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/decode-attn.log"
    done
    if command -v ncu >/dev/null; then
        timeout 200 ncu --clock-control none -k "regex:attention_(decode_tc|combine)" --launch-skip 2112 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
            build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' >"$OUT/decode-attn-ncu.txt" 2>&1
        grep -E "attention_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
            "$OUT/decode-attn-ncu.txt" | head -40
    fi
fi
# Decode attention K/V stages (QINFER_DECODE_STAGES 2 or 3; 3 is the default at head_dim 128, two blocks per SM),
# alternated: kernel timings on 7B's shapes, the decode tests under each, then BF16 rows end to end (DECODE_ROW_SPECS
# preset:lengths).
if has decode-stages; then
    cfgs=${DECODE_CFGS:-2 3 2 3}
    for st in $cfgs; do
        echo "-- stages $st" | tee -a "$OUT/decode-stages.log"
        QINFER_DECODE_STAGES=$st build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.*' 2>&1 |
            grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/decode-stages.log"
    done
    for st in $(printf '%s\n' $cfgs | sort -u); do
        QINFER_DECODE_STAGES=$st build-device/tests/qinfer_tests \
            --gtest_filter='Lengths/Attention.*:TinyHeads/*:Kinds/QuantAttention.*:*KvBackends*:*Batch*:*GoldenCuda*' >"$OUT/decode-tests-$st.log" 2>&1
        note "decode tests, $st stages: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/decode-tests-$st.log" | tr '\n' ' ')"
        grep -E "Failure" -A6 "$OUT/decode-tests-$st.log" | head -20
    done
    for spec in ${DECODE_ROW_SPECS:-qwen2.5-7b:30720}; do
        for st in $cfgs; do
            QINFER_DECODE_STAGES=$st "$Q" bench --preset ${spec%%:*} --input-lens ${spec##*:} --gen 2048 \
                --json "$OUT/decode-row-${spec%%:*}-$st-$RANDOM.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/stages $st /" | tee -a "$OUT/decode-stages.log"
        done
    done
fi
# The rows of this commit with 2048 generated (BF16 and 4-bit, short and long), one JSON each.
if has rows; then
    for spec in ${ROW_SPECS:-qwen2.5-0.5b:bf16:1,30720 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720 qwen2.5-0.5b:gptq-int4:1 qwen2.5-7b:gptq-int4:1,30720 qwen2.5-7b:awq:1}; do
        IFS=: read -r p q lens <<<"$spec"
        "$Q" bench --preset $p --quant $q --input-lens $lens --gen 2048 --json "$OUT/row-$p-$q.json" 2>&1 | grep -E "^\| qwen" |
            tee -a "$OUT/rows.log"
    done
fi
# Issue 6's memory tables in the seed's form: Qwen2.5-7B generating 1024 tokens at batch 1..100 and batch 1 at
# lengths 512..8192, BF16 and Int8/Int4 weights, without and with KV cache quantization (int8, as the seed).
if has dequant-emb; then
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
fi
if has memory-tables; then
    for q in ${TABLE_QUANTS:-bf16 gptq-int8 gptq-int4}; do
        for kv in ${TABLE_KVS:-bf16 int8}; do
            "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --input-lens 1 --gen 1024 --batch ${TABLE_BATCHES:-1,4,16,32,64,100} \
                --json "$OUT/batch-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/memory.log" | grep -E "^\| qwen"
            "$Q" bench --preset qwen2.5-7b --quant $q --kv-dtype $kv --input-lens 512,1024,2048,4096,8192 --gen 1 \
                --json "$OUT/length-7b-$q-kv$kv.json" 2>&1 | tee -a "$OUT/memory.log" | grep -E "^\| qwen"
        done
        rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
    done
    "$Q" memory-table --json "$(ls "$OUT"/batch-7b-*.json | paste -sd,)" --by batch | tee "$OUT/memory-table-batch.md"
    "$Q" memory-table --json "$(ls "$OUT"/length-7b-*.json | paste -sd,)" --by input_len | tee "$OUT/memory-table-length.md"
fi
# Everything in one archive: the device tool brings back at most eight files.
(cd "$OUT" && tar -cf results.tar --exclude=results.tar --exclude=goldens.tar --exclude=final.tar . &&
    find . -type f ! -name results.tar ! -name goldens.tar ! -name final.tar -delete)
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
