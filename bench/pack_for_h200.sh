#!/usr/bin/env bash
# Copies the binaries a device run needs, and the Abseil/GoogleTest libraries
# they link, into .device-carry/ (ignored by git; name it in the run's carry).
set -euo pipefail
rm -rf .device-carry && mkdir -p .device-carry/lib
for binary in "$@"; do cp "build/$binary" .device-carry/; done
bash ../shared/device/bundle-libs.sh .device-carry/lib $(find .device-carry -maxdepth 1 -type f) >/dev/null
du -sh .device-carry
