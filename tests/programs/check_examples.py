#!/usr/bin/env python3
"""infer-chat streams replies to piped input; infer-custom-policy serves shortest prompts first;
infer-offline-batch runs the offline batch job on either engine.

usage: check_examples.py BIN_DIR MODEL"""
import os
import re
import subprocess
import sys

from harness import check, finish

bin_dir, model = sys.argv[1:3]
r = subprocess.run([os.path.join(bin_dir, "infer-chat"), "--model", model, "--temperature", "0", "--max-tokens", "24"],
                   input="What is the capital of Italy?\n/reset\nName a color.\n/exit\n", capture_output=True,
                   text=True, timeout=300)
check(r.returncode == 0, f"infer-chat exits 0: {r.stderr!r}")
replies = r.stdout.split("(new conversation)")
check(len(replies) == 2 and all(part.strip() for part in replies), f"infer-chat answers each turn: {r.stdout!r}")

r = subprocess.run([os.path.join(bin_dir, "infer-custom-policy"), model], capture_output=True, text=True, timeout=300)
check(r.returncode == 0, f"infer-custom-policy exits 0: {r.stderr!r}")
lengths = [int(m) for m in re.findall(r"\((\d+) prompt tokens\)", r.stdout)]
check(len(lengths) == 4 and lengths == sorted(lengths), f"shortest prompt first: {lengths}")

batch = os.path.join(bin_dir, "infer-offline-batch")
for engine in ("paged", "static"):
    r = subprocess.run([batch, "--model", model, "--backend", "cpu", "--engine", engine, "--prompts", "6", "--max-tokens",
                        "8"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and re.search(rf"^6 requests on the {engine} engine \(cpu\), [\d.]+ s: \d+ tokens generated, "
                                          r"[\d.]+ tokens/s$", r.stdout, re.M) is not None,
          f"infer-offline-batch --engine {engine}: summary line ({r.returncode}, {r.stdout[:200]!r}, {r.stderr[-200:]!r})")
    answers = re.findall(r"^--- (.*) ---$", r.stdout, re.M)
    check(answers == ["What is the capital of France?"] * 3, f"the first 3 answers are shown: {answers}")
r = subprocess.run([batch, "--model", model, "--prompts", "2", "--max-tokens", "2"], capture_output=True, text=True,
                   timeout=300)
check(r.returncode == 0 and re.search(r"engine \((cpu|cuda)\)", r.stdout), f"--backend auto picks one: {r.stdout[:120]!r}")

finish()
