# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# `qinfer serve` under load on loopback, measured by `qinfer bench --serve` (every loop bounded in count and time):
# SERVE_PRESET (default qwen2.5-7b), 512 streaming requests of input 1000 / output 256 at SERVE_CONC (default 64,256)
# concurrent clients; overload: 2000 requests at once against --max-queue 512; the prefix cache: 64 questions after
# a 2000-token shared prompt, with and without --no-prefix-cache; a soak of SOAK_SECONDS (default 0: none) at 64
# clients with the server's RSS and GPU memory after warm-up and at the end. SERVE_OVERLOAD=0 leaves the overload out;
# SERVE_PREFIX=0 the prefix-cache pair; SERVE_MAIN=0 the 512 requests (a soak alone). Each server writes a step log
# (serve-steps-NAME.csv, summed up by scripts/step_log.py into serve-load.log). SERVE_ARGS: more options for every server (e.g. --max-batch-tokens 4096).
p=${SERVE_PRESET:-qwen2.5-7b}
d=${QINFER_CACHE:-$HOME/.cache/qinfer}/synth/$p-bf16
[ -f "$d/tokenizer.json" ] || "$Q" synth --preset "$p" --out "$d" >/dev/null
port=${SERVE_PORT:-8123}  # stages side by side on one host need a port each
start_server() {  # a name for its logs, then options for serve
    local name=$1
    shift
    steps="$OUT/serve-steps-$name.csv"
    # shellcheck disable=SC2086  # SERVE_ARGS splits into words on purpose
    "$Q" serve --model "$d" --port $port --max-queue 512 --step-log "$steps" ${SERVE_ARGS:-} "$@" >"$OUT/serve-$name.log" 2>&1 &
    server=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
        kill -0 "$server" 2>/dev/null || break  # it exited: its log says why
        sleep 1
    done
    note "serve-load: the server did not come up: $(tail -1 "$OUT"/serve-*.log | tail -1)"
    return 1
}
stop_server() {  # SIGTERM: running requests finish, the step log is closed; then its summary
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    python3 scripts/step_log.py "$steps" >"${steps%.csv}-summary.txt" 2>&1 && cat "${steps%.csv}-summary.txt" >>"$OUT/serve-load.log"
}
load() {  # label, then options for bench --serve
    local label=$1
    shift
    "$Q" bench --serve "http://127.0.0.1:$port" --label "$label" --timeout 300 --json "$OUT/serve-$label.json" "$@" 2>&1 | tee -a "$OUT/serve-load.log" |
        grep -E "^\| |first failure"
}
if { [ "${SERVE_MAIN:-1}" = 1 ] || [ "${SERVE_OVERLOAD:-1}" = 1 ] || [ "${SOAK_SECONDS:-0}" -gt 0 ]; } && start_server main --max-num-seqs 256; then
    [ "${SERVE_MAIN:-1}" = 1 ] && load "$p" --num-prompts 512 --input-len 1000 --output-len 256 --max-concurrency "${SERVE_CONC:-64,256}"
    [ "${SERVE_OVERLOAD:-1}" = 1 ] && load overload --num-prompts 2000 --input-len 100 --output-len 64 --max-concurrency 2000
    curl -s "http://127.0.0.1:$port/metrics" >"$OUT/serve-metrics.txt"
    grep -E "^qinfer_(prefix_cache_hit_rate|requests_rejected_total|preemptions_total|kv_blocks_total|scheduler_)" "$OUT/serve-metrics.txt"
    if [ "${SOAK_SECONDS:-0}" -gt 0 ]; then
        load soak-warmup --num-prompts 64 --input-len 1000 --output-len 256 --max-concurrency 64 --duration 30
        # The server's own GPU memory (its process's, whichever GPU it was given).
        gpu_mem() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$server" '$1 == p {print $2}'; }
        rss0=$(awk '/VmRSS/ {print $2}' /proc/$server/status); gpu0=$(gpu_mem)
        load soak --num-prompts 64 --input-len 1000 --output-len 256 --max-concurrency 64 --duration "$SOAK_SECONDS" --timeout $((SOAK_SECONDS + 60))
        rss1=$(awk '/VmRSS/ {print $2}' /proc/$server/status); gpu1=$(gpu_mem)
        note "soak ${SOAK_SECONDS}s: RSS ${rss0} -> ${rss1} kB, GPU memory ${gpu0} -> ${gpu1} MiB"
    fi
    stop_server
fi
# The prefix-cache pair, each on a server of its own (its step log holds that run alone).
for cache in on off; do
    [ "${SERVE_PREFIX:-1}" = 1 ] || break
    flags=(--max-num-seqs 256)
    label=prefix-cache
    [ $cache = off ] && { flags+=(--no-prefix-cache); label=prefix-cache-off; }
    if start_server "prefix-$cache" "${flags[@]}"; then
        load "$label" --num-prompts 64 --prefix-len 2000 --input-len 24 --output-len 16 --max-concurrency 8 --seed 3
        stop_server
    fi
done
