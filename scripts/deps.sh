#!/usr/bin/env bash
# Installs the Debian packages qinfer needs when they are missing (Debian 12). Safe to run again. Tools are checked by
# command (a machine may have them from elsewhere, e.g. node), libraries and data by package.
set -euo pipefail
missing=()
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need_pkg() { dpkg -s "$1" >/dev/null 2>&1 || missing+=("$1"); }
need_cmd cmake cmake
need_cmd ninja ninja-build
need_cmd g++ g++
need_cmd clang++ clang
need_cmd python3 python3
need_cmd git git
need_cmd bc bc
need_cmd node nodejs
need_cmd npm npm
need_cmd bible bible-kjv
need_cmd pkg-config pkg-config
python3 -c 'import numpy' 2>/dev/null || /usr/bin/python3 -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
for p in nlohmann-json3-dev libgtest-dev googletest libomp-dev libclang-rt-14-dev libpcre2-dev libutf8proc-dev libgd-dev libcpp-httplib-dev \
         fortunes fortunes-zh fortunes-ru; do
    need_pkg "$p"
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
