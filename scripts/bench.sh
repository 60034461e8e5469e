#!/usr/bin/env bash
# Builds qinfer and runs the main job: `qinfer bench` on the built-in default (Qwen2.5-0.5B shape, synthetic
# weights), on the GPU when there is one, else on the CPU with shorter inputs. Extra arguments go to qinfer bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
build/qinfer bench "$@"
