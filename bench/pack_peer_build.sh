#!/usr/bin/env bash
# Builds llama.cpp's CUDA programs (llama-bench, llama-batched-bench, llama-quantize) on this machine, from the
# source package ../shared/peers/prepare.sh put in .xfer/peers, with device.sh's flags (sm_90, Release) and a
# portable CPU target (AVX2; the CPU only quantizes files and drives the GPU here), and packs them into
# .xfer/peers/lcp-bin.tar.xz for bench/peer_session.sh: the device session then spends no 6 minutes building
# them. Takes about an hour on 2 cores.
#   bench/pack_peer_build.sh [BUILD_ROOT]      (default /tmp/lcp; the programs' RPATH names it)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
dest=${1:-/tmp/lcp}
src=$root/.xfer/peers/llama.cpp-src.tgz
[ -f "$src" ] || { echo "pack_peer_build.sh: no $src (run ../shared/peers/prepare.sh)" >&2; exit 1; }
mkdir -p "$dest"
[ -d "$dest/llama.cpp" ] || tar xzf "$src" -C "$dest"
cd "$dest/llama.cpp"
cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON >/dev/null
cmake --build build -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize
tar cJf "$root/.xfer/peers/lcp-bin.tar.xz" -C build bin
echo "$dest/llama.cpp/build" >"$root/.xfer/peers/lcp-bin.path"
ls -la "$root/.xfer/peers/lcp-bin.tar.xz"
