#!/usr/bin/env python3
"""infer-serve as third-party tools see it, with the default model on loopback:
  - the official `openai` Python client: models list, chat completion, streamed chat (with usage),
    completion, streamed completion, logprobs, and its typed errors for 400 / 401 / 404;
  - schemathesis fuzzes every operation of the server's own /openapi.json (examples, boundary values,
    random and schema-violating bodies): no 5xx, no request past its timeout, and the server still
    healthy with an empty KV cache afterwards.

The tools are pinned in tests/programs/requirements-serve.txt and installed by scripts/setup.sh into
.venv/ at the repository root; this script re-runs itself under that interpreter. Without it the check
is skipped (exit 77) with the command that installs it — never passed.

usage: check_serve_clients.py BIN_DIR MODEL"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")

try:
    import openai  # noqa: F401 - present when running under the venv
except ImportError:
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(ROOT, ".venv"))
    if os.path.exists(VENV_PY) and not in_venv:
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__), *sys.argv[1:]])
    print(f"SKIPPED: the openai and schemathesis packages are not installed in {ROOT}/.venv; "
          "run scripts/setup.sh (it installs tests/programs/requirements-serve.txt there)")
    sys.exit(77)

import openai  # noqa: E402

from harness import check, finish  # noqa: E402
from serve_harness import Server  # noqa: E402

bin_dir, model = sys.argv[1:3]
KEY = "clients-key"
NAME = "smollm2"
schemathesis = os.path.join(os.path.dirname(sys.executable), "schemathesis")


def expect_error(kind, fn, status, contains=""):
    try:
        fn()
    except kind as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(e.status_code == status and contains in str(e) and {"message", "type", "param", "code"} <= set(body),
              f"{kind.__name__}: status {e.status_code}, body {body}")
        return
    except Exception as e:  # noqa: BLE001 - any other outcome is the failure
        check(False, f"expected {kind.__name__}, got {e!r}")
        return
    check(False, f"expected {kind.__name__}, the call succeeded")


def server_errors(s):
    """{"route status": count} of the 5xx responses the server has counted."""
    return {dict(ls)["route"] + " " + dict(ls)["status"]: v for (n, ls), v in s.metrics().items()
            if n == "infer:http_requests_total" and dict(ls)["status"][0] == "5"}


# max_model_len 64 and at most 4 choices per request bound what any one request can cost (the document
# says so), so the fuzzer cannot ask the CPU engine for minutes of generation.
with Server(bin_dir, model, "--api-key", KEY, "--served-model-name", NAME, "--max-model-len", "64",
            "--max-choices", "4") as s:
    client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, timeout=120, max_retries=0)

    # ---- the openai client ---------------------------------------------------------------------------
    models = client.models.list()
    check([m.id for m in models.data] == [NAME], f"models.list: {models}")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    content = chat.choices[0].message.content
    check(isinstance(content, str) and content and chat.choices[0].finish_reason in ("stop", "length")
          and chat.usage.completion_tokens >= 1 and chat.usage.total_tokens == chat.usage.prompt_tokens
          + chat.usage.completion_tokens, f"chat.completions.create: {chat}")
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == content, f"streamed chat equals the whole one: {streamed!r} vs {content!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens,
          f"the streamed chat's last chunk carries usage: {chunks[-1]}")
    comp = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0)
    check(comp.choices[0].text and comp.usage.prompt_tokens == 5, f"completions.create: {comp}")
    parts = list(client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8,
                                           temperature=0, stream=True))
    check("".join(p.choices[0].text for p in parts if p.choices) == comp.choices[0].text,
          "streamed completion equals the whole one")
    lp = client.chat.completions.create(model=NAME, messages=messages, max_tokens=3, temperature=0, logprobs=True,
                                        top_logprobs=2)
    check(len(lp.choices[0].logprobs.content) == 3 and all(len(t.top_logprobs) == 2 for t in lp.choices[0].logprobs.content),
          f"chat logprobs through the client: {lp.choices[0].logprobs}")
    expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
        model=NAME, messages=messages, temperature=3), 400, "temperature")
    expect_error(openai.BadRequestError, lambda: client.completions.create(
        model=NAME, prompt="x", max_tokens=100), 400, "64")
    expect_error(openai.BadRequestError, lambda: client.completions.create(
        model=NAME, prompt=["a", "b"], n=3, max_tokens=1), 400, "at most 4")
    expect_error(openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt="x"), 404, "gpt-4")
    bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", timeout=30, max_retries=0)
    expect_error(openai.AuthenticationError, lambda: bad.models.list(), 401)

    # ---- schemathesis, from the server's own OpenAPI document -----------------------------------------
    # The 503s /health gave while the model loaded (the harness polls it) are not the fuzzer's.
    five_before = server_errors(s)
    report = tempfile.mkdtemp(prefix="infer-schemathesis-")
    # One worker: hypothesis is not thread-safe on every Python (3.11 fails inside ast.parse with two).
    cmd = [schemathesis, "run", s.url + "/openapi.json", "--checks", "not_a_server_error", "--max-examples", "10",
           "--phases", "coverage,fuzzing", "--request-timeout", "60", "--seed", "1", "--workers", "1",
           "--generation-database", "none", "--no-color", "-H", f"Authorization: Bearer {KEY}",
           "--report", "junit", "--report-dir", report]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=report)
        out = r.stdout + r.stderr
        code = r.returncode
    except subprocess.TimeoutExpired as e:
        out, code = f"schemathesis did not finish in 240 s: {e.stdout!r}", None
    print(out[-3000:])
    check(code == 0, f"schemathesis: no 5xx and no timeout over every operation (exit {code})")
    junit = "".join(open(os.path.join(report, f)).read() for f in os.listdir(report) if f.endswith(".xml"))
    tested = {op for op in ("POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize", "POST /detokenize",
                            "GET /v1/models", "GET /health", "GET /metrics", "GET /version") if op in junit}
    # (schemathesis leaves out the document's own path, /openapi.json)
    check(len(tested) == 8 and "Operations:       8 selected / 8 total" in out,
          f"schemathesis tested every operation of the document: {sorted(tested)}")
    check(s.request("GET", "/health", timeout=30)[0] == 200, "healthy after the fuzzing")
    usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0, timeout=60)
    check(usage == 0, f"KV cache empty after the fuzzing ({usage})")
    five = server_errors(s)
    grew = {k: v - five_before.get(k, 0) for k, v in five.items() if v != five_before.get(k, 0)}
    check(not grew, f"the server counted no 5xx responses while fuzzed ({grew})")
    check(s.terminate(timeout=60) == 0, "exit 0 after SIGTERM")

finish()
