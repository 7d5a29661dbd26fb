#!/usr/bin/env python3
"""CPU-backend throughput of infer-generate on the default model, recorded in bench/results/.

Runs three workloads (batch 1 greedy decode of 128 tokens; 16 chat prompts x 64 tokens; 64 prompts x 32
tokens), each on the paged and the static engine, takes the best of `--repeat` runs, and writes
bench/results/cpu-generate-<date>.json with the commit, the machine and the settings.

usage: bench/cpu_generate.py [--bin build/bin] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--repeat 2]"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(root, "build", "bin"))
ap.add_argument("--model", default=os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
ap.add_argument("--repeat", type=int, default=2)
args = ap.parse_args()


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(extra, prompts):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(prompts) + "\n")
    best = None
    for _ in range(args.repeat):
        out = subprocess.run([os.path.join(args.bin, "infer-generate"), "--model", args.model, "--prompts", f.name,
                              "--json", *extra], capture_output=True, text=True, check=True)
        s = json.loads(out.stdout)["summary"]
        if best is None or s["output_tokens_per_s"] > best["output_tokens_per_s"]:
            best = s
    os.unlink(f.name)
    return best


topics = ["the ocean", "volcanoes", "the moon", "honey bees", "glaciers", "the Roman empire", "jazz", "tea",
          "deserts", "lightning", "coral reefs", "chess", "bread", "comets", "forests", "the printing press"]
workloads = [
    ("batch 1, 128 new tokens (greedy, EOS ignored)", ["--temperature", "0", "--ignore-eos", "--max-tokens", "128"],
     ["The history of the printing press begins"]),
    ("16 chat prompts, 64 new tokens", ["--chat", "--temperature", "0", "--ignore-eos", "--max-tokens", "64"],
     [f"Tell me one surprising fact about {t}." for t in topics]),
    ("64 prompts, 32 new tokens", ["--temperature", "0.8", "--seed", "1", "--ignore-eos", "--max-tokens", "32"],
     [f"Write a sentence about {t} number {i}." for i in range(4) for t in topics]),
]
results = []
for name, extra, prompts in workloads:
    for engine in ("paged", "static"):
        s = run(["--engine", engine, *extra], prompts)
        results.append({"workload": name, "engine": engine, "requests": s["requests"],
                        "prompt_tokens": s["prompt_tokens"], "cached_prompt_tokens": s["cached_prompt_tokens"],
                        "output_tokens": s["output_tokens"], "seconds": round(s["seconds"], 3),
                        "output_tokens_per_s": round(s["output_tokens_per_s"], 1),
                        "total_tokens_per_s": round(s["total_tokens_per_s"], 1),
                        "mean_ttft_ms": round(s["mean_ttft_ms"], 1)})
        print(f"{name:48} {engine:6} {results[-1]['output_tokens_per_s']:8.1f} output tok/s "
              f"{results[-1]['total_tokens_per_s']:8.1f} total tok/s  TTFT {results[-1]['mean_ttft_ms']:8.1f} ms",
              flush=True)

commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = {"benchmark": "cpu_generate", "date": datetime.date.today().isoformat(), "commit": commit,
       "machine": {"cpu": cpu_name(), "cores": os.cpu_count()}, "backend": "cpu (f32 weights, OpenBLAS)",
       "model": os.path.basename(args.model), "repeat": args.repeat, "results": results}
path = os.path.join(root, "bench", "results", f"cpu-generate-{doc['date']}.json")
with open(path, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print("wrote", os.path.relpath(path, root))
