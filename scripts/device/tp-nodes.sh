# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set; needs two GPUs.
# Tensor parallel across processes, the path that spans hosts (--nnodes, --node-rank, --master-addr: the TCP
# rendezvous, then NCCL between the processes), run as two processes on this host, one GPU each: their logits of a
# prompt against the same model at --tp 2 in one process and on one GPU. Prints the largest relative differences.
# Then node 1 is killed mid-run: node 0 must exit with an error (rc and its last line printed).
d=$(mktemp -d)
"$Q" synth --preset tiny-qwen2 --out "$d/m" >/dev/null 2>&1
toks=1,7,42,99,5,3,200,17,64,128,11
"$Q" logits --model "$d/m" --tokens $toks --out "$d/one.npy" --backend cuda 2>&1 | tail -1
"$Q" logits --model "$d/m" --tokens $toks --out "$d/tp2.npy" --backend cuda --tp 2 2>&1 | tail -1
node_pids=()
for r in 0 1; do
    CUDA_VISIBLE_DEVICES=$r timeout -k 10 120 "$Q" logits --model "$d/m" --tokens $toks --out "$d/nodes$r.npy" --backend cuda --tp 2 --nnodes 2 \
        --node-rank $r --master-addr 127.0.0.1:29517 >"$OUT/tp-nodes-$r.log" 2>&1 &
    node_pids+=($!)
done
# The two nodes only: a bare `wait` here also waited for device.sh's deadline packer (its sleep), so the stage held
# every call until the deadline (2026-11-30, call 2).
wait "${node_pids[@]}"
tail -n 2 "$OUT"/tp-nodes-[01].log
python3 - "$d" <<'PY' 2>&1 | tee -a "$OUT/tp-nodes.log"
import sys, numpy as np
d = sys.argv[1]
one = np.load(f"{d}/one.npy")
for name in ["tp2", "nodes0", "nodes1"]:
    try:
        x = np.load(f"{d}/{name}.npy")
        print(f"{name}: relative difference from one GPU {np.linalg.norm(x - one) / np.linalg.norm(one):.2e}")
    except Exception as e:
        print(f"{name}: {e}")
PY
# A node that goes away mid-run: node 1 is killed while both decode; node 0 must stop with one error line (NCCL's
# asynchronous error or QINFER_TP_TIMEOUT), not wait forever.
for r in 0 1; do
    CUDA_VISIBLE_DEVICES=$r QINFER_TP_TIMEOUT=20 timeout -k 10 150 "$Q" bench --model "$d/m" --input-lens 1 --gen 200 --repeat 3000 --tp 2 --nnodes 2 \
        --node-rank $r --master-addr 127.0.0.1:29518 >"$OUT/tp-nodes-kill-$r.log" 2>&1 &
    pids[r]=$!
done
# Node 0 prints its card line once both nodes are connected and loaded; node 1 dies a few seconds into the run.
for _ in $(seq 60); do
    grep -q "^bench: " "$OUT/tp-nodes-kill-0.log" && break
    sleep 1
done
sleep 3
# pids[1] is node 1's `timeout`: the qinfer process under it is what must die (killing timeout alone left it running,
# call 1 of 2026-11-30, and both nodes ran on).
pkill -KILL -P "${pids[1]}"
t_kill=$(date +%s)
wait "${pids[0]}"
rc0=$?
echo "node 0 after node 1 was killed: rc $rc0 after $(( $(date +%s) - t_kill )) s: $(grep -v '^\s*$' "$OUT/tp-nodes-kill-0.log" | tail -1)" | tee -a "$OUT/tp-nodes.log"
note "tp-nodes: $(tr '\n' ' ' <"$OUT/tp-nodes.log")"
rm -rf "$d"
