#!/usr/bin/env python3
"""infer-chat streams replies to piped input; infer-custom-policy schedules by its own policy (aged shortest
first, 16 prefill tokens a step); infer-custom-kernels counts what the decoder asks of its attention kernel and
quantizer; infer-offline-batch runs the offline batch job on either engine.

usage: check_examples.py BIN_DIR MODEL"""
import json
import os
import re
import subprocess
import sys
import tempfile

from harness import check, finish

bin_dir, model = sys.argv[1:3]
r = subprocess.run([os.path.join(bin_dir, "infer-chat"), "--model", model, "--temperature", "0", "--max-tokens", "24"],
                   input="What is the capital of Italy?\n/reset\nName a color.\n/exit\n", capture_output=True,
                   text=True, timeout=300)
check(r.returncode == 0, f"infer-chat exits 0: {r.stderr!r}")
replies = r.stdout.split("(new conversation)")
check(len(replies) == 2 and all(part.strip() for part in replies), f"infer-chat answers each turn: {r.stdout!r}")

policy = os.path.join(bin_dir, "infer-custom-policy")
with tempfile.TemporaryDirectory() as tmp:
    trace = os.path.join(tmp, "trace.jsonl")
    r = subprocess.run([policy, model, "--trace", trace], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"infer-custom-policy exits 0: {r.stderr!r}")
    admitted = [(int(s), int(i), int(n)) for s, i, n in
                re.findall(r"^step +(\d+): admitted request (\d+) \((\d+) prompt tokens\)$", r.stdout, re.M)]
    order = [i for _, i, _ in admitted]
    # request 0 is the long prompt; 1..10 arrive one per step and are short
    check(sorted(order) == list(range(11)), f"every request admitted once: {order}")
    check(0 < order.index(0) < 10 and [i for i in order if i] == list(range(1, 11)),
          f"aged: the long prompt overtakes the later short ones, the short ones come in arrival order: {order}")
    steps = [json.loads(line) for line in open(trace)] if r.returncode == 0 else []
    prefill = [sum(c["count"] for c in s["chunks"] if c["kind"] == "prefill") for s in steps]
    check(steps and max(prefill) == 16 and "at most 16 prefill tokens in one step" in r.stdout,
          f"the prefill budget: {prefill}")
r = subprocess.run([policy, model, "--age-weight", "0"], capture_output=True, text=True, timeout=300)
order = [int(i) for i in re.findall(r"admitted request (\d+)", r.stdout)]
check(r.returncode == 0 and sorted(order) == list(range(11)) and order[-1] == 0,
      f"not aged: the long prompt waits for the whole stream: {order}")

r = subprocess.run([os.path.join(bin_dir, "infer-custom-kernels"), model, "--max-tokens", "6"], capture_output=True,
                   text=True, timeout=300)
m = [re.search(p, r.stdout) for p in (r"decoder: (\d+) layers, (\d+) steps, (\d+) chunks",
                                      r"quantizer: (\d+) weights loaded, (\d+) matmuls", r"attention: (\d+) calls")]
check(r.returncode == 0 and all(m), f"infer-custom-kernels reports its counts: {r.stdout!r} {r.stderr!r}")
if all(m):
    layers, steps, chunks = map(int, m[0].groups())
    loads, matmuls = map(int, m[1].groups())
    calls = int(m[2].group(1))
    check(layers == 30 and steps == 6 and chunks == 6, f"SmolLM2: 30 layers, one request of 6 tokens: {m[0].group(0)}")
    # 7 linear layers per decoder layer and the LM head (tied: the embedding, loaded once through the quantizer);
    # one request, so every step samples and runs the head.
    check(loads == 7 * layers + 1 and matmuls == (7 * layers + 1) * steps,
          f"7 linear layers per layer and the LM head through the quantizer: {m[1].group(0)}")
    check(calls == layers * chunks, f"one attention call per layer and chunk: {calls}")

batch = os.path.join(bin_dir, "infer-offline-batch")
for engine in ("paged", "static"):
    r = subprocess.run([batch, "--model", model, "--backend", "cpu", "--engine", engine, "--prompts", "6", "--max-tokens",
                        "8"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and re.search(rf"^6 requests on the {engine} engine \(cpu\), [\d.]+ s: \d+ tokens generated, "
                                          r"[\d.]+ tokens/s$", r.stdout, re.M) is not None,
          f"infer-offline-batch --engine {engine}: summary line ({r.returncode}, {r.stdout[:200]!r}, {r.stderr[-200:]!r})")
    answers = re.findall(r"^--- (.*) ---$", r.stdout, re.M)
    check(answers == ["What is the capital of France?"] * 3, f"the first 3 answers are shown: {answers}")
# A random-weight shape with a bare tokenizer.json (no chat template in it): refused with the way out named,
# then run with a built-in template.
fixture_tok = os.path.join(os.path.dirname(__file__), "..", "fixtures", "smollm2", "tokenizer.json")
dummy = [batch, "--dummy", "smollm2-135m", "--tokenizer", fixture_tok, "--backend", "cpu", "--prompts", "2",
         "--max-tokens", "2", "--show", "0"]
r = subprocess.run(dummy, capture_output=True, text=True, timeout=300)
check(r.returncode == 1 and "no chat template" in r.stderr and "--chat-template" in r.stderr,
      f"a tokenizer without a template is refused, naming --chat-template: {r.stderr[-200:]!r}")
r = subprocess.run(dummy + ["--chat-template", "chatml"], capture_output=True, text=True, timeout=300)
check(r.returncode == 0 and re.search(r"^2 requests on the paged engine \(cpu\)", r.stdout, re.M) is not None,
      f"--dummy with --chat-template chatml runs: {r.stdout[:200]!r} {r.stderr[-200:]!r}")
r = subprocess.run([batch, "--model", model, "--prompts", "2", "--max-tokens", "2"], capture_output=True, text=True,
                   timeout=300)
check(r.returncode == 0 and re.search(r"engine \((cpu|cuda)\)", r.stdout), f"--backend auto picks one: {r.stdout[:120]!r}")

finish()
