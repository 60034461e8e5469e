#!/usr/bin/env bash
# Configures and builds qinfer in ./build (with the CUDA backend when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
