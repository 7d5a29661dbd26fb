#!/usr/bin/env python3
"""infer-serve fronting two engines through the hybrid router, with the default model on loopback:
  - the rules (prompt length, keywords, max_tokens) pick the engine, which the X-Infer-Engine header names;
  - both engines give the same greedy text (the same model behind either);
  - a request the static engine cannot run (max_tokens beyond its slot) falls back to the paged one;
  - a full static engine spills over to the paged one instead of refusing;
  - infer:router_requests_total and infer:router_fallbacks_total count exactly what the headers showed;
  - infer-bench-serve drives the router at a Poisson rate and at a fixed concurrency and writes its record;
  - each engine may load its own model (here: the default model on the static engine, a random-weight
    SmolLM2 shape reading the default model's tokenizer on the paged one); engines whose tokenizers differ
    are refused at start, naming the difference.

usage: check_serve_router.py BIN_DIR MODEL"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter

from harness import check, finish
from serve_harness import Server

bin_dir, model = sys.argv[1:3]
tmp = tempfile.mkdtemp(prefix="infer-router-")
config = {
    "engines": [{"name": "short", "engine": "static", "max_waiting": 2},
                {"name": "long", "engine": "paged", "block_size": 16, "kv_cache_memory": "96M", "max_waiting": 64}],
    "rules": [{"engine": "long", "min_prompt_tokens": 64},
              {"engine": "long", "keywords": ["step by step", "explain"]},
              {"engine": "long", "min_max_tokens": 600}],
    "default": "short",
    "fallback": ["long"],
}
config_path = os.path.join(tmp, "router.json")
with open(config_path, "w") as f:
    json.dump(config, f)

seen = Counter()  # engine -> requests it served, from the response headers


def completion(s, body):
    st, h, c = s.post("/v1/completions", dict({"temperature": 0, "ignore_eos": True}, **body))
    if st == 200:
        seen[h.get("x-infer-engine")] += 1
    return st, h.get("x-infer-engine"), c


# --enable-test-hooks: the spill-over check holds both engine loops so the static engine is full however fast it runs.
with Server(bin_dir, model, "--router", config_path, "--max-model-len", "2048", "--enable-test-hooks") as s:
    # ---- rules ---------------------------------------------------------------------------------------
    st, engine, short = completion(s, {"prompt": "The capital of France is", "max_tokens": 12})
    check(st == 200 and engine == "short", f"a short prompt goes to the static engine: {st} {engine}")
    long_prompt = "The history of the river is " + " ".join(["long and winding"] * 30) + ". It"
    st, engine, _ = completion(s, {"prompt": long_prompt, "max_tokens": 4})
    check(st == 200 and engine == "long", f"a prompt of >= 64 tokens goes to the paged engine: {st} {engine}")
    st, h, c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Explain tides"}],
                                               "max_tokens": 4})
    if st == 200:
        seen[h.get("x-infer-engine")] += 1
    check(st == 200 and h.get("x-infer-engine") == "long", f"a keyword (case-insensitive) picks the paged engine: {h}")
    st, engine, _ = completion(s, {"prompt": "The capital of France is", "max_tokens": 600, "stop": ["."],
                                   "ignore_eos": False})
    check(st == 200 and engine == "long", f"max_tokens >= 600 goes to the paged engine: {st} {engine}")

    # ---- the same model behind either engine ---------------------------------------------------------
    # max_tokens 520 is beyond the static engine's slot (512 output tokens) and below the rule's 600: the
    # default engine refuses the shape and the paged one runs it (to the first "." so it stays short).
    # Greedy, the paged engine's text is a prefix of the static engine's 12 tokens for the same prompt.
    st3, engine3, via_paged = completion(s, {"prompt": "The capital of France is", "max_tokens": 520, "stop": ["."],
                                             "ignore_eos": False})
    text = via_paged["choices"][0]["text"] if st3 == 200 else None
    check(st3 == 200 and engine3 == "long" and text and via_paged["choices"][0]["finish_reason"] == "stop"
          and short["choices"][0]["text"].startswith(text + "."),
          f"greedy text is the same on both engines: {short['choices'][0]['text']!r} vs {text!r} ({engine3})")
    fallbacks = s.metric("infer:router_fallbacks_total", route="short->long")
    check(fallbacks >= 1, f"the shape the static engine cannot run fell back to the paged one ({fallbacks})")

    # ---- a full static engine spills over --------------------------------------------------------------
    # Both loops held, nothing is admitted or finishes while the 20 arrive: the static engine takes its 8
    # slots + 2 waiting and refuses the rest, which the paged one queues. Released, all are served.
    before = s.metric("infer:router_fallbacks_total", route="short->long")
    check(s.hold(), "both engine loops held")
    results = [None] * 20

    def one(i):
        try:
            results[i] = completion(s, {"prompt": f"Number {i} is", "max_tokens": 24})
        except Exception as e:  # noqa: BLE001 - recorded as a failure below
            results[i] = ("exception", None, repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    queued = {e: s.wait_metric("infer:num_requests_waiting", lambda v: v == 10, engine=e) for e in ("short", "long")}
    check(queued == {"short": 10, "long": 10}, f"10 queued on each held engine: {queued}")
    check(s.release(), "both engine loops released")
    for t in threads:
        t.join(timeout=300)
    statuses = [r and r[0] for r in results]
    engines = Counter(r[1] for r in results if r and r[0] == 200)
    check(statuses == [200] * 20, f"20 concurrent short requests all served: {statuses}")
    check(engines == {"short": 10, "long": 10},
          f"the static engine took what it could (8 slots + 2 waiting), the rest spilled to the paged one: {engines}")
    after = s.metric("infer:router_fallbacks_total", route="short->long")
    check(after - before == engines["long"], f"every spill-over counted as a fallback ({before} -> {after}, {engines})")

    # ---- metrics name the engine that served ---------------------------------------------------------
    for name in ("short", "long"):
        got = s.metric("infer:router_requests_total", engine=name)
        check(got == seen[name], f"infer:router_requests_total{{engine={name}}} = {got}, headers showed {seen[name]}")
    check(s.metric("infer:kv_cache_usage_perc", engine="long") == 0 or
          s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0, engine="long") == 0, "paged KV empty after")

    # ---- infer-bench-serve against the router -----------------------------------------------------------
    bench = os.path.join(bin_dir, "infer-bench-serve")
    runs = [(["--request-rate", "20", "--endpoint", "completions"], "Poisson arrivals, completions"),
            (["--max-concurrency", "4", "--endpoint", "chat"], "fixed concurrency, chat")]
    if not os.path.exists(bench):
        print("infer-bench-serve is not built (INFER_BUILD_BENCH=OFF): its checks are left out")
        runs = []
    for args, what in runs:
        out = os.path.join(tmp, "bench.json")
        r = subprocess.run([bench, "--url", s.url, "--num-prompts", "12", "--random-input-len", "6",
                            "--random-output-len", "5", "--goodput", "ttft:60000", "e2e:120000", "--seed", "1",
                            "--result-file", out, *args], capture_output=True, text=True, timeout=300)
        check(r.returncode == 0 and "Time to First Token" in r.stdout, f"infer-bench-serve {what}: exit {r.returncode} "
              f"{r.stdout[-800:]} {r.stderr[-800:]}")
        rec = json.load(open(out)) if os.path.exists(out) else {}
        ok = (rec.get("completed") == 12 and rec.get("failed") == 0 and rec.get("total_output_tokens") == 60
              and rec["ttft_ms"]["count"] == 12 and rec["tpot_ms"]["count"] == 12
              and 0 < rec["ttft_ms"]["p50"] <= rec["e2e_ms"]["p50"] and rec["itl_ms"]["count"] >= 12 * 3
              and rec["ttft_ms"]["p50"] <= rec["ttft_ms"]["p90"] <= rec["ttft_ms"]["p99"]
              and rec["good_requests"] == 12 and rec["request_throughput"] > 0
              and sum(rec["served_by"].values()) == 12
              and {k: v["completed"] for k, v in rec["by_engine"].items()} == rec["served_by"]
              and all(v["ttft_ms"]["p50"] > 0 for v in rec["by_engine"].values()))
        check(ok, f"bench record for {what}: {json.dumps(rec)[:1500]}")
        os.remove(out) if os.path.exists(out) else None
    if runs:
        r = subprocess.run([bench, "--url", s.url, "--num-prompts", "2", "--random-output-len", "2", "--model", "nope",
                            "--no-save"], capture_output=True, text=True, timeout=120)
        check(r.returncode == 2 and "HTTP 404" in r.stdout, f"bench reports failed requests with their error: {r.stdout[-500:]}")
    check(s.terminate(timeout=60) == 0, "exit 0 after SIGTERM")

# ---- each engine its own model ----------------------------------------------------------------------------
# The classic hybrid setup in small: the real model on the static engine for short prompts, another model
# (a random-weight shape, the default model's tokenizer) on the paged one for the rest. The greedy text
# tells the models apart.
two_models = {
    "engines": [{"name": "small", "engine": "static", "max_batch": 4, "max_input": 128, "max_output": 64},
                {"name": "big", "engine": "paged", "dummy": "smollm2-135m", "tokenizer": model, "dummy_seed": 3,
                 "kv_cache_memory": "64M", "max_model_len": 1024}],
    "rules": [{"engine": "big", "keywords": ["summarize", "code"]}],
    "default": "small",
}
with open(config_path, "w") as f:
    json.dump(two_models, f)
with Server(bin_dir, model, "--router", config_path) as s:
    out = s.output()
    check("engine 'small' ready (" + os.path.basename(model) + " on cpu, static" in out
          and "engine 'big' ready (dummy-smollm2-135m on cpu, paged" in out,
          f"each engine names the model it loaded: {[l for l in out.splitlines() if 'ready' in l]}")
    check(out.index("engine 'small' ready") < out.index("engine 'big' ready"), "engines load in config order")
    texts = {}
    for prompt in ("The capital of France is", "Please summarize: the capital of France is"):
        st, h, c = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        check(st == 200, f"served: {st} {c}")
        if st == 200:
            texts[h.get("x-infer-engine")] = c["choices"][0]["text"]
    check(set(texts) == {"small", "big"}, f"the rule sends the keyword prompt to the other model: {sorted(texts)}")
    st, _, c = s.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
                                          "ignore_eos": True})
    check(st == 200 and c["choices"][0]["text"] == texts.get("small"), "the static engine's model answers the same twice")
    check(texts.get("small") != texts.get("big"), f"two models, two answers: {texts}")
    check(s.terminate(timeout=60) == 0, "exit 0 after SIGTERM")

# A tokenizer that differs in one token (two vocabulary entries swapped) cannot sit behind the same router.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "smollm2", "tokenizer.json")) as f:
    tok = json.load(f)
vocab = tok["model"]["vocab"]
a, b = sorted(vocab, key=vocab.get)[1000:1002]
vocab[a], vocab[b] = vocab[b], vocab[a]
swapped = os.path.join(tmp, "swapped-tokenizer.json")
with open(swapped, "w") as f:
    json.dump(tok, f)
two_models["engines"][1]["tokenizer"] = swapped
with open(config_path, "w") as f:
    json.dump(two_models, f)
r = subprocess.run([os.path.join(bin_dir, "infer-serve"), "--model", model, "--router", config_path, "--port", "0"],
                   capture_output=True, text=True, timeout=300)
check(r.returncode == 1 and "engines 'small' and 'big' read different tokenizers (token 1000 differs)" in r.stderr,
      f"engines with different tokenizers are refused: {r.returncode} {r.stderr[-400:]}")

# An engine on a backend this machine does not have: exit 2 with the reason, as every program does.
if shutil.which("nvidia-smi") is None:
    two_models["engines"][1]["tokenizer"] = model
    two_models["engines"][1]["backend"] = "cuda"
    with open(config_path, "w") as f:
        json.dump(two_models, f)
    r = subprocess.run([os.path.join(bin_dir, "infer-serve"), "--model", model, "--router", config_path, "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "infer-serve: " in r.stderr and "cuda" in r.stderr,
          f"an engine on the cuda backend without a GPU: exit 2 ({r.returncode} {r.stderr[-300:]!r})")

# A config with a mistake is refused at start, naming the field.
bad = dict(config, rules=[{"engine": "nowhere", "min_prompt_tokens": 1}])
with open(config_path, "w") as f:
    json.dump(bad, f)
r = subprocess.run([os.path.join(bin_dir, "infer-serve"), "--model", model, "--router", config_path, "--port", "0"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 1 and "rules[0].engine 'nowhere'" in r.stderr, f"a bad router config is refused: {r.stderr}")

finish()
