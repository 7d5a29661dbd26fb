#!/usr/bin/env python3
"""infer-serve --data-parallel-size 2 (CPU backend, the default model): two replicas of the engine behind the
router, balanced by prefix-cache affinity and queue depth (serve/router.hpp):
  - idle, the same prompt goes to the same replica every time (its KV blocks are cached there);
  - with both engine loops held, six copies of one prompt arriving one after another: the affine replica takes
    them until it has kAffinitySlack (2) more outstanding than the other, then they alternate: 4 and 2;
  - both replicas give the same greedy text (one model);
  - infer:router_requests_total counts what the X-Infer-Engine headers showed;
  - --data-parallel-size with --router is refused.

usage: check_serve_replicas.py BIN_DIR MODEL"""
import os
import subprocess
import sys
import threading
import time
from collections import Counter

from harness import check, finish
from serve_harness import Server

bin_dir, model = sys.argv[1:3]
seen = Counter()


def completion(s, prompt, max_tokens=8):
    st, h, c = s.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                          "ignore_eos": True})
    engine = h.get("x-infer-engine")
    if st == 200:
        seen[engine] += 1
    return st, engine, c["choices"][0]["text"] if st == 200 else c


with Server(bin_dir, model, "--data-parallel-size", "2", "--backend", "cpu", "--kv-cache-memory", "64M", "--max-model-len", "1024",
            "--enable-test-hooks") as s:
    # ---- affinity when idle -------------------------------------------------------------------------------
    first = [completion(s, "The capital of France is") for _ in range(3)]
    check(all(r[0] == 200 for r in first), f"three requests served: {[r[0] for r in first]}")
    affine = first[0][1]
    check(affine in ("replica-0", "replica-1") and all(r[1] == affine for r in first),
          f"the same prompt goes to one replica while idle: {[r[1] for r in first]}")

    # ---- queue depth beyond the slack -----------------------------------------------------------------------
    check(s.hold(), "both engine loops held")
    results = [None] * 6

    def one(i):
        try:
            results[i] = completion(s, "The capital of France is")
        except Exception as e:  # noqa: BLE001 - recorded as a failure below
            results[i] = ("exception", None, repr(e))
    threads = []
    for i in range(6):  # one after another, so each arrives with the previous ones outstanding
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        want = i + 1
        total = lambda: sum(s.metric("infer:num_requests_waiting", engine=e) for e in ("replica-0", "replica-1"))
        deadline = time.time() + 30
        while total() < want and time.time() < deadline:
            time.sleep(0.02)
    check(s.release(), "both engine loops released")
    for t in threads:
        t.join(timeout=300)
    check([r and r[0] for r in results] == [200] * 6, f"six held requests all served: {[r and r[0] for r in results]}")
    split = Counter(r[1] for r in results if r and r[0] == 200)
    other = "replica-1" if affine == "replica-0" else "replica-0"
    check(split == {affine: 4, other: 2}, f"the affine replica took 4 (up to 2 beyond the other), the other 2: {split}")
    texts = {r[2] for r in results if r and r[0] == 200} | {first[0][2]}
    check(len(texts) == 1, f"both replicas give the same greedy text: {texts}")

    for name in ("replica-0", "replica-1"):
        got = s.metric("infer:router_requests_total", engine=name)
        check(got == seen[name], f"infer:router_requests_total{{engine={name}}} = {got}, headers showed {seen[name]}")

r = subprocess.run([os.path.join(bin_dir, "infer-serve"), "--model", model, "--data-parallel-size", "2", "--router",
                    "x.json", "--port", "0"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "not both" in r.stderr, f"--data-parallel-size with --router refused: {r.returncode} {r.stderr!r}")

finish()
