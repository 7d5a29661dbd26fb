#!/usr/bin/env bash
# Packs this machine's CUDA build for the GPU machine, so that a 30-minute device session does not spend 4-6
# of its minutes building (`gpu_suite.sh build` took 359 s on 2026-12-05): .xfer/gpu-build.tar.xz with the
# programs and tests `gpu_suite.sh` runs and a manifest (commit, CUDA, the source folder compiled into the
# tests). On the device, `gpu_suite.sh unpack` puts them where `gpu_suite.sh build` would.
#   bench/pack_gpu_build.sh [BUILD_DIR]     (default build; Release, CUDA for sm_90, as scripts/setup.sh makes it)
# The binaries are portable x86-64 (no -march) and link CUDA 13's and .deps' shared libraries, which the GPU
# machine has (source .deps/unpack.sh there). Carry .xfer/gpu-build.tar.xz in the call that unpacks it, beside
# .deps when the two fit one call's 64 MiB carry (20 + 35 MB on 2026-12-06): otherwise unpack .deps in a call
# of its own (`source .deps/unpack.sh && cp .deps/unpack.sh /opt/deps/`), then `source /opt/deps/unpack.sh` in
# the call that carries the archive. xz, not gzip, with a dictionary larger than all the programs together:
# they share most of their bytes (the CUDA kernels are linked into each, ~38 MB a program at e305708), which
# only a window spanning files finds. xz -6's 8 MiB one no longer did: test_cuda, test_nccl, infer-generate and
# the two bench programs packed into 38 MB with it and into 12 MB with a 192 MiB one (one thread, ~50 s on
# 2 cores; xz's threads would cut the stream into blocks that each start with an empty dictionary).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
build=${1:-build}
# PACK_TARGETS="a b ..." packs only those (the peer session needs test_cuda, infer-bench-latency and
# infer-bench-throughput: ~17 MB, which fits one call beside .deps and .xfer/peers).
targets=(test_cuda test_rounding_noise infer-bench-latency infer-bench-throughput infer-serve infer-bench-serve
         infer-offline-batch infer-generate infer-build)
[ -z "${PACK_TARGETS:-}" ] || read -r -a targets <<<"$PACK_TARGETS"
[ -z "$(git status --porcelain --untracked-files=no)" ] ||
  { echo "pack_gpu_build.sh: commit first: the manifest names the commit the binaries are built from" >&2; exit 1; }
grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt" &&
  grep -q '^INFER_CUDA_ARCHS:STRING=90' "$build/CMakeCache.txt" ||
  { echo "pack_gpu_build.sh: $build is not a Release build with CUDA for sm_90" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null
files=()
for t in "${targets[@]}"; do
  if [ -x "$build/bin/$t" ]; then files+=("bin/$t")
  elif [ -x "$build/tests/$t" ]; then files+=("tests/$t")
  else echo "pack_gpu_build.sh: $t was not built" >&2; exit 1; fi
done
{
  echo "commit=$(git rev-parse --short HEAD)"
  echo "source_dir=$root"
  echo "cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$build/gpu-build.manifest"
mkdir -p .xfer
grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
rm -f .xfer/gpu-build.tgz  # the gzip archive earlier versions made
tar cf - -C "$build" gpu-build.manifest "${files[@]}" | xz -T1 --lzma2=preset=6,dict=192MiB >.xfer/gpu-build.tar.xz
echo "packed $(du -h .xfer/gpu-build.tar.xz | cut -f1): .xfer/gpu-build.tar.xz"
cat "$build/gpu-build.manifest"
