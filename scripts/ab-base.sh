#!/usr/bin/env bash
# Exports the source of COMMIT into .ab-base/ (git-ignored) for the device's `ab` stage, which builds it beside this
# tree and alternates their rows: carry .ab-base with the device call.
# usage: scripts/ab-base.sh COMMIT
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:?usage: scripts/ab-base.sh COMMIT}
rm -rf .ab-base
mkdir -p .ab-base
git archive "$commit" src CMakeLists.txt cmake | tar -x -C .ab-base  # its synth finds tokenizers through QINFER_ASSETS
git rev-parse --short "$commit" >.ab-base/COMMIT
du -sh .ab-base
