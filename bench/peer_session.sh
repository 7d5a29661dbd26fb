#!/usr/bin/env bash
# Issue 19's device session as one detached job, so that no device time is lost between calls: llama.cpp's
# CUDA build (niced) beside infer's GGUF matmul bench and then its whole [cuda] suite, then the 8B-shaped GGUF
# files, the side-by-side decode (gpu_suite.sh peer-decode) and the ncu profile (peer-profile). Everything is
# logged into $SESSION_OUT (not the call's $OUT, which every call empties).
#   0. optionally, on this machine: bench/pack_peer_build.sh (llama.cpp built here ahead, into .xfer/peers);
#   1. carrying .deps and .xfer/peers (or, with llama.cpp built ahead, .xfer/peers without its source package, in a
#      call of its own: the two are over the 64 MiB a call carries):  source .deps/unpack.sh && mkdir -p /opt/deps &&
#      cp .deps/unpack.sh /opt/deps/ && rm -rf /root/peers && cp -r .xfer/peers /root/peers
#   2-3. the default model's two parts (../shared/device/stage.sh), one call each;
#   4. carrying .xfer/gpu-build.tar.xz (bench/pack_gpu_build.sh, at the commit under test):
#      source /opt/deps/unpack.sh && export INFER_COMMIT=<sha> && bash bench/gpu_suite.sh unpack && mkdir -p models &&
#      ln -sf /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf models/ && export SESSION_OUT=/root/session &&
#      bench/device_job.sh start peers bash bench/peer_session.sh && bench/device_job.sh wait peers 560 /root/session
#   5+. bench/device_job.sh wait peers 560 /root/session, until it ends.
# About 13 minutes of device time at 2026-12-06 with llama.cpp built on the device (~6 of them), ~8 with it built ahead.
# Three calls instead (2026-12-06, twelfth session; 10 minutes): the first carries .xfer/deps-run
# (bench/pack_runtime_deps.sh: .deps' runtime libraries only), .xfer/peers and a PACK_TARGETS="test_cuda
# infer-bench-latency infer-bench-throughput" pack (55 MB with the tree; with .deps instead the call was refused
# as over its 64 MiB), unpacks them, starts
# llama.cpp's build in the background (`touch /root/lcp.started; setsid nohup bash /root/peers/device.sh build
# &`) and runs the GEMV tests and paths bench itself; the next two carry the model's parts, the second starting
# this script with SKIP_PATHS=1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${SESSION_OUT:?set SESSION_OUT to the results folder on the device}"
export OUT=$SESSION_OUT
mkdir -p "$OUT"
build=${BUILD:-build-gpu}
stamp() { echo "=== $(date -u +%H:%M:%S) $*"; }
prebuilt=0
if [ -f /root/lcp.started ]; then
  # llama.cpp's build was started by an earlier call of this session (`nohup bash /root/peers/device.sh build &`
  # and `touch /root/lcp.started`), so that it ran while the model's parts were carried: wait for it below.
  stamp "llama.cpp build started earlier: $( [ -f /root/lcp.done ] && echo "done, status $(cat /root/lcp.done)" || echo running)"
elif [ -f /root/peers/lcp-bin.tar.xz ]; then
  rm -f /root/lcp.done
  # llama.cpp built ahead from the same source and flags (bench/pack_peer_build.sh): 6 minutes of device time
  # saved. Its build tree's RPATH names the folder it was built in, so the programs go back there.
  src=$(cat /root/peers/lcp-bin.path)
  mkdir -p "$src" /root/lcp/llama.cpp && tar xJf /root/peers/lcp-bin.tar.xz -C "$src" &&
    ln -sfn "$src" /root/lcp/llama.cpp/build && prebuilt=1
  missing=$(ldd "$src"/bin/llama-bench "$src"/bin/libggml-cuda.so | grep "not found" | sort -u)
  if [ $prebuilt = 1 ] && [ -z "$missing" ]; then
    echo 0 >/root/lcp.done
    stamp "llama.cpp built ahead: unpacked"
  else
    prebuilt=0
    rm -f /root/lcp/llama.cpp/build
    stamp "llama.cpp built ahead does not run here (${missing:-unpack failed}); building it"
    nice -n 10 bash /root/peers/device.sh build >"$OUT/lcp-build.log" 2>&1 &
  fi
else
  rm -f /root/lcp.done
  nice -n 10 bash /root/peers/device.sh build >"$OUT/lcp-build.log" 2>&1 &
  stamp "llama.cpp build started"
fi
# GPU timings first, while at most the (niced) compiler competes for the CPUs. SKIP_PATHS=1: an earlier call ran it.
if [ -z "${SKIP_PATHS:-}" ]; then
  "$build"/tests/test_cuda "bench: GGUF matmul paths*" >"$OUT/gguf-matmul-paths.log" 2>&1
  stamp "GGUF matmul paths bench: status $?"
fi
# The [cuda] suite's CPU reference on part of the CPUs, beside llama.cpp's build or the 8B files' making;
# both end before the timed runs below.
# CUDA_TESTS: a Catch2 filter for a shorter session (e.g. "[gemm],GPU decoder*"); the whole [cuda] suite by default.
OPENBLAS_NUM_THREADS=8 nice -n 5 "$build"/tests/test_cuda "${CUDA_TESTS:-[cuda]}" --durations yes >"$OUT/test-cuda.log" 2>&1 &
tests=$!
if [ $prebuilt = 0 ]; then
  while [ ! -f /root/lcp.done ]; do sleep 2; done
  stamp "llama.cpp build: status $(cat /root/lcp.done)"
fi
bash /root/peers/device.sh models models/SmolLM2-135M-Instruct.Q4_1.gguf >"$OUT/peer-models.log" 2>&1 ||
  { stamp "peer models failed"; tail -20 "$OUT/peer-models.log"; }
stamp "8B files: $(ls /root/peer 2>/dev/null | tr '\n' ' ')"
wait $tests
stamp "[cuda] suite: status $?; $(tail -n 2 "$OUT/test-cuda.log" | tr '\n' ' ')"
bash bench/gpu_suite.sh peer-decode >"$OUT/peer-decode.log" 2>&1
stamp "peer-decode: status $?"
# AFTER: the gpu_suite.sh modes run after peer-decode (default: the ncu profile, peer-profile), e.g.
# AFTER="early-ab" for issue 16's A/B in the same session.
for mode in ${AFTER-peer-profile}; do
  bash bench/gpu_suite.sh "$mode" >"$OUT/$mode.log" 2>&1
  stamp "$mode: status $?"
done
