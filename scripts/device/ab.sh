# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# This tree against a baseline in the same call: the baseline's source (`scripts/ab-base.sh COMMIT` exports it into
# .ab-base/, carried by the device call) is built into build-base with the same flags, then each AB_SPECS row
# (preset:quant:input lengths; default the batch-1 rows of issue 40) runs AB_REPS times (default 2) with the two
# binaries alternated (base, this, base, this, ...), AB_GEN generated (default 2048). Rows to $OUT/ab.log, one JSON per
# run ($OUT/ab-ARM-preset-quant-REP.json), and a table of tok/s per arm last. AB_ARGS: more options for both arms
# (e.g. --load-format dummy).
if [ ! -f .ab-base/CMakeLists.txt ]; then
    note "ab: no baseline in .ab-base (scripts/ab-base.sh COMMIT, then carry .ab-base)"
else
    t_ab=$(date +%s)
    base_commit=$(cat .ab-base/COMMIT 2>/dev/null || echo base)
    cmake -S .ab-base -B build-base -G "$gen" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr" \
        -DCMAKE_CUDA_ARCHITECTURES="90a" -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DQINFER_TESTS=OFF >"$OUT/cmake-base.log" 2>&1 &&
        cmake --build build-base -j16 --target qinfer >"$OUT/build-base.log" 2>&1 || { note "ab: baseline build failed"; tail -20 "$OUT/build-base.log"; }
    note "ab: baseline $base_commit built in $(( $(date +%s) - t_ab )) s"
    specs=${AB_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720 qwen2.5-7b:gptq-int4:1,30720}
    for rep in $(seq "${AB_REPS:-2}"); do
        for spec in $specs; do
            IFS=: read -r p q lens <<<"$spec"
            for arm in base this; do
                bin=$Q commit=${QINFER_COMMIT:-}
                [ "$arm" = base ] && bin=$PWD/build-base/qinfer commit=$base_commit
                [ -x "$bin" ] || continue
                QINFER_COMMIT=$commit QINFER_ASSETS=$PWD/assets "$bin" bench --preset "$p" --quant "$q" --input-lens "$lens" --gen "${AB_GEN:-2048}" ${AB_ARGS:-} --json "$OUT/ab-$arm-$p-$q-$rep.json" 2>&1 |
                    grep -E "^\| qwen" | sed "s/^/$arm /" | tee -a "$OUT/ab.log"
            done
        done
    done
    echo "-- ab: tok/s, $base_commit (base) vs this tree, alternated ${AB_REPS:-2} times"
    python3 - "$OUT" <<'PY'
import glob, json, sys, collections
rows = collections.defaultdict(lambda: {"base": [], "this": []})
for f in sorted(glob.glob(sys.argv[1] + "/ab-*.json")):
    arm = f.rsplit("/", 1)[1].split("-")[1]
    data = json.load(open(f))
    for r in data if isinstance(data, list) else data.get("rows", []):
        key = (r.get("model", "?"), r.get("quant", ""), r.get("input_len"))
        rows[key][arm].append(r.get("tok_s"))
print("| model | quant | input | base tok/s | this tok/s | change |")
print("|---|---|---|---|---|---|")
for (m, q, n), v in rows.items():
    b = [x for x in v["base"] if x]; t = [x for x in v["this"] if x]
    ch = f"{100 * (sum(t) / len(t) / (sum(b) / len(b)) - 1):+.2f}%" if b and t else "-"
    print(f"| {m} | {q} | {n} | {' / '.join(f'{x:.1f}' for x in b)} | {' / '.join(f'{x:.1f}' for x in t)} | {ch} |")
PY
fi
