#!/usr/bin/env python3
"""infer-tokenize as a user runs it: ids equal HF's for the corpus, --chat equals HF's chat template, --decode
round-trips, and bad input gets a typed error.

usage: check_tokenize.py BIN_DIR MODEL FIXTURES_DIR"""
import json
import os
import subprocess
import sys

from harness import check, finish
import tempfile

bin_dir, model, fixtures = sys.argv[1:4]
exe = os.path.join(bin_dir, "infer-tokenize")
def run(*args):
    return subprocess.run([exe, "--model", model, *args], capture_output=True, text=True, timeout=120)


reference = json.load(open(os.path.join(fixtures, "smollm2", "encode_reference.json"), encoding="utf-8"))
with tempfile.TemporaryDirectory() as tmp:
    for case in reference["cases"]:
        # --file carries every text exactly (leading dashes, empty text, control characters)
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(case["text"])
        r = run("--file", path, "--json")
        ok = r.returncode == 0 and json.loads(r.stdout)["ids"] == case["ids"]
        check(ok, f"ids of {case['text']!r}: {r.stdout[:200]!r} {r.stderr!r}")
        if case["text"] and not case["text"].startswith("-"):
            r = run("--text", case["text"])
            check(r.returncode == 0 and r.stdout.split() == [str(i) for i in case["ids"]],
                  f"plain output for {case['text']!r}: {r.stdout!r}")
        if case["ids"]:
            r = run("--decode", " ".join(map(str, case["ids"])), "--json")
            check(r.returncode == 0 and json.loads(r.stdout)["text"] == case["text"], f"decode of {case['text']!r}")

    chat = json.load(open(os.path.join(fixtures, "smollm2", "chat_reference.json"), encoding="utf-8"))
    case = next(c for c in chat["cases"] if len(c["messages"]) == 1 and c["add_generation_prompt"])
    r = run("--text", case["messages"][0]["content"], "--chat", "--json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    check(doc.get("prompt") == case["text"], f"--chat prompt equals HF apply_chat_template: {doc.get('prompt')!r}")
    r2 = run("--file", os.devnull)  # sanity: empty file gives no ids
    check(r2.returncode == 0 and r2.stdout.strip() == "", "empty file gives no ids")
    path = os.path.join(tmp, "chat.txt")
    open(path, "w", encoding="utf-8").write(case["text"])
    r2 = run("--file", path, "--json")
    check(r2.returncode == 0 and json.loads(r2.stdout)["ids"] == doc.get("ids"), "--chat ids equal the rendered text's ids")

    r = run("--text", "<|im_start|>", "--no-special")
    check(r.returncode == 0 and "1" not in r.stdout.split(), f"--no-special tokenizes special text as plain: {r.stdout!r}")

    # bad input: typed errors, exit 1 (2 for usage), nothing on stdout
    r = run("--decode", "1 99999999")
    check(r.returncode == 1 and "99999999" in r.stderr and "invalid_argument" in r.stderr and not r.stdout,
          f"id out of range: {r.stderr!r}")
    r = run("--decode", "1 two")
    check(r.returncode == 1 and "'two'" in r.stderr, f"not an id: {r.stderr!r}")
    bad = os.path.join(tmp, "bad.txt")
    open(bad, "wb").write(b"ok \xff\xfe bytes")
    r = run("--file", bad)
    check(r.returncode == 1 and "tokenizer error" in r.stderr and "UTF-8" in r.stderr, f"invalid UTF-8: {r.stderr!r}")
    r = subprocess.run([exe, "--model", os.path.join(tmp, "none.gguf"), "--text", "x"], capture_output=True, text=True)
    check(r.returncode == 1 and "none.gguf" in r.stderr, f"missing model: {r.stderr!r}")
    r = run()
    check(r.returncode == 2 and "--text" in r.stderr, f"no input: {r.returncode} {r.stderr[:100]!r}")
    r = run("--text", "x", "--chat", "--chat-template", "vicuna")
    check(r.returncode == 1 and "chat_template" in r.stderr and "chatml" in r.stderr, f"unknown template: {r.stderr!r}")

finish()
