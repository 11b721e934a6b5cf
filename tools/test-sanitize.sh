#!/usr/bin/env bash
# The whole test suite again under AddressSanitizer and UBSan, with the libFuzzer targets:
# a second, CPU-only tree (build-sanitize/) built with clang and -DLS_SANITIZE=ON, where every
# library, actor, tool and test is instrumented, then ctest there (each fuzz target runs
# LS_FUZZ_SECONDS on its committed corpus). tools/test.sh runs it after the normal suite;
# docs/testing.md says what it checks and what it costs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=build-sanitize
CC=clang cmake -S . -B "$dir" -DLS_WITH_CUDA=OFF -DLS_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLS_FUZZ_SECONDS="${LS_FUZZ_SECONDS:-15}" >/dev/null
# LeakSanitizer is off, in the build (msggen, run by it) and in the tests: the actors and tools
# end on Shutdown or exit without freeing what the process holds, by design, so its reports at
# exit would be noise. Memory errors and undefined behaviour fail the process they happen in:
# UBSan aborts (-fno-sanitize-recover), ASan exits non-zero.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cmake --build "$dir" -j"$(nproc)"
# No test is excluded: everything that runs in build/ runs here too (the GPU tests are not
# built without CUDA, in either tree).
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 600
