#!/usr/bin/env python3
"""infer-bench-latency and infer-bench-throughput run on the CPU backend (the default model, and a JSONL
dataset), print their tables, write JSON records whose figures are consistent, and refuse bad flags.
The GPU figures come from the same programs on the GPU machine (bench/gpu_suite.sh).

usage: check_bench.py BIN_DIR MODEL"""
import json
import os
import subprocess
import sys
import tempfile

from harness import check, finish

bin_dir, model = sys.argv[1:3]
tmp = tempfile.mkdtemp()


def bench(name, *args):
    out = os.path.join(tmp, name + ".json")
    r = subprocess.run([os.path.join(bin_dir, name), "--backend", "cpu", *args, "--output-json", out],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"{name} {' '.join(args)} exits 0: {r.stderr!r}")
    doc = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else {}
    return r, doc


r, lat = bench("infer-bench-latency", "--model", model, "--batch-size", "2", "--input-len", "24", "--output-len", "6",
               "--num-iters", "2", "--num-iters-warmup", "1")
res = lat.get("results", {})
check("time to first token" in r.stdout and "decode throughput" in r.stdout, f"latency table: {r.stdout!r}")
check(len(res.get("ttft_s_all", [])) == 2 and all(t > 0 for t in res["ttft_s_all"]), f"two measured TTFTs: {res}")
ttfts_ms = [t * 1e3 for t in res.get("ttft_s_all") or [0]]
check(min(ttfts_ms) <= res.get("ttft_ms", -1) * 1.0001 and res.get("ttft_ms", -1) <= max(ttfts_ms) * 1.0001,
      f"the median TTFT in ms lies among the measured ones in seconds: {res}")
check(res.get("decode_tokens_per_s", 0) > 0 and res.get("end_to_end_ms", 0) >= res.get("ttft_ms", 1e9),
      f"decode rate positive, end-to-end >= TTFT: {res}")
check(lat.get("settings", {}).get("batch_size") == 2 and lat.get("program") == "infer-bench-latency",
      f"settings recorded: {lat.get('settings')}")
cold = lat.get("cold_start_s", {})
check(0 < cold.get("engine_ready", 0) <= cold.get("first_token", 0), f"cold start ordered: {cold}")

r, tp = bench("infer-bench-throughput", "--dummy", "smollm2-135m", "--num-prompts", "6", "--input-len", "12",
              "--output-len", "5")
res = tp.get("results", {})
check(res.get("output_tokens") == 30 and res.get("prompt_tokens") == 72, f"6 x (12 in, 5 out) counted: {res}")
check(res.get("all_blocks_free") is True, "every KV block free after the run")
check(abs(res.get("total_tokens_per_s", 0) * res.get("elapsed_s", 0) - 102) < 1e-6 * 102 + 1e-3,
      f"total tokens/s = 102 tokens / elapsed: {res}")

dataset = os.path.join(tmp, "prompts.jsonl")
with open(dataset, "w") as f:
    f.write('{"prompt": "The capital of France is", "output_len": 4}\n\n{"prompt_ids": [1, 2, 3], "output_len": 2}\n')
r, tp = bench("infer-bench-throughput", "--model", model, "--dataset", dataset)
check(tp.get("results", {}).get("output_tokens") == 6, f"dataset output lengths honoured: {tp.get('results')}")

with open(dataset, "w") as f:
    f.write('{"prompt": "ok"}\nnot json\n')
r = subprocess.run([os.path.join(bin_dir, "infer-bench-throughput"), "--backend", "cpu", "--model", model,
                    "--dataset", dataset], capture_output=True, text=True, timeout=300)
check(r.returncode == 1 and "line 2" in r.stderr, f"a malformed dataset line is named: {r.stderr!r}")
r = subprocess.run([os.path.join(bin_dir, "infer-bench-latency"), "--backend", "cpu", "--dummy", "nope"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 1 and "llama3-8b" in r.stderr, f"an unknown dummy shape lists the presets: {r.stderr!r}")
r = subprocess.run([os.path.join(bin_dir, "infer-bench-latency"), "--backend", "cpu"], capture_output=True, text=True,
                   timeout=60)
check(r.returncode == 1 and "--model" in r.stderr, f"no model: says what to give: {r.stderr!r}")

finish()
