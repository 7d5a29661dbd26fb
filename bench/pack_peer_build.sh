#!/usr/bin/env bash
# Builds llama.cpp's CUDA programs (llama-bench, llama-batched-bench, llama-quantize) on this machine, from the
# source package ../shared/peers/prepare.sh put in .xfer/peers, with device.sh's flags (sm_90, Release) and a
# portable CPU target (AVX2; the CPU only quantizes files and drives the GPU here), and packs them into
# .xfer/peers/lcp-bin.tar.xz for bench/peer_session.sh: the device session then spends no 6 minutes building
# them. Took 40 minutes on 2 cores (2026-12-06); the archive is 42 MB, so carry it without the source package
# (its own call: device.sh, make_dummy_gguf.py, the gguf wheel and lcp-bin.*, then `cp -r .xfer/peers /root/peers`).
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
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined >/dev/null  # libcuda.so.1 is the driver: the GPU machine has it, this one only its stub
cmake --build build -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize
(cd build && tar cJf "$root/.xfer/peers/lcp-bin.tar.xz" bin/llama-bench bin/llama-batched-bench bin/llama-quantize bin/*.so*)
echo "$dest/llama.cpp/build" >"$root/.xfer/peers/lcp-bin.path"
ls -la "$root/.xfer/peers/lcp-bin.tar.xz"
