#!/usr/bin/env bash
# The GPU machine's run, in phases that fit the device tool's 10-minute calls:
#   bench/gpu_suite.sh build     configure + build the [cuda] tests and the benchmarks (Release, sm_90)
#                                into $BUILD (default build-gpu)
#   bench/gpu_suite.sh unpack    instead of build: the same programs built on your machine
#                                (bench/pack_gpu_build.sh; carry .xfer/gpu-build.tar.xz) put into $BUILD, the
#                                source folder their tests were compiled with linked to this one
#   bench/gpu_suite.sh test [PART]  the [cuda] tests with the suite's fixed seeds: all of them (~180 s on the
#                                H200 at c9c0352), or one PART: ops (kernels, decoders, sampling), engines (the
#                                engines on dummy models), smollm2 (the engines and infer::LLM on SmolLM2, most of
#                                it the CPU reference's replay), quant (the FP8, INT8 and INT4 kernels and engines, and the engine files)
#   bench/gpu_suite.sh reference ["T.."]  the [cuda] engine tests' CPU reference (replay_greedy of nine SmolLM2
#                                prompts) timed at OpenBLAS thread counts T (default: the quota or the cores, 8, 4)
#   bench/gpu_suite.sh repeat N  the whole [cuda] suite N times in a row with the fixed seeds, a log per run
#   bench/gpu_suite.sh fp8       --quantizer fp8 beside bf16, Llama-3-8B dummy: batch-1 decode, 1024 x (128, 128)
#   bench/gpu_suite.sh engine-file  cold start from an engine file (infer-build --backend cuda, static engine,
#                                Shape {1, 512, 128}), Llama-3-8B dummy, fp8 then bf16: build, then two runs of
#                                infer-bench-latency --engine-file (its cold start: weights on the device, graphs,
#                                first token); files under $ENGINE_DIR (default /root/engines), removed after
#   bench/gpu_suite.sh fp8-steady  issue 18's throughput as TensorRT-LLM measures it, fp8 then bf16 in one run:
#                                30,000 x (128, 128) and 3,000 x (1000, 1000), all queued at once (~15 min on
#                                the H200 at 2162603: start it detached, gpu_session.sh)
#   bench/gpu_suite.sh gemm-cap  the prefill's GEMMs at M = 2048 with cuBLASLt's heuristic pick against picks timed
#                                at the power cap (GemmTuning::measured_at_cap): the [gemm] tests, the bench, then
#                                the TTFT of a 2,048-token prompt with INFER_GEMM_SUSTAINED_TUNE=0, 1, alternating
#   bench/gpu_suite.sh decode-ab Llama-3-8B batch-1 decode with the GEMVs launched plainly and chained (the
#                                default; INFER_GEMV_CHAIN=0, 1; gemv_split.cuh), alternating: bf16 twice, fp8 twice
#   bench/gpu_suite.sh baseline-ab  Llama-3-8B batch-1 decode, bf16 and FP8, with this build and with an earlier
#                                one's infer-bench-latency ($BASELINE/bin, default /root/stage/baseline: a tgz of
#                                an earlier pack's bin/infer-bench-latency, unpacked there), alternating, two runs
#                                each: a change that has no switch, measured against its parent on one machine
#   bench/gpu_suite.sh kv-fp8    Llama-3-8B bf16 decode with the KV cache in bf16 and in FP8 (--kv-cache-dtype),
#                                alternating: batch 1 (512 + 128, two runs each) and batch 64 with 2,048-token
#                                contexts (where the decode step reads as many KV bytes as weight bytes)
#   bench/gpu_suite.sh quantizers  Llama-3-8B batch-1 decode (512 + 128) with each quantizer the GPU runs: bf16,
#                                fp8, int8, int4, in turn, two runs each
#   bench/gpu_suite.sh fp8-ab    Llama-3-8B FP8 batch-1 decode with the FP8 GEMV on the tensor cores (the default)
#                                and on the CUDA cores (INFER_FP8_GEMV=cuda_cores), alternating, two runs each
#   bench/gpu_suite.sh profile   every kernel of an 8B bf16 prefill (2048 tokens) and of a batch-1 decode step,
#                                bf16 and FP8, timed alone by ncu (eager),
#                                summed per kernel and per launch order
#   bench/gpu_suite.sh bf16-ab   Llama-3-8B bf16 batch-1 decode with bf16_gemv on the CUDA cores (INFER_BF16_GEMV=
#                                cuda_cores) and on the tensor cores (the default), alternating, two runs each; then
#                                ncu of a decode step with the tensor-core kernel
#   bench/gpu_suite.sh batch-ab  Llama-3-8B decode at batch 4 and 8: bf16 with cuBLASLt past one row (INFER_BF16_GEMV=
#                                cuda_cores) against the tensor-core GEMV up to 8 rows (the default), FP8's GEMV on the
#                                CUDA cores against the tensor cores (the default)
#   bench/gpu_suite.sh profile-quant  each kernel of a batch-1 decode step under ncu with fp8 (its GEMV on the CUDA
#                                cores, then on the tensor cores), int8 and int4
#   bench/gpu_suite.sh seeds N.. the [cuda] tests once per base seed given (INFER_TEST_SEED=N; "default"
#                                for the fixed seeds), each run's log in $OUT/cuda-tests-seed-N.log;
#                                PART=ops|engines|smollm2 in the environment picks one part
#   bench/gpu_suite.sh bench     attention kernel benchmarks, then infer-bench-latency / -throughput on the
#                                Llama-3-8B and Qwen2.5-7B dummy shapes (greedy, and one sampled throughput
#                                run) and on SmolLM2 Q4_1 (with and without CUDA graphs); one JSON per run
#                                under $OUT (default bench/results/gpu)
#   bench/gpu_suite.sh engines   the static engine beside the paged one, same run: Llama-3-8B bf16 batch 1
#                                512 + 128, TTFT of a 2048-token prompt, 64 x (128, 128) on Shape {64, 128, 128};
#                                the offline batch job on the Qwen2.5-7B shape with both engines; infer-generate
#                                --backend cuda on the nine SmolLM2 prompts against HF's greedy tokens
#   bench/gpu_suite.sh serve     infer-serve with the Llama-3-8B dummy shape on the GPU (SmolLM2's tokenizer
#                                for the text), and infer-bench-serve against it at three request rates
#   bench/gpu_suite.sh router    the hybrid router on the GPU: SmolLM2 Q4_1 on a static engine for short
#                                prompts, the Llama-3-8B dummy (bf16, SmolLM2's tokenizer) on a paged engine for
#                                long or keyword-matched ones; infer-bench-serve at two rates, per-engine
#                                counts and latency in each record
#   bench/gpu_suite.sh connections  the same server under 50, 200 and 1,000 concurrent clients, a new
#                                connection per request and kept alive (0 failed expected), then
#                                tests/programs/check_serve_connections.py (CPU backend)
#   bench/gpu_suite.sh peer-serve   infer-serve and llama.cpp's llama-server on the same Llama-3-8B-shaped Q4_K_M
#                                file, one after the other in one run: infer-bench-serve at 50 and 200 concurrent
#                                (128 in / 32 out), a new connection per request and kept alive, against each.
#                                Needs llama.cpp built and the files made first: ../shared/peers/prepare.sh here,
#                                then on the device (carrying .xfer/peers) .xfer/peers/device.sh build and models
#   bench/gpu_suite.sh peer-decode  issue 19's side by side on the same GGUF files (8B Q4_K_M, Q8_0, SmolLM2 Q4_1):
#                                llama-bench against infer-bench-latency at batch 1, llama-batched-bench against
#                                infer-bench-throughput at 1-64 sequences. Needs llama.cpp and the files as
#                                peer-serve does. peer-profile: ncu of infer's Q4_K_M decode step (time, DRAM bytes)
# The default model must be at models/SmolLM2-135M-Instruct.Q4_1.gguf (on the device machine: staged with
# ../shared/device/stage.sh and linked there). INFER_COMMIT names the commit in every JSON record.
#
# A 30-minute device session (machine start ~1.5 min; a machine idle for 30 s is given back with everything
# on it, so issue each call as soon as the last returns):
#   1-2. the model's two parts (stage.sh), each a call of under a second;
#   3.   carrying .deps: `source .deps/unpack.sh && mkdir -p models && ln -sf /root/stage/<model> models/ &&
#        export INFER_COMMIT=<sha> SESSION_OUT=/root/session && bench/device_job.sh start session bash
#        bench/gpu_session.sh build reference test engines router "seeds 1 2" && bench/device_job.sh wait session
#        560 /root/session` (the phases run detached, one log each in /root/session, packed into the call's
#        $OUT as session.tgz; never use $OUT itself, which every call empties);
#   4+.  `bench/device_job.sh wait session 560 /root/session` until it ends.
#   With the binaries built here (bench/pack_gpu_build.sh, at the commit under test), carry
#   .xfer/gpu-build.tar.xz beside .deps and name the phase `unpack` instead of `build` (2 s on the device at c9c0352).
# Measured on 2026-12-05 at 5b34b23: `build` 359 s (llama.cpp's build beside it), the whole [cuda] suite 180 s
# with fixed seeds and ~170 s per other seed (seeds 1-3 in 506 s), `engines` 23 s, `router` 43 s, `peer-serve` 265 s (after
# .xfer/peers/device.sh build, ~6 min beside ours, and models, 95 s); `connections` ~1 min (5933470). At c9c0352:
# `engines` 24 s, `router` 43 s, `profile` 24 s, `repeat 5` 898 s, each other seed ~180 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${BUILD:-build-gpu}
test_filter() {  # the Catch filter of a test PART
  case "${1:-all}" in
    all) echo "[cuda]" ;;
    ops) echo "[cuda]~[engine]" ;;
    engines) echo "[cuda][engine]~*SmolLM2*" ;;
    smollm2) echo "[cuda][engine]*SmolLM2*" ;;
    quant) echo "[cuda][fp8],[cuda][int8],[cuda][int4],[cuda][engine_file]" ;;  # the quantizers: kernels, engines, engine files
    *) echo "gpu_suite.sh: unknown test part '$1' (all, ops, engines, smollm2, quant)" >&2; exit 2 ;;
  esac
}
# OpenBLAS sizes its thread pool by the CPUs it sees, not by a container's CPU quota: under a 16-CPU quota on a
# bigger host, the [cuda] tests' CPU reference would run dozens of threads on 16 CPUs' worth of time (on
# 2026-12-05 it ran slower on the GPU machine than on a 2-core one). Cap it at the quota when there is one.
if [ -z "${OPENBLAS_NUM_THREADS:-}" ] && read -r quota period 2>/dev/null </sys/fs/cgroup/cpu.max && [ "$quota" != max ]; then
  export OPENBLAS_NUM_THREADS=$(((quota + period - 1) / period))
