# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Whether the decode losses under programmatic dependent launch go with builds whose kernels let dependents launch
# later (CMake QINFER_PDL_TRIGGER: loop = after the GEMV / decode attention main loops, exit = as blocks exit): 0.5B
# fused/unfused and 7B PDL on at 1 and 30720, the three builds alternated.
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
