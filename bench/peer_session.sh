#!/usr/bin/env bash
# Issue 19's device session as one detached job, so that no device time is lost between calls: llama.cpp's
# CUDA build (niced) beside infer's GGUF matmul bench and then its whole [cuda] suite, then the 8B-shaped GGUF
# files, the side-by-side decode (gpu_suite.sh peer-decode) and the ncu profile (peer-profile). Everything is
# logged into $SESSION_OUT (not the call's $OUT, which every call empties).
#   1. carrying .deps and .xfer/peers:  source .deps/unpack.sh && mkdir -p /opt/deps && cp .deps/unpack.sh /opt/deps/ &&
#      rm -rf /root/peers && cp -r .xfer/peers /root/peers
#   2-3. the default model's two parts (../shared/device/stage.sh), one call each;
#   4. carrying .xfer/gpu-build.tar.xz (bench/pack_gpu_build.sh, at the commit under test):
#      source /opt/deps/unpack.sh && export INFER_COMMIT=<sha> && bash bench/gpu_suite.sh unpack && mkdir -p models &&
#      ln -sf /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf models/ && export SESSION_OUT=/root/session &&
#      bench/device_job.sh start peers bash bench/peer_session.sh && bench/device_job.sh wait peers 560 /root/session
#   5+. bench/device_job.sh wait peers 560 /root/session, until it ends.
# About 13 minutes of device time at 2026-12-06 (llama.cpp's build ~6, the 8B files ~1.5, peer-decode ~4).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${SESSION_OUT:?set SESSION_OUT to the results folder on the device}"
export OUT=$SESSION_OUT
mkdir -p "$OUT"
build=${BUILD:-build-gpu}
stamp() { echo "=== $(date -u +%H:%M:%S) $*"; }
rm -f /root/lcp.done
nice -n 10 bash /root/peers/device.sh build >"$OUT/lcp-build.log" 2>&1 &
lcp=$!
stamp "llama.cpp build started"
# GPU timings first, while only the (niced) compiler competes for the CPUs.
"$build"/tests/test_cuda "bench: GGUF matmul paths*" >"$OUT/gguf-matmul-paths.log" 2>&1
stamp "GGUF matmul paths bench: status $?"
# The [cuda] suite's CPU reference on a few threads beside the build; it must end before the timed runs below.
OPENBLAS_NUM_THREADS=6 nice -n 5 "$build"/tests/test_cuda "[cuda]" --durations yes >"$OUT/test-cuda.log" 2>&1 &
tests=$!
wait $lcp
stamp "llama.cpp build: status $?"
wait $tests
stamp "[cuda] suite: status $?; $(tail -n 2 "$OUT/test-cuda.log" | tr '\n' ' ')"
bash /root/peers/device.sh models models/SmolLM2-135M-Instruct.Q4_1.gguf >"$OUT/peer-models.log" 2>&1 ||
  { stamp "peer models failed"; tail -20 "$OUT/peer-models.log"; exit 1; }
stamp "8B files made"
bash bench/gpu_suite.sh peer-decode >"$OUT/peer-decode.log" 2>&1
stamp "peer-decode: status $?"
bash bench/gpu_suite.sh peer-profile >"$OUT/peer-profile.log" 2>&1
stamp "peer-profile: status $?"
