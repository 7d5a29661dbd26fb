#!/usr/bin/env python3
"""infer-inspect as a user runs it: the default model's tensor table against gguf-py's, and bad input.

usage: check_inspect.py BIN_DIR MODEL FIXTURES_DIR"""
import json
import os
import subprocess
import sys

from harness import check, finish
import tempfile

bin_dir, model, fixtures = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-inspect")
def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


# --json: one document; every tensor with the type, shape and size gguf-py reads
r = run(model, "--json")
check(r.returncode == 0, f"--json exits 0 (got {r.returncode}: {r.stderr})")
doc = json.loads(r.stdout)
ref = json.load(open(os.path.join(fixtures, "smollm2", "tensor_table.json")))
check(doc["format"] == "gguf" and doc["version"] == ref["version"], "format gguf, version 3")
check(doc["architecture"] == "llama", "architecture llama")
check(len(doc["tensors"]) == len(ref["tensors"]) == 272, f"272 tensors (got {len(doc['tensors'])})")
for mine, theirs in zip(doc["tensors"], ref["tensors"]):
    same = (mine["name"] == theirs["name"] and mine["type"].upper() == theirs["type"]
            and mine["shape"] == theirs["shape"] and mine["bytes"] == theirs["bytes"])
    check(same, f"tensor {theirs} listed as {mine}")
cfg = doc["config"]
check(cfg["num_layers"] == "30" and cfg["hidden_size"] == "576" and cfg["num_kv_heads"] == "3",
      f"config from metadata: {cfg}")
check(doc["metadata"]["tokenizer.ggml.tokens"]["value"]["count"] == 49152, "long arrays abbreviated with their count")
check(doc["metadata"]["llama.rope.freq_base"] == {"type": "f32", "value": 100000.0}, "typed metadata values")

# text: a line per tensor with its type and shape
r = run(model)
check(r.returncode == 0, "text mode exits 0")
lines = r.stdout.splitlines()
for t in ref["tensors"]:
    shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
    row = [ln for ln in lines if ln.split()[:1] == [t["name"]]]
    check(len(row) == 1 and t["type"].lower() in row[0] and shape in row[0] and str(t["bytes"]) in row[0],
          f"text row for {t['name']}: {row}")

# bad input: a typed error naming the problem, exit 1, nothing on stdout
with tempfile.TemporaryDirectory() as tmp:
    truncated = os.path.join(tmp, "cut.gguf")
    with open(model, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(4096))
    r = run(truncated)
    check(r.returncode == 1 and "format error" in r.stderr and "cut.gguf" in r.stderr and not r.stdout,
          f"truncated GGUF: {r.returncode} {r.stderr!r}")
    garbage = os.path.join(tmp, "garbage.bin")
    open(garbage, "wb").write(b"\x01" * 64)
    r = run(garbage)
    check(r.returncode == 1 and "error" in r.stderr and not r.stdout, f"not a model file: {r.stderr!r}")
    r = run(os.path.join(tmp, "missing.gguf"))
    check(r.returncode == 1 and "missing.gguf" in r.stderr, f"missing file: {r.stderr!r}")

finish()