fi
# OpenBLAS 0.3.21 (Debian's, DYNAMIC_ARCH) does not know the GPU machine's CPU model and falls back to its
# Prescott (SSE3) kernels: every [cuda] log of 2026-12-05 says "core Prescott". Name the core from the CPU's
# flags instead: SkylakeX's kernels need AVX-512 F/CD/BW/DQ/VL, Haswell's AVX2 and FMA.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null); then
  has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
  if has avx512f avx512cd avx512bw avx512dq avx512vl; then export OPENBLAS_CORETYPE=SkylakeX
  elif has avx2 fma; then export OPENBLAS_CORETYPE=Haswell
  fi
fi
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
bin=$build/bin
fail=0
wait_healthy() {  # wait_healthy PORT SECONDS: until the server's /health is 200 (503 while it loads and captures)
  for _ in $(seq 1 $((2 * $2))); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "FAILED: no healthy server on port $1 after $2 s"; fail=1
}
concurrency_sweep() {  # concurrency_sweep PORT LABEL FILE_PREFIX "C N"...: infer-bench-serve, 128 in / 32 out, N
  local port=$1 label=$2 prefix=$3 spec ka flag   # requests at C concurrent, a new connection per request and kept alive
  shift 3
  for spec in "$@"; do
    set -- $spec
    for ka in no-keep-alive keep-alive; do
      flag=""; [ $ka = no-keep-alive ] && flag=--no-keep-alive
      run "$bin"/infer-bench-serve --url http://127.0.0.1:$port --num-prompts $2 --max-concurrency $1 $flag \
        --random-input-len 128 --random-output-len 32 --label "$label, $1 concurrent, $ka" \
        --result-file "$out/$prefix-c$1-$ka.json"
    done
  done
}
run() {  # run CMD...: echo it, run it, remember a failure, go on
  echo "+ $*"
  "$@" || { echo "FAILED ($?): $*"; fail=1; }
}
ttft_2048() {  # ttft_2048 LABEL: issue 16's time to first token, a 2,048-token prompt (Llama-3-8B dummy, bf16,
  # static engine) with this environment, into latency-llama3-8b-b1-2048-ttft-static-LABEL.json; prints it
  local f="$out/latency-llama3-8b-b1-2048-ttft-static-$1.json"
  run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer bf16 --engine static --max-batch 1 --max-input 2048 \
    --max-output 4 --batch-size 1 --input-len 2048 --output-len 4 --num-iters 5 --output-json "$f" >/dev/null
  python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['results']; \
print(sys.argv[2], 'TTFT', round(r['ttft_ms'], 2), 'ms, device', round(r['ttft_device_ms'], 2))" "$f" "$1"
}

