#!/usr/bin/env bash
# Installs the Debian packages qinfer needs when they are missing (Debian 12). Safe to run again.
set -euo pipefail
need=(cmake ninja-build g++ make pkg-config nlohmann-json3-dev libgtest-dev googletest libomp-dev clang
      libclang-rt-14-dev libpcre2-dev libutf8proc-dev python3 git nodejs npm bible-kjv fortune-mod fortunes fortunes-zh
      fortunes-ru)
missing=()
for p in "${need[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
