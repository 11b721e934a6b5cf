#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test under ctest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/install-deps.sh
tools/install-test-deps.sh
tools/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
# Again under ASan and UBSan, with the fuzz targets (docs/testing.md).
tools/test-sanitize.sh
