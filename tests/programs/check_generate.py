#!/usr/bin/env python3
"""infer-generate as a user runs it: greedy output equals HF transformers' on the default model with both
engines, the --json document (tokens, text, finish reasons, timings, KV statistics), JSONL prompts with
priorities and tags, the --trace file, the CPU quantizers, engine files (infer-build, --engine-file,
--build-if-missing), and bad input.

usage: check_generate.py BIN_DIR MODEL FIXTURES_DIR"""
import json
import os
import subprocess
import sys

from harness import check, finish
import tempfile

bin_dir, model, fixtures = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-generate")
def run(*args, timeout=600, backend="cpu"):
    # The CPU backend unless a check asks otherwise: its greedy tokens equal HF's exactly (the GPU's may take
    # the other token of a bf16 near-tie; the [cuda] tests judge those by the derived bound).
    return subprocess.run([exe, "--model", model, "--backend", backend, *args], capture_output=True, text=True,
                          timeout=timeout)


ref = json.load(open(os.path.join(fixtures, "smollm2", "generate_reference.json"), encoding="utf-8"))
cases = [c for c in ref["cases"] if c["kind"] == "text"][:3]
prompts = [c["text"] for c in cases]
n = 32

runs = {}
for engine in ("paged", "static"):
    r = run(*prompts, "--engine", engine, "--temperature", "0", "--ignore-eos", "--max-tokens", str(n), "--json")
    check(r.returncode == 0, f"{engine}: exit 0 ({r.stderr[-300:]!r})")
    if r.returncode != 0:
        continue
    doc = runs[engine] = json.loads(r.stdout)
    for c, res in zip(cases, doc["results"]):
        out = res["outputs"][0]
        check(res["prompt_token_ids"] == c["prompt_ids"], f"{engine}: prompt ids of {c['text']!r}")
        check(out["token_ids"] == c["greedy_ids"][:n], f"{engine}: greedy ids of {c['text']!r} equal HF's")
        check(out["finish_reason"] == "length", f"{engine}: finish_reason length")
        check(out["text"] and res["metrics"]["ttft_ms"] > 0 and res["metrics"]["output_tokens"] == n,
              f"{engine}: text and metrics {res['metrics']}")
    s = doc["summary"]
    check(s["requests"] == 3 and s["output_tokens"] == 3 * n and s["output_tokens_per_s"] > 0, f"{engine}: summary {s}")
    kv = doc["kv_cache"]
    peak = kv["at_peak"]
    check(peak["used_blocks"] > 0 and peak["tokens_stored"] > 0, f"{engine}: KV at peak {peak}")
    if engine == "paged":
        check(kv["max_wasted_slots_per_sequence"] < peak["block_size"],
              f"paged: waste under one block per live sequence ({kv['max_wasted_slots_per_sequence']})")
    check(kv["after_run"]["free_blocks"] == kv["after_run"]["total_blocks"], f"{engine}: every block free after the run")
    check("infer: 3 requests" in r.stderr and "output tok/s" in r.stderr, f"{engine}: summary line on stderr")

# the static engine at a shape given on the command line: 3 prompts in 2 slots (a refill), tokens as paged's
args = [c["text"] for c in cases] + ["--temperature", "0", "--ignore-eos", "--max-tokens", "8", "--json"]
r = run(*args, "--engine", "static", "--max-batch", "2", "--max-input", "16", "--max-output", "8")
doc = json.loads(r.stdout) if r.returncode == 0 else {}
check(doc.get("static_shape") == {"max_batch": 2, "max_input": 16, "max_output": 8}, f"--json names the shape: {doc.get('static_shape')}")
check(r.returncode == 0 and [x["outputs"][0]["token_ids"] for x in doc["results"]] == [c["greedy_ids"][:8] for c in cases],
      "static engine at --max-batch 2 --max-input 16 --max-output 8: HF's greedy tokens")
check(r.returncode == 0 and doc["kv_cache"]["after_run"]["free_blocks"] == doc["kv_cache"]["after_run"]["total_blocks"] == 4,
      f"2 slots of 24 tokens, two 16-token blocks each, all free after the run: {doc.get('kv_cache', {}).get('after_run')}")
r = run("x", "--engine", "static", "--max-batch", "0")
check(r.returncode == 1 and "max_batch is 0" in r.stderr, f"a shape no engine can be built for: {r.stderr!r}")

# a plain-text run, n > 1 with a seed: reproducible
args = ["Once upon a time", "--n", "2", "--seed", "7", "--temperature", "0.9", "--max-tokens", "12", "--json"]
a, b = run(*args), run(*args)
samples = [[o["token_ids"] for o in json.loads(x.stdout)["results"][0]["outputs"]] if x.returncode == 0 else None
           for x in (a, b)]
check(samples[0] is not None and len(samples[0]) == 2 and samples[0] == samples[1], f"seeded n=2 run reproducible: {samples}")
r = run("The capital of France is", "--temperature", "0", "--max-tokens", "8")
check(r.returncode == 0 and "=== prompt 0 ===" in r.stdout and "Paris" in r.stdout, f"text output: {r.stdout!r}")

