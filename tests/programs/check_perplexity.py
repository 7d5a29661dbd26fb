#!/usr/bin/env python3
"""infer-perplexity as a user runs it: perplexity of the default model over the committed text (a slice of it),
the same through an int8 engine file (--build-if-missing), and bad input refused with a message.

usage: check_perplexity.py BIN_DIR MODEL FIXTURES_DIR"""
import json
import math
import os
import subprocess
import sys
import tempfile

from harness import check, finish

bin_dir, model, fixtures = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-perplexity")
text = os.path.join(fixtures, "..", "..", "data", "text", "alice_in_wonderland.txt")
slice_args = ["--file", text, "--limit", "400", "--context", "128", "--stride", "64", "--json", "--backend", "cpu"]


def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)


r = run("--model", model, *slice_args)
doc = json.loads(r.stdout) if r.returncode == 0 else {}
check(r.returncode == 0, f"exit 0 ({r.stderr[-300:]!r})")
ppl = doc.get("perplexity", float("nan"))
# 399 tokens after the first, in windows of 128 starting every 64: ceil((400 - 128) / 64) + 1 = 6
check(doc.get("scored_tokens") == 399 and doc.get("windows") == 6, f"every token after the first scored once: {doc}")
# SmolLM2-135M-Instruct on Carroll's prose: about 20 (a broken model gives hundreds or thousands; a model
# that has seen this exact slice, below 2)
check(math.isfinite(ppl) and 5 < ppl < 60, f"a perplexity a 135M model has on English prose: {ppl}")
check(doc.get("text_tokens", 0) > 30000, f"the whole text tokenized: {doc.get('text_tokens')} tokens")
print(f"f32: perplexity {ppl:.4f} over {doc.get('scored_tokens')} tokens")

with tempfile.TemporaryDirectory() as tmp:
    f8 = os.path.join(tmp, "int8.engine")
    r = run("--model", model, "--engine-file", f8, "--build-if-missing", "--quantizer", "int8", *slice_args)
    d8 = json.loads(r.stdout) if r.returncode == 0 else {}
    p8 = d8.get("perplexity", float("nan"))
    check(r.returncode == 0 and d8.get("quantizer") == "int8", f"int8 engine file: exit 0 ({r.stderr[-300:]!r})")
    # W8A16 per channel moves a 135M model's perplexity by well under 1% on long texts; a 400-token slice is noisier
    check(math.isfinite(p8) and abs(p8 / ppl - 1) < 0.05, f"int8 within 5% of f32: {p8} vs {ppl}")
    print(f"int8 (engine file): perplexity {p8:.4f} ({(p8 / ppl - 1) * 100:+.2f}% of f32)")

r = run("--model", model, "--file", text, "--context", "64", "--stride", "64", "--limit", "100")
check(r.returncode == 1 and "stride" in r.stderr and "overlap" in r.stderr, f"stride = context refused: {r.stderr!r}")
r = run("--model", model, "--file", os.path.join(fixtures, "no-such-text.txt"))
check(r.returncode == 1 and "cannot read --file" in r.stderr, f"a missing text named: {r.stderr!r}")
finish()
