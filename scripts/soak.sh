#!/usr/bin/env bash
# A soak of `qinfer serve` on loopback: start the server, warm it up for 30 s, then SECONDS of 64 concurrent streaming
# clients (input 1000, output 256, the prompts again and again), sampling the server's RSS and GPU memory every 10 s.
# Every loop is bounded (the load by --duration and --timeout, the waits by counts). Writes into DIR: serve.log,
# steps.csv (the step log) and its summary, soak.log / soak.json (bench --serve), memory.csv (t_s,rss_kb,gpu_mib),
# result.txt (memory after warm-up and at the end, growth, failures), and `done` last.
#
# usage: scripts/soak.sh QINFER_BIN MODEL_DIR DIR SECONDS [PORT] [serve options...]
set -uo pipefail
q=$1 model=$2 dir=$3 secs=$4 port=${5:-8140}
shift 5 2>/dev/null || shift $#
mkdir -p "$dir"
rm -f "$dir/done"
here=$(dirname "$0")  # step_log.py is beside it (scripts/, or the copy a detached soak runs from)
"$q" serve --model "$model" --port "$port" --max-num-seqs 256 --max-queue 512 --step-log "$dir/steps.csv" "$@" >"$dir/serve.log" 2>&1 &
server=$!
up=0
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && { up=1; break; }
    kill -0 "$server" 2>/dev/null || break
    sleep 1
done
if [ $up = 0 ]; then
    echo "soak: the server did not come up: $(tail -1 "$dir/serve.log")" >"$dir/result.txt"
    kill "$server" 2>/dev/null
    touch "$dir/done"
    exit 1
fi
gpu_mem() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | awk -F', ' -v p="$server" '$1 == p {print $2}'; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status" 2>/dev/null; }
load() {  # label, then options
    local label=$1
    shift
    "$q" bench --serve "http://127.0.0.1:$port" --label "$label" --num-prompts 64 --input-len 1000 --output-len 256 --max-concurrency 64 \
        --json "$dir/$label.json" "$@" >>"$dir/soak.log" 2>&1
}
load warmup --duration 30 --timeout 120
t0=$(date +%s)
echo "t_s,rss_kb,gpu_mib" >"$dir/memory.csv"
(
    for _ in $(seq $((secs / 10 + 30))); do
        kill -0 "$server" 2>/dev/null || break
        echo "$(($(date +%s) - t0)),$(rss),$(gpu_mem)" >>"$dir/memory.csv"
        [ -f "$dir/load-done" ] && break
        sleep 10
    done
) &
sampler=$!
load soak --duration "$secs" --timeout $((secs + 120))
touch "$dir/load-done"
echo "$(($(date +%s) - t0)),$(rss),$(gpu_mem)" >>"$dir/memory.csv"
wait "$sampler"
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
python3 "$here/step_log.py" "$dir/steps.csv" >"$dir/steps-summary.txt" 2>&1
python3 - "$dir" <<'PY' >"$dir/result.txt" 2>&1
import csv, json, sys
d = sys.argv[1]
rows = [r for r in csv.DictReader(open(f"{d}/memory.csv")) if r["rss_kb"]]
first, last = rows[0], rows[-1]
def growth(k):
    a, b = float(first[k] or 0), float(last[k] or 0)
    return f"{a:.0f} -> {b:.0f} ({(b - a) / a:+.2%})" if a else "n/a"
soak = json.load(open(f"{d}/soak.json"))[-1]
print(f"soak {last['t_s']} s after a 30 s warm-up: RSS kB {growth('rss_kb')}, GPU MiB {growth('gpu_mib')}, "
      f"max RSS {max(float(r['rss_kb']) for r in rows):.0f} kB over {len(rows)} samples; requests {soak['requests']}, ok {soak['ok']}, "
      f"rejected {soak['rejected']}, failed {soak['failed']}, output tok/s {soak['output_tok_s']:.1f}")
PY
touch "$dir/done"