with tempfile.TemporaryDirectory() as tmp:
    jsonl = os.path.join(tmp, "p.jsonl")
    with open(jsonl, "w") as f:
        f.write('{"prompt": "The capital of France is"}\n{"messages": [{"role": "user", "content": "Hi"}]}\n')
    r = run("--prompts", jsonl, "--temperature", "0", "--max-tokens", "6", "--json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {"results": []}
    check(len(doc["results"]) == 2 and "<|im_start|>assistant" in doc["results"][1]["prompt"], "JSONL prompts and messages")
    bad = os.path.join(tmp, "bad.jsonl")
    open(bad, "w").write('{"prompt": "ok"}\n{"prompt": \n')
    r = run("--prompts", bad)
    check(r.returncode == 1 and "line 2" in r.stderr, f"bad JSONL line named: {r.stderr!r}")

    # priority and tag per JSONL prompt; one request at a time, so the trace's admissions are the schedule
    ranked = os.path.join(tmp, "ranked.jsonl")
    with open(ranked, "w") as f:
        f.write('{"prompt": "Name a fruit.", "priority": 2, "tag": "batch"}\n'
                '{"prompt": "Name a color.", "priority": -1, "tag": "interactive"}\n'
                '{"prompt": "Name a tree."}\n')
    trace = os.path.join(tmp, "trace.jsonl")
    r = run("--prompts", ranked, "--max-num-seqs", "1", "--temperature", "0", "--max-tokens", "3", "--ignore-eos",
            "--trace", trace, "--json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {"results": [], "engine_stats": {}}
    check([(x["priority"], x["tag"]) for x in doc["results"]] == [(2, "batch"), (-1, "interactive"), (0, "")],
          f"--json echoes each prompt's priority and tag: {r.stderr[-300:]!r}")
    steps = [json.loads(line) for line in open(trace)] if r.returncode == 0 else []
    admitted = [a["request"] for s in steps for a in s["admitted"]]
    check(admitted == [1, 2, 0], f"the paged engine admits by priority, then arrival: {admitted}")
    check(len(steps) == doc["engine_stats"].get("steps") and [s["step"] for s in steps] == list(range(len(steps))),
          f"--trace writes one line per step ({len(steps)} lines)")
    check(steps and all(sum(c["count"] for c in s["chunks"]) > 0 for s in steps) and steps[-1]["blocks"]["used"] == 0
          and sum(len(s["finished"]) for s in steps) == 3, "trace lines: chunks every step, 3 finished, blocks returned")
    open(bad, "w").write('{"prompt": "x", "priority": "high"}\n')
    r = run("--prompts", bad)
    check(r.returncode == 1 and "line 1" in r.stderr and "priority" in r.stderr, f"bad priority named: {r.stderr!r}")
    r = run("x", "--trace", os.path.join(tmp, "no", "such", "dir", "t.jsonl"))
    check(r.returncode == 1 and "cannot write the step trace" in r.stderr, f"unwritable trace: {r.stderr!r}")

# bad input: a typed error naming what was wrong, exit 1; usage errors exit 2
r = run("x", "--temperature", "5")
check(r.returncode == 1 and "temperature" in r.stderr and "[0, 2]" in r.stderr, f"temperature: {r.stderr!r}")
r = run("x", "--top-p", "0")
check(r.returncode == 1 and "top_p" in r.stderr, f"top_p: {r.stderr!r}")
r = run("x", "--max-tokens", "9000")
check(r.returncode == 1 and "9000" in r.stderr and "8192" in r.stderr, f"beyond the context: {r.stderr!r}")
r = run("x", "--engine", "static", "--max-tokens", "600")
check(r.returncode == 1 and "max_output" in r.stderr and "512" in r.stderr, f"static shape: {r.stderr!r}")
r = run("x", "--block-size", "12")
check(r.returncode == 1 and "block_size" in r.stderr, f"block size: {r.stderr!r}")
r = run("x", "--kv-cache-memory", "1M")
check(r.returncode == 1 and "--kv-cache-memory" in r.stderr and "8192" in r.stderr, f"cache too small: {r.stderr!r}")
r = run()
check(r.returncode == 2 and "no prompts" in r.stderr, f"no prompts: {r.stderr!r}")

# the backend: auto runs where it can, the JSON says where; cuda without a GPU (or without CUDA) exits 2
r = run("The capital of France is", "--max-tokens", "2", "--json", backend="auto")
doc = json.loads(r.stdout) if r.returncode == 0 else {}
check(doc.get("backend") in ("cpu", "cuda"), f"--json names the backend auto picked: {doc.get('backend')!r}")
if doc.get("backend") == "cpu":  # no GPU here: cuda must be refused with a message, exit 2
    r = run("x", backend="cuda")
    check(r.returncode == 2 and "backend cuda" in r.stderr and "--backend cpu" in r.stderr, f"cuda without a GPU: {r.stderr!r}")
r = run("x", "--quantizer", "bf16")
check(r.returncode == 1 and "cuda backend option" in r.stderr, f"bf16 on the cpu: {r.stderr!r}")

# the CPU quantizers, quantized at load (int8: W8A16 per channel; fp8: W8A8 e4m3; int4: W4A16 in groups): the
# main job runs with each; how many greedy tokens agree with HF's (f32) is printed, not required (their rounding
# may move a near-tie)
def quantized_run(quantizer, engine="paged"):
    r = run(*prompts, "--quantizer", quantizer, "--engine", engine, "--temperature", "0", "--ignore-eos",
            "--max-tokens", str(n), "--json")
    check(r.returncode == 0, f"{quantizer}, {engine}: exit 0 ({r.stderr[-300:]!r})")
    if r.returncode == 0:
        outs = [res["outputs"][0]["token_ids"] for res in json.loads(r.stdout)["results"]]
        check(all(len(o) == n for o in outs), f"{quantizer}, {engine}: {n} tokens per prompt")
        agree = sum(next((i for i, (a, b) in enumerate(zip(o, c["greedy_ids"])) if a != b), n) for o, c in zip(outs, cases))
        print(f"{quantizer} ({engine}): {agree} of {n * len(cases)} greedy tokens before the first divergence from HF's")
        return outs
    return None
int8_tokens = quantized_run("int8", "paged")
quantized_run("int8", "static")
quantized_run("fp8")
int4_tokens = quantized_run("int4")

# engine files: TensorRT-LLM's build-once flow. --build-if-missing builds from --model with the flags given, then
# runs; the file alone then runs the same engine (no other flag), and the tokens are those of the model loaded
# directly with that quantizer. infer-build writes one too. A setting that differs from the file's is refused.
greedy = ["--temperature", "0", "--ignore-eos", "--max-tokens", str(n), "--json"]
def file_tokens(r, what):
    check(r.returncode == 0, f"{what}: exit 0 ({r.stderr[-300:]!r})")
    return [res["outputs"][0]["token_ids"] for res in json.loads(r.stdout)["results"]] if r.returncode == 0 else None
with tempfile.TemporaryDirectory() as tmp:
    f8 = os.path.join(tmp, "smollm2-int8.engine")
    r = run(*prompts, "--engine-file", f8, "--build-if-missing", "--quantizer", "int8", *greedy)
    check(file_tokens(r, "--build-if-missing") == int8_tokens and "built engine file" in r.stderr,
          f"--build-if-missing built the file and ran it: int8's tokens ({r.stderr[-200:]!r})")
    r = subprocess.run([exe, "--engine-file", f8, "--backend", "cpu", *prompts, *greedy], capture_output=True, text=True,
                       timeout=600)
    check(file_tokens(r, "--engine-file alone") == int8_tokens and "built engine file" not in r.stderr,
          "--engine-file alone: the file's engine and quantizer, int8's tokens, nothing rebuilt")
    r = subprocess.run([exe, "--engine-file", f8, "--quantizer", "fp8", "x"], capture_output=True, text=True, timeout=600)
    check(r.returncode == 1 and "built with quantizer int8" in r.stderr and "asks for quantizer fp8" in r.stderr,
          f"another quantizer than the file's is refused: {r.stderr!r}")
    r = subprocess.run([exe, "--engine-file", os.path.join(tmp, "missing.engine"), "x"], capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 1 and "does not exist" in r.stderr and "--build-if-missing" in r.stderr,
          f"a missing engine file without --build-if-missing: {r.stderr!r}")
    f4 = os.path.join(tmp, "smollm2-int4.engine")
    r = subprocess.run([os.path.join(bin_dir, "infer-build"), "--model", model, "--quantizer", "int4", "-o", f4, "--json"],
                       capture_output=True, text=True, timeout=600)
    built = json.loads(r.stdout) if r.returncode == 0 else {}
    check(built.get("quantizer_layout") == "int4" and built.get("bytes") == os.path.getsize(f4) and built.get("backend") == "cpu",
          f"infer-build --json: {built or r.stderr[-300:]}")
    r = subprocess.run([exe, "--engine-file", f4, "--backend", "cpu", *prompts, *greedy], capture_output=True, text=True,
                       timeout=600)
    check(file_tokens(r, "infer-build's int4 file") == int4_tokens, "infer-build's int4 file: int4's tokens")
r = run("x", "--quantizer", "int8", "--block-size", "8")
check(r.returncode == 1 and "block_size 16" in r.stderr, f"int8 with block size 8: {r.stderr!r}")

# a dummy shape with a borrowed tokenizer: text in, text out, on the CPU
r = subprocess.run([exe, "--dummy", "smollm2-135m", "--tokenizer", model, "--backend", "cpu", "--max-tokens", "3",
                    "--temperature", "0", "--ignore-eos", "--json", "Hello"], capture_output=True, text=True, timeout=600)
doc = json.loads(r.stdout) if r.returncode == 0 else {}
check(r.returncode == 0 and doc["model"] == "dummy:smollm2-135m" and len(doc["results"][0]["outputs"][0]["token_ids"]) == 3,
      f"--dummy --tokenizer: {r.returncode} {r.stderr[-300:]!r}")

finish()
