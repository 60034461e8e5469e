#!/usr/bin/env bash
# qinfer serve stops gracefully on SIGTERM: it answers a request, then on the signal exits 0 having closed its step
# log (a line for the step and one for the request). Loopback, every wait bounded (60 s to listen, 60 s to stop).
set -u
q="$1"
tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $1"
    sed 's/^/    /' "$tmp/serve.log" | head -10
    exit 1
}
# The 0.5B layout from its config alone (random weights: --load-format dummy), its tokenizer from the assets.
"$q" synth --preset qwen2.5-0.5b --out "$tmp/m" --config-only >/dev/null || fail "synth --config-only"
"$q" serve --model "$tmp/m" --load-format dummy --backend cpu --port 0 --max-num-seqs 4 --step-log "$tmp/steps.csv" >"$tmp/serve.log" 2>&1 &
server=$!
port=
for _ in $(seq 600); do
    port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$tmp/serve.log")
    [ -n "$port" ] && break
    if ! kill -0 "$server" 2>/dev/null; then
        grep -q "without cpp-httplib" "$tmp/serve.log" && { echo "skipped: this qinfer has no HTTP server"; exit 0; }
        fail "the server exited before it listened"
    fi
    sleep 0.1
done
[ -n "$port" ] || fail "the server did not listen within 60 s"
"$q" bench --serve "http://127.0.0.1:$port" --num-prompts 1 --input-len 4 --output-len 2 --max-concurrency 1 --timeout 60 >"$tmp/load.log" 2>&1 ||
    { cat "$tmp/load.log"; fail "the request failed"; }
grep -q "| 1 | 1 | 1 | 0 | 0 |" "$tmp/load.log" || { cat "$tmp/load.log"; fail "the request did not come back ok"; }
kill -TERM "$server"
for _ in $(seq 600); do
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$server" 2>/dev/null && fail "still running 60 s after SIGTERM"
wait "$server"
rc=$?
server=
[ "$rc" -eq 0 ] || fail "exit status $rc after SIGTERM"
grep -q "stopping" "$tmp/serve.log" || fail "no stopping line"
grep -q "^step," "$tmp/steps.csv" || fail "no step line in the step log"
grep -q "^req,1,.*,4,0,2,length$" "$tmp/steps.csv" || { cat "$tmp/steps.csv"; fail "no line for the request in the step log"; }
echo "ok: served one request, stopped on SIGTERM with exit 0, step log closed ($(grep -c '^step,' "$tmp/steps.csv") steps)"
