#!/usr/bin/env python3
"""infer-generate's greedy tokens on the default model against HF transformers' (the committed reference), as
a user would run it on a backend: how many of the nine prompts are identical over the reference's 64 tokens,
and where the others first differ. A report, not a check: on the GPU a bf16 near-tie may rightly take the
other token; the [cuda] test "infer::LLM on the cuda backend" judges every token by the derived bound.

usage: compare_hf_greedy.py BIN_DIR MODEL FIXTURES_DIR BACKEND [ENGINE]"""
import json
import os
import subprocess
import sys

bin_dir, model, fixtures, backend = sys.argv[1:5]
engine = sys.argv[5] if len(sys.argv) > 5 else "paged"
ref = json.load(open(os.path.join(fixtures, "smollm2", "generate_reference.json"), encoding="utf-8"))
n = ref["new_tokens"]
cmd = [os.path.join(bin_dir, "infer-generate"), "--model", model, "--backend", backend, "--engine", engine,
       "--temperature", "0", "--ignore-eos", "--max-tokens", str(n), "--json", *[c["text"] for c in ref["cases"]]]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
if r.returncode != 0:
    sys.exit(f"infer-generate exited {r.returncode}: {r.stderr[-500:]}")
doc = json.loads(r.stdout)
identical, lines = 0, []
for c, res in zip(ref["cases"], doc["results"]):
    got, want = res["outputs"][0]["token_ids"], c["greedy_ids"][:n]
    if res["prompt_token_ids"] != c["prompt_ids"]:
        lines.append(f"  {c['text'][:30]!r}: prompt ids differ from HF's")
        continue
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    identical += first is None and len(got) == len(want)
    if first is not None:
        lines.append(f"  {c['text'][:30]!r}: first differs at token {first} ({got[first]} vs HF {want[first]})")
print(f"infer-generate --backend {doc.get('backend', backend)} --engine {engine}: {identical} of {len(ref['cases'])} "
      f"prompts identical to HF over {n} greedy tokens")
print("\n".join(lines))
