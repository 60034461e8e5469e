# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Starts scripts/soak.sh detached (its own process session, so it outlives this command while the machine stays warm)
# on the 7B synthesized checkpoint for SOAK_SECONDS (default 600) into /tmp/qinfer-soak; SOAK_ARGS: more serve options
# (e.g. --gpu-memory-utilization 0.5, leaving room for GPU tests beside it). The soak-collect stage of the next call
# waits for it and brings its files back.
p=${SERVE_PRESET:-qwen2.5-7b}
d=${QINFER_CACHE:-$HOME/.cache/qinfer}/synth/$p-bf16
[ -f "$d/tokenizer.json" ] || "$Q" synth --preset "$p" --out "$d" >/dev/null
rm -rf /tmp/qinfer-soak
mkdir -p /tmp/qinfer-soak/bin
# It runs from copies: the next call's copy of the tree (or a build) must not change a script or binary in use.
cp scripts/soak.sh scripts/step_log.py "$Q" /tmp/qinfer-soak/bin/
mkdir -p /tmp/qinfer-soak/bin/lib  # and the carried libraries (cpp-httplib, utf8proc, ...): the next call replaces .deps
cp -a .deps/root/usr/lib/x86_64-linux-gnu/. /tmp/qinfer-soak/bin/lib/ 2>/dev/null
# shellcheck disable=SC2086  # SOAK_ARGS splits into words on purpose
LD_LIBRARY_PATH=/tmp/qinfer-soak/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} setsid bash /tmp/qinfer-soak/bin/soak.sh /tmp/qinfer-soak/bin/qinfer "$d" /tmp/qinfer-soak "${SOAK_SECONDS:-600}" 8140 ${SOAK_ARGS:-} >/tmp/qinfer-soak/runner.log 2>&1 </dev/null &
note "soak-start: scripts/soak.sh detached for ${SOAK_SECONDS:-600} s at $(date +%T)"
