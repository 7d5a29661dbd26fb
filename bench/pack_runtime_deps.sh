#!/usr/bin/env bash
# The runtime half of .deps (../shared/device/prepare.sh), for device calls that run packed binaries and build
# nothing: .xfer/deps-run/ with the shared libraries' .deb files only (9.5 MB against .deps' 20 MB; no headers,
# no Catch2, no OpenBLAS development package) and the same unpack.sh. It lets one call carry the runtime,
# .xfer/peers and a PACK_TARGETS pack of the peer session's programs together (55 MB with the tree; with .deps
# instead the call was refused as over the 64 MiB a call carries). On the device: source .xfer/deps-run/unpack.sh && mkdir -p /opt/deps &&
# cp .xfer/deps-run/unpack.sh /opt/deps/   (later calls: source /opt/deps/unpack.sh).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ -f .deps/unpack.sh ] || { echo "pack_runtime_deps.sh: no .deps (run ../shared/device/prepare.sh first)" >&2; exit 1; }
rm -rf .xfer/deps-run && mkdir -p .xfer/deps-run/debs
grep -qx '/.xfer/' .git/info/exclude 2>/dev/null || echo '/.xfer/' >>.git/info/exclude
for p in libopenblas0-pthread libopenblas0 libssl3 libpcre2-8-0 libbrotli1 zlib1g libfmt9 libspdlog1.10 libxxhash0 \
         libcpp-httplib0.11; do
  ls .deps/debs/"${p}"_*.deb >/dev/null 2>&1 || { echo "pack_runtime_deps.sh: .deps has no $p" >&2; exit 1; }
  cp .deps/debs/"${p}"_*.deb .xfer/deps-run/debs/
done
# Open MPI's runtime, which .deps lacks, in a folder of its own (.xfer/mpi-run, ~6 MB: the first call's carry has
# no room for it beside the build and llama.cpp): the programs that take --data-parallel or --tensor-parallel-size
# link libmpi and do not start without it, and mpirun (openmpi-bin) launches the one-GPU MPI runs. On the device,
# after deps-run: for f in .xfer/mpi-run/*.deb; do dpkg -x "$f" /opt/deps; done; export OPAL_PREFIX=/opt/deps/usr;
# mpirun is /opt/deps/usr/bin/mpirun.openmpi (dpkg -x makes no alternatives link). From Debian's archive.
rm -rf .xfer/mpi-run && mkdir -p .xfer/mpi-run
( cd .xfer/mpi-run &&
  apt-get download -q libopenmpi3 openmpi-bin openmpi-common libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 \
    libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 \
    libnuma1 libmunge2 libxnvctrl0 2>&1 | grep -v '^W: Download is performed unsandboxed' ) >/dev/null
cp .deps/unpack.sh .xfer/deps-run/
du -sh .xfer/deps-run | cut -f1 | xargs echo "pack_runtime_deps.sh: .xfer/deps-run ready, size"
du -sh .xfer/mpi-run | cut -f1 | xargs echo "pack_runtime_deps.sh: .xfer/mpi-run ready, size"