case "${1:-}" in
  build)
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DINFER_CUDA=ON >/dev/null &&
      cmake --build "$build" -j"$(nproc)" --target test_cuda test_rounding_noise infer-bench-latency \
        infer-bench-throughput infer-serve infer-bench-serve infer-offline-batch infer-generate infer-build || exit 1
    # The CPU reference (the [cuda] tests' replays) runs on this BLAS: which library, how many threads.
    echo "cores: $(nproc) (affinity), $(nproc --all) (all); cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none); OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"
    echo "BLAS: $(ldd "$build"/tests/test_cuda | grep -iE 'blas|lapack' | tr -s ' \t' ' ' | tr '\n' ';')"
    ;;
  unpack)
    pack=.xfer/gpu-build.tar.xz
    [ -f $pack ] || { echo "gpu_suite.sh unpack: no $pack (bench/pack_gpu_build.sh makes it; carry it)" >&2; exit 2; }
    mkdir -p "$build" && tar xJf $pack -C "$build" || exit 1
    cat "$build/gpu-build.manifest"
    # The tests read fixtures and the model from the source folder compiled into them: make it this one.
    src=$(sed -n 's/^source_dir=//p' "$build/gpu-build.manifest")
    if [ "$(realpath -m "$src")" != "$(pwd -P)" ]; then
      [ -e "$src" ] && { echo "gpu_suite.sh unpack: $src exists here and is not this tree" >&2; exit 1; }
      mkdir -p "$(dirname "$src")" && ln -s "$(pwd -P)" "$src" || exit 1
    fi
    commit=$(sed -n 's/^commit=//p' "$build/gpu-build.manifest")
    if [ -n "${INFER_COMMIT:-}" ] && [ "$commit" != "${INFER_COMMIT:0:${#commit}}" ]; then
      echo "gpu_suite.sh unpack: built at $commit, but INFER_COMMIT is $INFER_COMMIT" >&2; exit 1
    fi
    missing=$(ldd "$build"/tests/test_cuda "$build"/bin/* | grep "not found" | sort -u)
    [ -z "$missing" ] || { echo "gpu_suite.sh unpack: libraries not found here (source .deps/unpack.sh?): $missing" >&2; exit 1; }
    # (Catch2 2's --list exits with the number of tests listed, not 0)
    n=$("$build"/tests/test_cuda --list-test-names-only "[cuda]" | grep -c .)
    [ "$n" -gt 0 ] || { echo "gpu_suite.sh unpack: test_cuda lists no [cuda] test" >&2; exit 1; }
    echo "unpacked: $n [cuda] test cases"
    ;;
  test)
    filter=$(test_filter "${2:-all}") || exit 2
    run "$build"/tests/test_cuda --durations yes "$filter"
    ;;
  reference)  # the CPU reference's time (most of the [cuda] suite's) at several OpenBLAS thread counts
    for threads in ${2:-${OPENBLAS_NUM_THREADS:-$(nproc)} 8 4}; do
      OPENBLAS_NUM_THREADS=$threads run "$build"/tests/test_rounding_noise "[.bench]"
    done
    ;;
  repeat)  # repeat N: the whole suite N times in a row with the fixed seeds, one log per run
    for k in $(seq 1 "${2:?repeat N}"); do
      run "$build"/tests/test_cuda --durations yes "[cuda]" >"$out/cuda-tests-fixed-run-$k.log" 2>&1
      echo "fixed seeds, run $k: $(tail -n 2 "$out/cuda-tests-fixed-run-$k.log" | tr '\n' ' ')"
    done
    ;;
  fp8)  # issue 18: Fp8 beside bf16 in one run, Llama-3-8B dummy: batch-1 decode and 1024 x (128, 128)
    for q in fp8 bf16; do
      run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $q --batch-size 1 --input-len 512 --output-len 128 \
        --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-$q.json"
      run "$bin"/infer-bench-throughput --dummy llama3-8b --quantizer $q --num-prompts 1024 --input-len 128 \
        --output-len 128 --max-num-seqs 1024 --max-num-batched-tokens 16384 \
        --output-json "$out/throughput-llama3-8b-1024x128-128-$q.json"
    done
    ;;
  engine-file)  # issue 18: build once, then the cold start from the file, as TensorRT-LLM users run it
    dir=${ENGINE_DIR:-/root/engines}
    mkdir -p "$dir"
    for q in fp8 bf16; do
      f=$dir/llama3-8b-$q-static-1x512x128.engine
      run "$bin"/infer-build --backend cuda --dummy llama3-8b --engine static --quantizer $q --max-batch 1 \
        --max-input 512 --max-output 128 -o "$f" --json
      for k in 1 2; do
        run "$bin"/infer-bench-latency --engine-file "$f" --batch-size 1 --input-len 512 --output-len 128 \
          --num-iters 3 --output-json "$out/latency-engine-file-llama3-8b-$q-run$k.json"
      done
      rm -f "$f"
    done
    ;;
  fp8-steady)  # issue 18: steady-state throughput, 30,000 requests of 128/128 and 3,000 of 1000/1000
    for q in fp8 bf16; do
      run "$bin"/infer-bench-throughput --dummy llama3-8b --quantizer $q --num-prompts 30000 --input-len 128 \
        --output-len 128 --max-num-seqs 1024 --max-num-batched-tokens 16384 \
        --output-json "$out/throughput-llama3-8b-30000x128-128-$q.json"
      run "$bin"/infer-bench-throughput --dummy llama3-8b --quantizer $q --num-prompts 3000 --input-len 1000 \
        --output-len 1000 --max-num-seqs 1024 --max-num-batched-tokens 16384 \
        --output-json "$out/throughput-llama3-8b-3000x1000-1000-$q.json"
    done
    ;;
  decode-ab)  # batch-1 decode with the GEMVs launched plainly and chained, alternating
    for spec in "bf16 1" "fp8 1" "bf16 2" "fp8 2"; do
      set -- $spec
      for k in 0 1; do
        INFER_GEMV_CHAIN=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $1 --batch-size 1 \
          --input-len 512 --output-len 128 --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-$1-chain$k-r$2.json"
      done
    done
    ;;
  early-ab)  # batch-1 decode (static engine, as issue 16 measures it) with the tensor-core GEMVs' first weight
    # copies after and before the chained wait (INFER_TC_GEMV_EARLY), alternating, bf16 and FP8
    # (EARLY_AB_QUANTS: the quantizers to run, default "bf16 fp8"; "bf16" for issue 16's target alone)
    specs=()
    for r in 1 2; do for q in ${EARLY_AB_QUANTS:-bf16 fp8}; do specs+=("$q $r"); done; done
    for spec in "${specs[@]}"; do
      set -- $spec
      for k in 0 1; do
        INFER_TC_GEMV_EARLY=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $1 --engine static \
          --max-batch 1 --max-input 512 --max-output 128 --batch-size 1 --input-len 512 --output-len 128 \
          --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-$1-early$k-r$2.json"
      done
    done
    ;;
  prefill-ab)  # issue 16's TTFT: the prefill attention on wgmma (the default on Hopper) against the mma.sync kernel
    # (INFER_PREFILL_ATTENTION=tc128): the [attention] tests, the kernel bench (4 x 4096, and the 2,048-token
    # Llama-3-8B layer), then the time to first token of a 2,048-token prompt (Llama-3-8B dummy, bf16, static
    # engine), alternating, two runs each
    run "$build"/tests/test_cuda --durations yes "[attention]~[.bench]" >"$out/attention-tests.log" 2>&1
    echo "attention tests: $(tail -n 2 "$out/attention-tests.log" | tr '\n' ' ')"
    "$build"/tests/test_cuda "CUDA paged prefill attention throughput" 2>&1 | grep -E 'paged prefill|FAILED' |
      tee "$out/bench-prefill-attention.txt"
    for r in 1 2; do
      for a in tc128 wgmma; do INFER_PREFILL_ATTENTION=$a ttft_2048 "$a-r$r"; done
    done
    ;;
  gemm-cap)  # issue 16's TTFT: the prefill's GEMMs with cuBLASLt's heuristic pick (the default above 1,024 rows)
    # against picks timed at the power cap (GemmTuning::measured_at_cap; INFER_GEMM_SUSTAINED_TUNE=1 in a model):
    # the [gemm] tests, the bench (each Llama-3-8B shape at M = 2048 in ~50 ms windows, then the 32 layers' GEMMs),
    # then the time to first token of a 2,048-token prompt (Llama-3-8B dummy, bf16, static engine), alternating
    run "$build"/tests/test_cuda --durations yes "[gemm]~[.bench]" >"$out/gemm-tests.log" 2>&1
    echo "gemm tests: $(tail -n 2 "$out/gemm-tests.log" | tr '\n' ' ')"
    "$build"/tests/test_cuda "[gemm_cap]" 2>&1 | grep -E 'GemmTuning|M=2048|prefill|FAILED' | tee "$out/bench-gemm-cap.txt"
    for r in 1 2 3; do
      for t in 0 1; do INFER_GEMM_SUSTAINED_TUNE=$t ttft_2048 "cap$t-r$r"; done
    done
    ;;
  baseline-ab)  # batch-1 decode with this build and an earlier one, alternating (the earlier one's FP8 GEMV on
    # the CUDA cores, today's default; builds before 1a91f03 defaulted to the tensor cores)
    base=${BASELINE:-/root/stage/baseline}
    [ -x "$base/bin/infer-bench-latency" ] || { echo "gpu_suite.sh baseline-ab: no $base/bin/infer-bench-latency" >&2; exit 2; }
    echo "baseline: $(cat "$base/gpu-build.manifest" 2>/dev/null | tr '\n' ' ')"
    for spec in "bf16 1" "fp8 1" "bf16 2" "fp8 2"; do
      set -- $spec
      for which in base new; do
        if [ $which = base ]; then b=$base/bin; else b=$bin; fi
        INFER_FP8_GEMV=cuda_cores run "$b"/infer-bench-latency --dummy llama3-8b --quantizer $1 --batch-size 1 \
          --input-len 512 --output-len 128 --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-$1-$which-r$2.json"
      done
    done
    ;;
  kv-fp8)  # the FP8 KV cache against bf16's (bf16 weights), alternating: batch 1, and batch 64 of 2,048-token contexts
    for r in 1 2; do
      for kv in auto fp8; do
        run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer bf16 --batch-size 1 --input-len 512 --output-len 128 \
          --num-iters 5 --kv-cache-dtype $kv --output-json "$out/latency-llama3-8b-b1-512-128-kv-$kv-r$r.json"
      done
    done
    for kv in auto fp8 auto fp8; do
      run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer bf16 --batch-size 64 --input-len 2048 --output-len 128 \
        --num-iters 2 --kv-cache-dtype $kv --output-json "$out/latency-llama3-8b-b64-2048-128-kv-$kv.json"
    done
    ;;
  quantizers)  # batch-1 decode with each quantizer, in turn, two runs each
    for r in 1 2; do
      for q in bf16 fp8 int8 int4; do
        run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $q --batch-size 1 --input-len 512 --output-len 128 \
          --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-$q-r$r.json"
      done
    done
    ;;
  fp8-ab)  # FP8 batch-1 decode, the FP8 GEMV on the tensor cores and on the CUDA cores, alternating
    for r in 1 2; do
      for k in tensor_cores cuda_cores; do
        INFER_FP8_GEMV=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer fp8 --batch-size 1 \
          --input-len 512 --output-len 128 --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-fp8-$k-r$r.json"
      done
    done
    ;;
  profile)  # each kernel's time under ncu (alone, cold caches): the 8B prefill of 2048 tokens and a decode step
    for spec in "2048 1 prefill-2048 bf16" "512 2 decode-b1-ctx512 bf16" "512 2 decode-b1-ctx512-fp8 fp8"; do
      set -- $spec
      run ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        --log-file "$out/ncu-$3.csv" "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $4 --batch-size 1 \
        --input-len $1 --output-len $2 --num-iters 1 --num-iters-warmup 0 --enforce-eager
      python3 bench/ncu_summary.py "$out/ncu-$3.csv" | tee "$out/ncu-$3.txt"
    done
    ;;
  bf16-ab)  # bf16 batch-1 decode with bf16_gemv on the CUDA cores and on the tensor cores (the default), alternating
    for r in 1 2; do
      for k in cuda_cores tensor_cores; do
        INFER_BF16_GEMV=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer bf16 --batch-size 1 \
          --input-len 512 --output-len 128 --num-iters 5 --output-json "$out/latency-llama3-8b-b1-512-128-bf16-$k-r$r.json"
      done
    done
    INFER_BF16_GEMV=tensor_cores run ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
      --log-file "$out/ncu-decode-b1-ctx512-bf16-tensor_cores.csv" "$bin"/infer-bench-latency --dummy llama3-8b \
      --quantizer bf16 --batch-size 1 --input-len 512 --output-len 2 --num-iters 1 --num-iters-warmup 0 --enforce-eager
    python3 bench/ncu_summary.py "$out/ncu-decode-b1-ctx512-bf16-tensor_cores.csv" | tee "$out/ncu-decode-b1-ctx512-bf16-tensor_cores.txt"
    ;;
  batch-ab)  # decode at batch 4 and 8 (512 + 128): bf16 with cuBLASLt past one row against the tensor-core
    # bf16_gemv up to 8 rows (INFER_BF16_GEMV), and FP8 with its GEMV on the CUDA cores against the tensor cores
    # (INFER_FP8_GEMV), alternating
    for b in 4 8; do
      for k in cuda_cores tensor_cores; do
        INFER_BF16_GEMV=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer bf16 --batch-size $b \
          --input-len 512 --output-len 128 --num-iters 3 --output-json "$out/latency-llama3-8b-b$b-512-128-bf16-$k.json"
        INFER_FP8_GEMV=$k run "$bin"/infer-bench-latency --dummy llama3-8b --quantizer fp8 --batch-size $b \
          --input-len 512 --output-len 128 --num-iters 3 --output-json "$out/latency-llama3-8b-b$b-512-128-fp8-$k.json"
      done
    done
    ;;
  profile-quant)  # each kernel of a batch-1 decode step under ncu (alone, cold caches) with each low-precision
    # quantizer: fp8 with its GEMV on the CUDA cores and on the tensor cores, int8, int4
    for spec in "fp8 cuda_cores" "fp8 tensor_cores" "int8 cuda_cores" "int4 cuda_cores"; do
      set -- $spec
      INFER_FP8_GEMV=$2 run ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        --log-file "$out/ncu-decode-b1-ctx512-$1-$2.csv" "$bin"/infer-bench-latency --dummy llama3-8b --quantizer $1 \
        --batch-size 1 --input-len 512 --output-len 2 --num-iters 1 --num-iters-warmup 0 --enforce-eager
      python3 bench/ncu_summary.py "$out/ncu-decode-b1-ctx512-$1-$2.csv" | tee "$out/ncu-decode-b1-ctx512-$1-$2.txt"
    done
    ;;
  seeds)
    shift
    filter=$(test_filter "${PART:-all}") || exit 2
    for seed in "$@"; do
      if [ "$seed" = default ]; then unset INFER_TEST_SEED; else export INFER_TEST_SEED=$seed; fi
      run "$build"/tests/test_cuda --durations yes "$filter" >"$out/cuda-tests-seed-$seed.log" 2>&1
      echo "seed $seed: $(tail -n 2 "$out/cuda-tests-seed-$seed.log" | tr '\n' ' ')"
    done
    unset INFER_TEST_SEED
    ;;
  bench)
    run "$build"/tests/test_cuda "[.bench]"
    m8="--dummy llama3-8b --quantizer bf16"
    run "$bin"/infer-bench-latency $m8 --batch-size 1 --input-len 512 --output-len 128 --num-iters 5 \
      --output-json "$out/latency-llama3-8b-b1-512-128.json"
    run "$bin"/infer-bench-latency $m8 --batch-size 1 --input-len 512 --output-len 128 --num-iters 3 --enforce-eager \
      --output-json "$out/latency-llama3-8b-b1-512-128-eager.json"
    run "$bin"/infer-bench-latency $m8 --batch-size 1 --input-len 2048 --output-len 4 --num-iters 5 \
      --output-json "$out/latency-llama3-8b-b1-2048-ttft.json"
    run "$bin"/infer-bench-latency $m8 --batch-size 32 --input-len 512 --output-len 128 --num-iters 3 \
      --output-json "$out/latency-llama3-8b-b32-512-128.json"
    for seqs in 256 1024; do  # vLLM's max_num_seqs: 256 (V0) and 1024 (V1 on H100-class GPUs)
      run "$bin"/infer-bench-throughput $m8 --num-prompts 1024 --input-len 128 --output-len 128 --max-num-seqs $seqs \
        --max-num-batched-tokens 16384 --output-json "$out/throughput-llama3-8b-1024x128-128-seqs$seqs.json"
      run "$bin"/infer-bench-throughput $m8 --num-prompts 1000 --input-len 512 --output-len 128 --max-num-seqs $seqs \
        --max-num-batched-tokens 16384 --output-json "$out/throughput-llama3-8b-1000x512-128-seqs$seqs.json"
    done
    # The same 1024 requests drawing their tokens (temperature 0.8, top-p 0.95) on the device.
    run "$bin"/infer-bench-throughput $m8 --num-prompts 1024 --input-len 128 --output-len 128 --max-num-seqs 1024 \
      --max-num-batched-tokens 16384 --temperature 0.8 --top-p 0.95 \
      --output-json "$out/throughput-llama3-8b-1024x128-128-seqs1024-sampled.json"
    run "$bin"/infer-bench-latency --dummy qwen2.5-7b --quantizer bf16 --batch-size 1 --input-len 512 --output-len 128 \
      --output-json "$out/latency-qwen2.5-7b-b1-512-128.json"
    sm="--model models/SmolLM2-135M-Instruct.Q4_1.gguf"
    run "$bin"/infer-bench-latency $sm --batch-size 1 --input-len 128 --output-len 256 --num-iters 5 \
      --output-json "$out/latency-smollm2-q4_1-b1.json"
    run "$bin"/infer-bench-latency $sm --batch-size 1 --input-len 128 --output-len 256 --num-iters 5 --enforce-eager \
      --output-json "$out/latency-smollm2-q4_1-b1-eager.json"
    ;;
  engines)
    m8="--dummy llama3-8b --quantizer bf16"
    for engine in static paged; do
      run "$bin"/infer-bench-latency $m8 --engine $engine --max-batch 1 --max-input 512 --max-output 128 \
        --batch-size 1 --input-len 512 --output-len 128 --num-iters 5 \
        --output-json "$out/latency-llama3-8b-b1-512-128-$engine.json"
      run "$bin"/infer-bench-latency $m8 --engine $engine --max-batch 1 --max-input 2048 --max-output 4 \
        --batch-size 1 --input-len 2048 --output-len 4 --num-iters 5 \
        --output-json "$out/latency-llama3-8b-b1-2048-ttft-$engine.json"
      run "$bin"/infer-bench-throughput $m8 --engine $engine --max-batch 64 --max-input 128 --max-output 128 \
        --num-prompts 64 --input-len 128 --output-len 128 --max-num-seqs 64 \
        --output-json "$out/throughput-llama3-8b-64x128-128-$engine.json"
      run "$bin"/infer-offline-batch --dummy qwen2.5-7b --tokenizer tests/fixtures/smollm2/tokenizer.json \
        --chat-template chatml --backend cuda --engine $engine --max-batch 64 --max-input 128 --max-output 256 --show 0
      # The main job on the default model as a user runs it, against HF's greedy tokens (a report).
      run python3 bench/compare_hf_greedy.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf tests/fixtures cuda $engine
    done
    ;;
  serve)
    port=8011
    log=$out/serve-llama3-8b-server.log
    "$bin"/infer-serve --dummy llama3-8b --tokenizer tests/fixtures/smollm2/tokenizer.json --backend cuda \
      --port $port --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 4096 --max-waiting 1024 \
      --no-prefix-caching >"$log" 2>&1 &
    server=$!
    wait_healthy $port 60
    # Rates below, near and above what the engine sustains for 512 in / 128 out (about 100 requests/s
    # offline at max_num_seqs 256): latency at light load, at the knee, and queueing past it.
    for spec in "4 120" "16 480" "64 1200"; do
      set -- $spec
      run "$bin"/infer-bench-serve --url http://127.0.0.1:$port --num-prompts $2 --request-rate $1 \
        --random-input-len 512 --random-output-len 128 --goodput ttft:500 tpot:50 --label "llama3-8b dummy, rate $1" \
        --result-file "$out/serve-llama3-8b-512-128-rate$1.json"
    done
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" | grep -E '^infer:(kv_cache_usage|num_requests|request_success|generation_tokens)' | head -20
    kill -TERM $server
    wait $server || { echo "FAILED: infer-serve exited $?"; fail=1; }
    tail -5 "$log"
    ;;
  router)
    port=8013
    log=$out/router-server.log
    cfg=$out/router-config.json
    cat >"$cfg" <<JSON
{"engines": [{"name": "small", "engine": "static", "max_batch": 32, "max_input": 256, "max_output": 128},
             {"name": "big", "engine": "paged", "dummy": "llama3-8b", "tokenizer": "models/SmolLM2-135M-Instruct.Q4_1.gguf",
              "quantizer": "bf16", "gpu_memory_utilization": 0.9, "max_num_seqs": 256}],
 "rules": [{"engine": "big", "min_prompt_tokens": 200},
           {"engine": "big", "keywords": ["code", "analy", "summar"]}],
 "default": "small",
 "fallback": ["big"]}
JSON
    "$bin"/infer-serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --backend cuda --router "$cfg" --port $port \
      --max-model-len 4096 --max-waiting 1024 >"$log" 2>&1 &
    server=$!
    wait_healthy $port 120
    grep "ready" "$log"
    # Prompts of 40 to 360 words: the shorter ones to the small model's static engine, the rest to the 8B shape.
    for rate in 8 32; do
      run "$bin"/infer-bench-serve --url http://127.0.0.1:$port --num-prompts $((rate * 20)) --request-rate $rate \
        --random-input-len 200 --random-range-ratio 0.8 --random-output-len 64 \
        --label "router: SmolLM2 static + llama3-8b dummy paged, rate $rate" --result-file "$out/router-rate$rate.json"
    done
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" | grep -E '^infer:router' | head -20
    kill -TERM $server
    wait $server || { echo "FAILED: infer-serve exited $?"; fail=1; }
    tail -3 "$log"
    ;;
  peer-serve)
    L=/root/lcp/llama.cpp/build/bin
    f=/root/peer/d8b-q4_k_m.gguf
    if [ ! -x $L/llama-server ] || [ ! -f $f ]; then
      echo "peer-serve: no $L/llama-server or $f; run .xfer/peers/device.sh build and models first" >&2
      exit 2
    fi
    for server in infer llama.cpp; do
      port=8014
      log=$out/peer-serve-$server.log
      if [ $server = infer ]; then
        "$bin"/infer-serve --model $f --backend cuda --port $port --max-num-seqs 256 --max-num-batched-tokens 8192 \
          --max-model-len 4096 --max-waiting 2048 --no-prefix-caching >"$log" 2>&1 &
      else  # 256 slots of 512 tokens: every request of these loads fits its slot
        $L/llama-server -m $f -ngl 99 --flash-attn on --host 127.0.0.1 --port $port -np 256 -c $((256 * 512)) \
          --no-webui >"$log" 2>&1 &
      fi
      pid=$!
      wait_healthy $port 120
      concurrency_sweep $port "$server, 8B Q4_K_M" "peer-serve-$server" "50 300" "200 1200"
      kill -TERM $pid
      wait $pid
      tail -3 "$log"
    done
    ;;
  peer-decode)  # issue 19: llama.cpp and infer on the same GGUF files, one after the other in one run: batch-1
    # decode (llama-bench tg128 / pp512 against infer-bench-latency 512 + 128), batched decode at 1, 4, 16, 64
    # sequences (llama-batched-bench against infer-bench-throughput, 128 in / 128 out)
    L=/root/lcp/llama.cpp/build/bin
    [ -x $L/llama-bench ] && [ -f /root/peer/d8b-q4_k_m.gguf ] ||
      { echo "peer-decode: no $L/llama-bench or /root/peer files; run .xfer/peers/device.sh build and models first" >&2; exit 2; }
    for f in /root/peer/d8b-q4_k_m.gguf /root/peer/d8b-q8_0.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf; do
      tag=$(basename "$f" .gguf)
      run $L/llama-bench -m "$f" -p 512 -n 128 -ngl 99 -fa 1 -r 3 -o json >"$out/llama-bench-$tag.json"
      grep -E '"(n_prompt|n_gen|avg_ts)"' "$out/llama-bench-$tag.json" | tr -d ' \n'; echo
      run "$bin"/infer-bench-latency --model "$f" --backend cuda --batch-size 1 --input-len 512 --output-len 128 \
        --num-iters 5 --output-json "$out/latency-$tag-b1-512-128.json"
      # PEER_AB="NAME=VALUE ...": the same run again under each setting (A/B of a kernel switch in one build)
      for v in ${PEER_AB:-}; do
        run env "$v" "$bin"/infer-bench-latency --model "$f" --backend cuda --batch-size 1 --input-len 512 \
          --output-len 128 --num-iters 5 --output-json "$out/latency-$tag-b1-512-128-${v//=/-}.json"
      done
      # the file's tensor bytes (gguf-py, installed by device.sh models), beside the weight bytes infer reports
      PYTHONPATH=/tmp/peer-site python3 -c "import gguf, sys; r = gguf.GGUFReader(sys.argv[1]); \
print('file tensor bytes', sys.argv[1], sum(int(t.n_bytes) for t in r.tensors))" "$f"
    done
    f=/root/peer/d8b-q4_k_m.gguf
    run $L/llama-batched-bench -m $f -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,4,16,64 -ngl 99 -fa on \
      >"$out/llama-batched-bench-d8b-q4_k_m.txt" 2>&1
    grep -E '^\|' "$out/llama-batched-bench-d8b-q4_k_m.txt"
    for n in 1 4 16 64; do
      run "$bin"/infer-bench-throughput --model $f --backend cuda --num-prompts $n --input-len 128 --output-len 128 \
        --max-num-seqs $n --output-json "$out/throughput-d8b-q4_k_m-$n-128-128.json"
    done
    ;;
  peer-profile)  # issue 19: ncu of infer's decode step on the 8B files (peer-decode's), each kernel alone:
    # PEER_PROFILE_QUANTS, default q4_k_m (e.g. "q8_0 q4_k_m")
    for q in ${PEER_PROFILE_QUANTS:-q4_k_m}; do
      f=/root/peer/d8b-$q.gguf
      run ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
        --log-file "$out/ncu-decode-b1-d8b-$q.csv" "$bin"/infer-bench-latency --model $f --backend cuda \
        --batch-size 1 --input-len 512 --output-len 2 --num-iters 1 --num-iters-warmup 0 --enforce-eager
      python3 bench/ncu_summary.py "$out/ncu-decode-b1-d8b-$q.csv" | tee "$out/ncu-decode-b1-d8b-$q.txt"
    done
    ;;
  mpi-launch)  # issue 21: TP = 1 and DP = 1 through the MPI launch against the plain run, SmolLM2 Q4_1, alternating
    # twice: the bench programs (batch-1 decode 512 + 128; 1024 x (128, 128)) plain and under `mpirun -n 1
    # ... --tensor-parallel-size 1`; infer-generate (one 512-token prompt, then 1,024 of 128 tokens, 128 out,
    # greedy, EOS ignored) plain and as `mpirun -n 1 infer-generate --data-parallel`, which starts MPI and
    # gathers the results at rank 0. The prompts are common English words, one SmolLM2 token each (checked on
    # the CPU: 126 words, 126 tokens). MPIRUN: Open MPI's launcher (default: mpirun on the PATH).
    mpirun=${MPIRUN:-mpirun}
    "$mpirun" --version | head -1 || { echo "gpu_suite.sh mpi-launch: no $mpirun" >&2; exit 2; }
    model=models/SmolLM2-135M-Instruct.Q4_1.gguf
    prompts() {  # prompts N WORDS FILE
      python3 - "$@" <<'PY_'
import random, sys
n, w, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
words = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name").split()
r = random.Random(n)
with open(path, "w") as f:
    for _ in range(n):
        f.write(" ".join(r.choice(words) for _ in range(w)) + "\n")
PY_
    }
    n=${MPI_LAUNCH_PROMPTS:-1024} backend=${MPI_LAUNCH_BACKEND:-cuda}  # (smaller, and cpu, to try it on a CPU)
    prompts 1 512 /tmp/prompts-1x512.txt && prompts "$n" 128 /tmp/prompts-${n}x128.txt || exit 1
    as_mpi() { "$mpirun" --allow-run-as-root -n 1 "$@"; }
    summary() {  # summary RESULTS RECORD: infer-generate's job summary, printed in one line and kept as RECORD
      python3 - "$@" <<'PY_'
import json, sys
doc = json.load(open(sys.argv[1]))
s = doc["summary"]
json.dump({k: doc.get(k) for k in ("model", "data_parallel", "summary")}, open(sys.argv[2], "w"), indent=1)
print(f"  {s['requests']} requests, {s['output_tokens']} output tokens in {s['seconds']:.3f} s: "
      f"{s['output_tokens_per_s']:.1f} output tok/s, mean TTFT {s['mean_ttft_ms']:.2f} ms")
PY_
    }
    gen=(--model $model --backend $backend --max-tokens 128 --ignore-eos --temperature 0 --kv-cache-memory 8G --json)
    for r in 1 2; do
      for how in plain mpirun; do
        pre=(); tp=(); dp=()
        [ $how = mpirun ] && { pre=(as_mpi); tp=(--tensor-parallel-size 1); dp=(--data-parallel); }
        echo "== run $r, $how"
        run "${pre[@]}" "$bin"/infer-bench-latency --model $model --backend $backend --batch-size 1 --input-len 512 \
          --output-len 128 --num-iters ${MPI_LAUNCH_ITERS:-5} "${tp[@]}" --output-json "$out/mpi-launch-latency-$how-r$r.json"
        run "${pre[@]}" "$bin"/infer-bench-throughput --model $model --backend $backend --num-prompts $n \
          --input-len 128 --output-len 128 "${tp[@]}" --output-json "$out/mpi-launch-throughput-$how-r$r.json"
        for p in 1x512 ${n}x128; do
          f=/tmp/mpi-launch-generate.json
          cmd=("${pre[@]}" "$bin"/infer-generate "${gen[@]}" "${dp[@]}" --prompts /tmp/prompts-$p.txt)
          echo "+ ${cmd[*]}"  # (not through run: its echo would land in the JSON)
          if "${cmd[@]}" >$f; then summary $f "$out/mpi-launch-generate-$p-$how-r$r.json"
          else echo "FAILED ($?): ${cmd[*]}"; fail=1; fi
        done
      done
    done
    ;;
  multi-gpu)  # issue 22 on a machine of N GPUs (N = the GPUs nvidia-smi lists, or MULTI_GPU_N): every run
    # through Open MPI's launcher (MPIRUN) with NCCL's NVLink multicast off in every rank. Llama-3-8B dummy bf16
    # at TP = 1 and TP = N: batch-1 decode (512 + 128) and 1024 x (128, 128); the greedy tokens of the same
    # prompts at TP = 1 and TP = N (infer-generate, compared line by line); Llama-3-70B dummy FP8 at TP = N:
    # batch 1 and 1024 x (128, 128); data parallel: 200 prompts (temperature 0.7, top_p 0.8, 256 tokens) on 1
    # GPU and on N (`infer-generate --data-parallel`). Written before any multi-GPU machine was lent: not yet run.
    mpirun=${MPIRUN:-mpirun}
    n=${MULTI_GPU_N:-$(nvidia-smi --list-gpus | grep -c GPU)}
    [ "$n" -ge 2 ] || { echo "gpu_suite.sh multi-gpu: $n GPU(s) here; it needs 2 or more" >&2; exit 2; }
    export NCCL_NVLS_ENABLE=0
    mpi=("$mpirun" --allow-run-as-root -np "$n" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
    m8=(--dummy llama3-8b --quantizer bf16 --backend cuda)
    m70=(--dummy llama3-70b --quantizer fp8 --backend cuda)
    for tp in 1 $n; do
      pre=(); [ $tp -gt 1 ] && pre=("${mpi[@]}")
      run "${pre[@]}" "$bin"/infer-bench-latency "${m8[@]}" --tensor-parallel-size $tp --batch-size 1 --input-len 512 \
        --output-len 128 --num-iters 5 --output-json "$out/multi-gpu-llama3-8b-bf16-b1-tp$tp.json"
      run "${pre[@]}" "$bin"/infer-bench-throughput "${m8[@]}" --tensor-parallel-size $tp --num-prompts 1024 \
        --input-len 128 --output-len 128 --output-json "$out/multi-gpu-llama3-8b-bf16-1024x128-tp$tp.json"
    done
    run "${mpi[@]}" "$bin"/infer-bench-latency "${m70[@]}" --tensor-parallel-size $n --batch-size 1 --input-len 512 \
      --output-len 128 --num-iters 3 --output-json "$out/multi-gpu-llama3-70b-fp8-b1-tp$n.json"
    run "${mpi[@]}" "$bin"/infer-bench-throughput "${m70[@]}" --tensor-parallel-size $n --num-prompts 1024 \
      --input-len 128 --output-len 128 --output-json "$out/multi-gpu-llama3-70b-fp8-1024x128-tp$n.json"
    # Greedy tokens at TP = N against TP = 1 (the engine's bf16 sums differ in order: near-ties may flip).
    tok=(--tokenizer tests/fixtures/smollm2/tokenizer.json --prompts /tmp/greedy-prompts.txt --max-tokens 64 --temperature 0)
    printf "%s\n" "The capital of France is" "Explain gradient descent in one sentence." "Write a haiku about GPUs." \
      "List three prime numbers." "What does a compiler do?" >/tmp/greedy-prompts.txt
    # (infer-generate's output straight to its file, not through run, whose echo would land in it)
    "$bin"/infer-generate "${m8[@]}" "${tok[@]}" >"$out/multi-gpu-greedy-tp1.txt" || { echo "FAILED: greedy TP = 1"; fail=1; }
    "${mpi[@]}" "$bin"/infer-generate "${m8[@]}" "${tok[@]}" --tensor-parallel-size $n >"$out/multi-gpu-greedy-tp$n.txt" ||
      { echo "FAILED: greedy TP = $n"; fail=1; }
    echo "greedy outputs equal at TP = 1 and TP = $n: $(cmp -s "$out/multi-gpu-greedy-tp1.txt" "$out/multi-gpu-greedy-tp$n.txt" && echo yes || echo NO)"
    # Data parallel: the 200-prompt job on 1 GPU and on n.
    python3 - /tmp/dp-200.txt <<'PY_'
import sys
qs = ["What is the capital of France?", "Explain how a transformer language model generates text."]
open(sys.argv[1], "w").write("".join(qs[i % 2] + "\n" for i in range(200)))
PY_
    dp=(--dummy llama3-8b --quantizer bf16 --backend cuda --tokenizer tests/fixtures/smollm2/tokenizer.json
        --prompts /tmp/dp-200.txt --temperature 0.7 --top-p 0.8 --max-tokens 256 --ignore-eos --json)
    "$bin"/infer-generate "${dp[@]}" >"$out/multi-gpu-dp1.json" || { echo "FAILED: DP = 1"; fail=1; }
    "${mpi[@]}" "$bin"/infer-generate "${dp[@]}" --data-parallel >"$out/multi-gpu-dp$n.json" || { echo "FAILED: DP = $n"; fail=1; }
    python3 - "$out/multi-gpu-dp1.json" "$out/multi-gpu-dp$n.json" <<'PY_'
import json, sys
a, b = (json.load(open(p))["summary"] for p in sys.argv[1:3])
print(f"data parallel: {a['output_tokens_per_s']:.1f} -> {b['output_tokens_per_s']:.1f} output tok/s, "
      f"{b['output_tokens_per_s'] / a['output_tokens_per_s']:.2f}x (issue 22: >= 1.9x on 2 GPUs)")
PY_
    ;;
  connections)
    # The issue "The server holds under bursts, slow clients and hang-ups": on the H200, cpp-httplib's server
    # lost 8 of 300 requests at 50 concurrent and 32 of 1,200 at 200 ("connection: Read"), each request on a
    # new connection. The same loads (and 1,000 concurrent), each with a new connection per request
    # (--no-keep-alive, the old benchmark's way) and kept alive: every run must end with 0 failed. Then the
    # CPU check of the connection handling, on this machine's cores.
    port=8012
    log=$out/connections-server.log
    "$bin"/infer-serve --dummy llama3-8b --tokenizer tests/fixtures/smollm2/tokenizer.json --backend cuda \
      --port $port --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 4096 --max-waiting 2048 \
      --no-prefix-caching >"$log" 2>&1 &
    server=$!
    wait_healthy $port 60
    concurrency_sweep $port "llama3-8b dummy" connections-llama3-8b "50 300" "200 1200" "1000 3000"
    kill -TERM $server
    wait $server || { echo "FAILED: infer-serve exited $?"; fail=1; }
    tail -3 "$log"
    run python3 tests/programs/check_serve_connections.py "$bin" models/SmolLM2-135M-Instruct.Q4_1.gguf
    ;;
  *)
    echo "usage: bench/gpu_suite.sh build|unpack|test [PART]|reference [T..]|seeds N...|bench|engines|early-ab|serve|router|connections|peer-serve|mpi-launch|prefill-ab|gemm-cap|multi-gpu" >&2
    exit 2
    ;;
esac
exit $fail
