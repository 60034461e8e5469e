# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Waits (at most SOAK_WAIT seconds, default 570) for the soak that soak-start began in an earlier call of this warm
# machine, then copies its files to $OUT/soak/ and notes its result.
mkdir -p "$OUT/soak"
for _ in $(seq "${SOAK_WAIT:-570}"); do
    [ -f /tmp/qinfer-soak/done ] && break
    sleep 1
done
find /tmp/qinfer-soak -maxdepth 1 -type f -exec cp -t "$OUT/soak/" {} + 2>/dev/null
if [ -f /tmp/qinfer-soak/done ]; then
    note "soak: $(cat /tmp/qinfer-soak/result.txt)"
else
    note "soak: not done after ${SOAK_WAIT:-570} s (the files so far are in soak/)"
fi
