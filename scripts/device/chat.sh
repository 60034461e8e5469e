# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
python3 scripts/make_chat_goldens.py "$OUT/chat_goldens.json" 2>&1 | tail -2
