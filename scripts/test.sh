#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: set up (idempotent), build, run the tests under ASan+UBSan,
# then the full suite (CPU tests, package consumer; [cuda] tests run where a GPU is present, else skip).
#   scripts/test.sh            all of it
#   scripts/test.sh --quick    skip the sanitizer build
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=$(nproc)
step() { printf '\n== %s\n' "$*"; }

step "setup"
scripts/setup.sh

if [ "${1:-}" != "--quick" ]; then
  step "tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU backend)"
  # -O1 -g1 (line tables): what sanitizer builds usually use. It halves the compile of a test translation unit
  # against -O2 -g (test_engine_batching.cpp: 73 s -> 40 s on a 2-core machine), and this build is most of CI.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
        -DINFER_SANITIZE=ON -DINFER_CUDA=OFF -DINFER_BUILD_EXAMPLES=OFF -DINFER_BUILD_BENCH=OFF \
        -DINFER_BUILD_SERVER=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -E package_consumer
fi

step "build (Release; CUDA backend when nvcc is present)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"

step "tests"
ctest --test-dir build --output-on-failure -j"$jobs"
