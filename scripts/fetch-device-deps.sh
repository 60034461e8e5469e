#!/usr/bin/env bash
# The GPU machine reaches no package registry. Debian's packages that the build needs (nlohmann-json, googletest, ...)
# are downloaded here as .deb files into .deps/ (git-ignored) and carried there by the device tool; device.sh unpacks
# them. Nothing is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
# cpp-httplib (qinfer serve) with the headers its own header includes and the Brotli libraries it links.
for p in nlohmann-json3-dev libgtest-dev googletest libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
    libcpp-httplib-dev libcpp-httplib0.11 libssl-dev zlib1g-dev libbrotli-dev libbrotli1; do
    ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls -la
