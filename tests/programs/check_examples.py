#!/usr/bin/env python3
"""infer-chat streams replies to piped input; infer-custom-policy serves shortest prompts first.

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

finish()
