#!/usr/bin/env bash
# The first call of a device session, sourced from the project root on the GPU machine with .xfer/deps-run,
# .xfer/mpi-run and .xfer/gpu-build.tar.xz carried (and .xfer/peers for a llama.cpp session):
#   source bench/device_unpack.sh COMMIT [peers]
# unpacks the runtime libraries (bench/pack_runtime_deps.sh) and Open MPI's packages into /opt/deps, leaves
# /opt/deps/unpack.sh for the session's later calls (`source /opt/deps/unpack.sh`: the same environment, MPI
# included), unpacks the programs (gpu_suite.sh unpack, checked against COMMIT) and, with `peers`, starts
# llama.cpp's CUDA build in the background (bench/peer_session.sh waits for it).
_commit=${1:?usage: source bench/device_unpack.sh COMMIT [peers]}
source .xfer/deps-run/unpack.sh || return 1
for _f in .xfer/mpi-run/*.deb; do dpkg -x "$_f" /opt/deps || return 1; done
cp .xfer/deps-run/unpack.sh /opt/deps/unpack.sh && echo 'export OPAL_PREFIX=/opt/deps/usr' >>/opt/deps/unpack.sh
export OPAL_PREFIX=/opt/deps/usr
if [ "${2:-}" = peers ]; then
  rm -rf /root/peers && cp -r .xfer/peers /root/peers && touch /root/lcp.started &&
    (setsid nohup bash /root/peers/device.sh build >/root/lcp-build.log 2>&1 &)
  echo "llama.cpp build started in the background"
fi
export INFER_COMMIT=$_commit
bash bench/gpu_suite.sh unpack | tail -n 2
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
