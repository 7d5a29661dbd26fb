#!/usr/bin/env python3
"""infer-serve driven over HTTP on loopback with the default model: both endpoints streaming and not,
greedy output equal to infer-generate's, the server-sent-event wire format and content types read byte
by byte, 32 concurrent streams batched together, every error case with its status and OpenAI-shaped
body (a NUL byte after the JSON is a 400, the Bearer scheme matches in any case, a 414, every status
counted in infer:http_requests_total), clients that hang up (streaming and not) after which the KV cache is empty again,
tokenize/detokenize, models, metrics, the OpenAPI document, a SIGTERM drain that exits 0, and SIGTERM
while loading and twice while draining (exit 0 at once).

usage: check_serve.py BIN_DIR MODEL"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from harness import check, finish
from serve_harness import HOST, Server, error_shape_ok

bin_dir, model = sys.argv[1:3]
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NAME = "smollm2"


def generate(*args):
    r = subprocess.run([os.path.join(bin_dir, "infer-generate"), "--model", model, *args, "--json"],
                       capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout)["results"][0]["outputs"][0] if r.returncode == 0 else None


def sse_exchange(port, path, body, what):
    """One streamed request read byte by byte with http.client, its framing checked; returns the chunks'
    JSON objects. The chunked body must end with its terminating chunk (http.client raises IncompleteRead
    otherwise) and nothing after it: the same kept-alive connection then serves another request."""
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", **AUTH})
        r = conn.getresponse()
        ctype = r.getheader("Content-Type", "")
        media, *params = [p.strip().lower() for p in ctype.split(";")]
        check(r.status == 200 and media == "text/event-stream" and set(params) <= {"charset=utf-8"},
              f"{what}: 200 text/event-stream (any charset UTF-8): {r.status} {ctype!r}")
        check(r.getheader("Transfer-Encoding") == "chunked" and r.getheader("Cache-Control") == "no-cache",
              f"{what}: chunked, not cached: {r.getheaders()}")
        raw = r.read()
        done = b"data: [DONE]\n\n"
        check(raw.endswith(done) and raw.count(b"[DONE]") == 1, f"{what}: ends with one data: [DONE]: {raw[-80:]!r}")
        blocks = raw[:-len(done)].split(b"\n\n")
        check(blocks[-1] == b"" and len(blocks) > 1, f"{what}: every event ends with a blank line")
        chunks = []
        for block in blocks[:-1]:
            ok = block.startswith(b"data: ") and b"\n" not in block and b"\r" not in block
            check(ok, f"{what}: an event is one 'data: ' line: {block[:120]!r}")
            try:
                chunks.append(json.loads(block[len(b"data: "):]))
            except ValueError:
                check(False, f"{what}: an event's data is JSON: {block[:120]!r}")
        sock = conn.sock  # None had the server closed the connection (http.client would then open another)
        conn.request("GET", "/health")
        r = conn.getresponse()
        check(sock is not None and conn.sock is sock and r.status == 200 and json.loads(r.read()) == {"status": "ok"},
              f"{what}: the same connection serves the next request after the stream")
        return chunks
    finally:
        conn.close()


def check_chunks(chunks, what, chat, usage):
    """OpenAI's chunk shape: one id and created throughout, the object type, choices with an index (chat:
    the first chunk opens with the assistant's role), the last choice's finish reason, and with
    include_usage a last chunk with no choices and the usage, null before it (absent without)."""
    obj, prefix = ("chat.completion.chunk", "chatcmpl-") if chat else ("text_completion", "cmpl-")
    check(chunks and all(c["object"] == obj and c["model"] == NAME for c in chunks)
          and len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith(prefix)
          and len({c["created"] for c in chunks}) == 1 and isinstance(chunks[0]["created"], int),
          f"{what}: {obj} chunks with one id and created: {chunks[:2]}")
    body = chunks[:-1] if usage else chunks
    check(all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 and "finish_reason" in c["choices"][0]
              for c in body), f"{what}: every chunk has one choice with index 0 and finish_reason")
    reasons = [c["choices"][0]["finish_reason"] for c in body]
    check(reasons[-1] == "length" and all(r is None for r in reasons[:-1]),
          f"{what}: only the last choice chunk has a finish reason: {reasons}")
    if chat:
        deltas = [c["choices"][0]["delta"] for c in body]
        check(deltas[0].get("role") == "assistant" and all("role" not in d for d in deltas[1:])
              and all(set(d) <= {"role", "content"} for d in deltas),
              f"{what}: the first delta carries the role, the others content: {deltas[:3]}")
    else:
        check(all(isinstance(c["choices"][0]["text"], str) for c in body), f"{what}: every choice has text")
    if usage:
        u = chunks[-1]
        check(u["choices"] == [] and u["usage"]["completion_tokens"] == 8
              and u["usage"]["total_tokens"] == u["usage"]["prompt_tokens"] + 8
              and all(c["usage"] is None for c in body),
              f"{what}: include_usage gives a last chunk with only the usage, null before: {u}")
    else:
        check(all("usage" not in c for c in chunks), f"{what}: no usage without include_usage")


def check_error(status, body, want_status, what, param=None, contains=()):
    ok = status == want_status and error_shape_ok(body)
    if ok and param is not None:
        ok = body["error"]["param"] == param
    if ok:
        ok = all(c in body["error"]["message"] for c in contains)
    check(ok, f"{what}: status {status} (want {want_status}), body {body!r}")


# --enable-test-hooks: the drain and the concurrent streams below hold the engine loop (/debug/hold) to pin
# the state they check instead of betting on the machine's speed.
with Server(bin_dir, model, "--api-key", KEY, "--served-model-name", NAME, "--served-model-name", "alias",
            "--max-model-len", "2048", "--max-request-body", "65536", "--enable-test-hooks") as s:
    st, h, body = s.health_at_start
    check(st == 503 and json.loads(body)["error"]["code"] == "loading" and "retry-after" in h,
          f"/health is 503 while loading: {st} {body!r}")
    st, _, body = s.request("GET", "/health")
    check(st == 200, f"/health 200 when ready: {st}")

    # ---- non-streaming, both endpoints -----------------------------------------------------------------
    prompt = "The capital of France is"
    st, h, c = s.post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                                          "ignore_eos": True}, AUTH)
    check(st == 200 and c["object"] == "text_completion" and c["model"] == NAME and c["id"].startswith("cmpl-"),
          f"completion: {st} {c!r}")
    check(h.get("x-infer-engine") == "paged", f"X-Infer-Engine header: {h}")
    ref = generate(prompt, "--temperature", "0", "--ignore-eos", "--max-tokens", "16")
    ref_text = ref["text"] if ref else None
    check(ref is not None and st == 200 and c["choices"][0]["text"] == ref["text"],
          f"greedy completion over HTTP equals infer-generate's: {c['choices'][0]['text']!r} vs {ref and ref['text']!r}")
    check(c["choices"][0]["finish_reason"] == "length" and c["usage"]["completion_tokens"] == 16
          and c["usage"]["prompt_tokens"] == 5 and c["usage"]["total_tokens"] == 21, f"usage: {c['usage']}")

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    st, _, c = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0}, AUTH)
    ref = generate("What is the capital of France?", "--chat", "--temperature", "0", "--max-tokens", "16")
    check(st == 200 and c["object"] == "chat.completion" and c["choices"][0]["message"]["role"] == "assistant",
          f"chat completion: {st} {c!r}")
    check(ref is not None and c["choices"][0]["message"]["content"] == ref["text"]
          and c["choices"][0]["finish_reason"] == ref["finish_reason"],
          f"greedy chat over HTTP equals infer-generate --chat: {c['choices'][0]!r} vs {ref!r}")
    check("Paris" in c["choices"][0]["message"]["content"], "the chat answer names Paris")

    # several prompts, n > 1, token-id prompts, stop strings, logprobs, seeds
    st, _, c = s.post("/v1/completions", {"prompt": ["Hello", "Goodbye"], "n": 2, "max_tokens": 3, "temperature": 0.8,
                                          "seed": 3}, AUTH)
    check(st == 200 and [x["index"] for x in c["choices"]] == [0, 1, 2, 3] and c["usage"]["completion_tokens"] <= 12,
          f"2 prompts x n=2: {st} {c!r}")
    # A seed fixes the draws, not the logits: on the CPU backend a step's batch composition (which of two
    # prompts were admitted together) can move logits in the last bits. One prompt whose n samples fork
    # from one prefill runs in the same batches every time, so its seeded text must repeat exactly.
    seeded = {"prompt": "Hello", "n": 2, "max_tokens": 6, "temperature": 0.8, "seed": 3}
    st1, _, c1 = s.post("/v1/completions", seeded, AUTH)
    st2, _, c2 = s.post("/v1/completions", seeded, AUTH)
    st3, _, c3 = s.post("/v1/completions", dict(seeded, seed=4), AUTH)
    texts = lambda c: [x["text"] for x in c["choices"]]  # noqa: E731
    check(st1 == st2 == st3 == 200 and texts(c1) == texts(c2) and texts(c1) != texts(c3),
          f"same seed, same text; another seed, another: {texts(c1)} {texts(c2)} {texts(c3)}")
    st, _, ids = s.post("/tokenize", {"prompt": prompt})
    check(st == 200 and ids["count"] == 5 and len(ids["tokens"]) == 5 and ids["max_model_len"] == 2048,
          f"/tokenize: {ids!r}")
    st, _, c = s.post("/v1/completions", {"prompt": ids["tokens"], "max_tokens": 16, "temperature": 0,
                                          "ignore_eos": True}, AUTH)
    check(st == 200 and c["choices"][0]["text"] == ref_text, "a token-id prompt gives the same text as the string")
    st, _, d = s.post("/detokenize", {"tokens": ids["tokens"]})
    check(st == 200 and d["prompt"] == prompt, f"/detokenize: {d!r}")
    st, _, c = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 30, "temperature": 0, "stop": ["."]}, AUTH)
    check(st == 200 and c["choices"][0]["finish_reason"] == "stop" and "." not in c["choices"][0]["text"],
          f"stop string: {c!r}")
    st, _, c = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2}, AUTH)
    lp = c["choices"][0]["logprobs"] if st == 200 else None
    check(lp is not None and len(lp["tokens"]) == 3 and len(lp["token_logprobs"]) == 3
          and all(len(t) == 2 for t in lp["top_logprobs"]) and all(v <= 0 for v in lp["token_logprobs"])
          and "".join(lp["tokens"]) == c["choices"][0]["text"], f"completion logprobs: {lp!r}")
    st, _, c = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 3, "temperature": 0,
                                               "logprobs": True, "top_logprobs": 2}, AUTH)
    lp = c["choices"][0]["logprobs"] if st == 200 else None
    check(lp is not None and len(lp["content"]) == 3 and all(len(t["top_logprobs"]) == 2 for t in lp["content"]),
          f"chat logprobs: {lp!r}")
    st, _, c = s.post("/v1/completions", {"prompt": "Hi", "echo": True, "max_tokens": 2}, AUTH)
    check(st == 200 and c["choices"][0]["text"].startswith("Hi"), f"echo: {c!r}")
    st, _, c = s.post("/v1/chat/completions", {"messages": messages, "max_completion_tokens": 2, "presence_penalty": 1,
                                               "frequency_penalty": 1, "repetition_penalty": 1.2, "top_k": 5,
                                               "top_p": 0.9, "min_p": 0.1, "unknown_field": {"x": 1}}, AUTH)
    check(st == 200 and c["usage"]["completion_tokens"] <= 2, f"every sampling field, unknown ones ignored: {st} {c!r}")

    # ---- streaming, both endpoints -------------------------------------------------------------------
    st, evs, done = s.stream("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                                 "ignore_eos": True, "stream": True,
                                                 "stream_options": {"include_usage": True}}, AUTH)
    text = "".join(e["choices"][0]["text"] for e in evs if e["choices"])
    check(st == 200 and done and text == ref_text, f"streamed completion equals the whole one: {text!r}")
    check(evs and evs[-1]["choices"] == [] and evs[-1]["usage"]["completion_tokens"] == 16
          and all(e["usage"] is None for e in evs[:-1]), "include_usage: a last usage chunk, null before")
    check([e["choices"][0]["finish_reason"] for e in evs if e["choices"]][-1] == "length", "stream finish reason")
    st, evs, done = s.stream("/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0,
                                                      "stream": True}, AUTH)
    check(st == 200 and done and evs[0]["choices"][0]["delta"].get("role") == "assistant"
          and all(e["object"] == "chat.completion.chunk" for e in evs) and all("usage" not in e for e in evs),
          "streamed chat: role first, chunks, no usage unless asked")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in evs)
    check(text == ref["text"], f"streamed chat equals infer-generate --chat: {text!r}")

    # ---- the SSE wire format and content types -------------------------------------------------------
    for path, req, chat in (("/v1/completions", {"prompt": prompt}, False),
                            ("/v1/chat/completions", {"messages": messages}, True)):
        for usage in (False, True):
            what = f"SSE {path}{' with include_usage' if usage else ''}"
            streamed = dict(req, max_tokens=8, ignore_eos=True, stream=True)
            if usage:
                streamed["stream_options"] = {"include_usage": True}
            check_chunks(sse_exchange(s.port, path, streamed, what), what, chat, usage)
        st, h, _ = s.request("POST", path, dict(req, max_tokens=2), headers=AUTH)
        check(st == 200 and h.get("content-type") == "application/json",
              f"{path} whole: Content-Type application/json: {st} {h.get('content-type')}")
        st, h, b = s.request("POST", path, dict(req, stream=True, temperature=5), headers=AUTH)
        check(st == 400 and h.get("content-type") == "application/json" and error_shape_ok(json.loads(b)),
              f"{path} streamed but refused: a JSON error, not an event stream: {st} {h.get('content-type')}")

    # ---- 32 concurrent streams ---------------------------------------------------------------------
    # Queued while the engine loop is held, they are all there when it resumes: batched together, 32
    # streams of 8 tokens take about 8 steps, where fewer than 8 running at a time would take 32 or more.
    results = [None] * 32

    def one(i):
        try:
            results[i] = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": f"Count to {i}"}],
                                                           "max_tokens": 8, "stream": True, "ignore_eos": True,
                                                           "stream_options": {"include_usage": True}}, AUTH,
                                  timeout=300)
        except Exception as e:  # noqa: BLE001 - recorded as a failed stream
            results[i] = e
    check(s.hold(), "engine loop held for the concurrent streams")
    steps0 = s.metric("infer:engine_steps_total")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    queued = s.wait_metric("infer:num_requests_waiting", lambda v: v == 32, timeout=60)
    check(queued == 32, f"32 streams queued on the held engine ({queued})")
    check(s.release(), "engine loop released")
    for t in threads:
        t.join(timeout=300)
    good = [r for r in results if isinstance(r, tuple) and r[0] == 200 and r[2] and r[1][-1]["usage"]["completion_tokens"] == 8]
    check(len(good) == 32, f"32 concurrent streams all complete: {[r if not isinstance(r, tuple) else r[0] for r in results]}")
    # The snapshot is published after the step whose responses went out: wait for the one showing none running.
    s.wait_metric("infer:num_requests_running", lambda v: v == 0)
    steps = s.metric("infer:engine_steps_total") - steps0
    check(steps < 32, f"they ran batched together: 32 x 8 tokens in {steps:.0f} steps")

    # ---- errors: status and OpenAI body --------------------------------------------------------------
    st, _, b = s.request("POST", "/v1/completions", raw=b'{"prompt": "x", ', headers=AUTH)
    check_error(st, json.loads(b), 400, "malformed JSON", param="body", contains=("not valid JSON",))
    st, _, b = s.post("/v1/completions", {"prompt": "x", "temperature": "hot"}, AUTH)
    check_error(st, b, 400, "wrong type", param="temperature", contains=("must be a number",))
    for field, value in [("temperature", 2.5), ("top_p", 0), ("top_p", 1.1), ("min_p", 1.5), ("presence_penalty", 3),
                         ("frequency_penalty", -2.1), ("repetition_penalty", 0), ("max_tokens", 0), ("n", 0),
                         ("logprobs", 50)]:
        st, _, b = s.post("/v1/completions", {"prompt": "x", field: value}, AUTH)
        check_error(st, b, 400, f"{field} = {value}", param=field, contains=(field,))
    st, _, b = s.post("/v1/completions", {"prompt": "x", "stop": [str(i) for i in range(17)]}, AUTH)
    check_error(st, b, 400, "17 stop strings", param="stop", contains=("16",))
    st, _, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, AUTH)
    check_error(st, b, 400, "prompt + max_tokens beyond the context", contains=("2048", "5000"))
    st, _, b = s.post("/v1/completions", {"prompt": "x " * 2100}, AUTH)
    check_error(st, b, 400, "prompt alone beyond the context", param="prompt", contains=("2048",))
    st, _, b = s.post("/v1/completions", {"prompt": [1, 2, 99999]}, AUTH)
    check_error(st, b, 400, "token id outside the vocabulary", param="prompt", contains=("99999", "49152"))
    st, _, b = s.post("/v1/chat/completions", {"messages": []}, AUTH)
    check_error(st, b, 400, "empty messages", param="messages")
    st, h, b = s.post("/v1/completions", {"prompt": "x"})
    check_error(st, b, 401, "no API key", contains=("API key",))
    check(h.get("www-authenticate") == "Bearer", "401 names the Bearer scheme")
    st, _, b = s.post("/v1/completions", {"prompt": "x"}, {"Authorization": "Bearer wrong"})
    check_error(st, b, 401, "wrong API key")
    st, _, b = s.request("GET", "/v1/models")
    check_error(st, json.loads(b), 401, "models without a key")
    st, _, b = s.post("/v1/completions", {"model": "gpt-4", "prompt": "x"}, AUTH)
    check_error(st, b, 404, "unknown model", param="model", contains=("gpt-4",))
    check(b["error"]["code"] == "model_not_found", "unknown model: code model_not_found")
    st, _, b = s.request("GET", "/v1/nothing-here", headers=AUTH)
    check_error(st, json.loads(b), 404, "unknown route", contains=("/v1/nothing-here",))
    st, _, b = s.request("GET", "/v1/completions", headers=AUTH)
    check_error(st, json.loads(b), 405, "wrong method")
    st, _, b = s.request("POST", "/v1/completions", raw=json.dumps({"prompt": "x" * 70000}).encode(), headers=AUTH)
    check_error(st, json.loads(b), 413, "oversized body", contains=("65536",))
    st, _, c = s.post("/v1/completions", {"model": "alias", "prompt": "x", "max_tokens": 1}, AUTH)
    check(st == 200 and c["model"] == "alias", "a second served name")
    # nlohmann's parser ends a document at a NUL byte; the server refuses what follows it instead of ignoring it
    st, _, b = s.request("POST", "/v1/completions", raw=b'{"prompt": "x", "max_tokens": 1}\x00{"more": 1}', headers=AUTH)
    check_error(st, json.loads(b), 400, "bytes after the JSON document (behind a NUL)", param="body", contains=("NUL",))
    st, _, c = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, {"Authorization": f"bearer {KEY}"})
    check(st == 200, f"the auth scheme is case-insensitive (RFC 7235): 'bearer KEY' gets {st}")
    st, h, b = s.request("HEAD", "/health")
    check(st == 200 and b == b"" and h.get("content-length") == str(len(b'{"status":"ok"}')),
          f"HEAD /health: GET's head, no body: {st} {h} {b!r}")
    st, _, b = s.request("GET", "/v1/models?" + "q" * 9000, headers=AUTH)
    check_error(st, json.loads(b), 414, "a request target beyond 8 KiB", contains=("8192",))
    # every status is counted, whichever layer answered it
    counted = {dict(ls)["status"] for (n, ls), v in s.metrics().items() if n == "infer:http_requests_total" and v > 0}
    check({"200", "400", "401", "404", "405", "413", "414"} <= counted,
          f"infer:http_requests_total counts every status answered: {sorted(counted)}")
    check(s.metric("infer:http_requests_total", route="/v1/completions", status="405") == 1,
          "the 405 is counted under its route")

    # ---- clients that hang up --------------------------------------------------------------------------
    def hang_up(stream):
        body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 1500, "ignore_eos": True,
                           "stream": stream}).encode()
        sock = socket.create_connection((HOST, s.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        if stream:
            got = b""
            while b"data: " not in got:  # the generation is running: a token arrived
                got += sock.recv(4096)
        else:
            deadline = time.time() + 30
            while s.metric("infer:num_requests_running") < 1 and time.time() < deadline:
                time.sleep(0.05)
        sock.close()
    for stream in (True, False):
        aborted = s.metric("infer:request_success_total", finished_reason="abort")
        hang_up(stream)
        usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0)
        running = s.wait_metric("infer:num_requests_running", lambda v: v == 0)
        after = s.wait_metric("infer:request_success_total", lambda v: v > aborted, finished_reason="abort")
        check(usage == 0 and running == 0 and after == aborted + 1,
              f"{'streaming' if stream else 'non-streaming'} client hangs up: request aborted (abort count "
              f"{aborted} -> {after}), KV usage back to {usage}")

    # ---- metrics, models, openapi --------------------------------------------------------------------
    m = s.metrics()
    names = {n for n, _ in m}
    for n in ("infer:num_requests_running", "infer:num_requests_waiting", "infer:kv_cache_usage_perc",
              "infer:prefix_cache_hit_rate", "infer:prefix_cache_queries_total", "infer:prompt_tokens_total",
              "infer:generation_tokens_total", "infer:time_to_first_token_seconds_bucket",
              "infer:inter_token_latency_seconds_bucket", "infer:e2e_request_latency_seconds_count",
              "infer:router_requests_total", "infer:http_requests_total"):
        check(n in names, f"/metrics has {n}")
    check(s.metric("infer:generation_tokens_total") > 300 and s.metric("infer:prompt_tokens_total") > 100,
          "token counters count")
    check(s.metric("infer:time_to_first_token_seconds_count") >= 40, "TTFT histogram observed every request")
    check(s.metric("infer:prefix_cache_hit_rate") > 0, "repeated prompts hit the prefix cache")
    st, _, b = s.request("GET", "/v1/models", headers=AUTH)
    ms = json.loads(b)
    check(st == 200 and ms["object"] == "list" and [d["id"] for d in ms["data"]] == [NAME, "alias"]
          and ms["data"][0]["max_model_len"] == 2048, f"/v1/models: {ms!r}")
    st, _, b = s.request("GET", "/openapi.json")
    doc = json.loads(b)
    check(st == 200 and {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
                         "/detokenize"} <= set(doc["paths"]), "openapi.json describes every endpoint")

    # ---- SIGTERM drains: accepted work finishes, new requests get 503, exit 0 --------------------------
    # The engine loop is held, so the accepted request cannot finish before the 503s are checked however
    # fast the machine: it waits for its slot when SIGTERM arrives and must still be served in full.
    inflight = {}

    def long_request():
        inflight["r"] = s.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                                                     "stream": True}, AUTH, timeout=120)
    check(s.hold(), "engine loop held for the drain")
    t = threading.Thread(target=long_request)
    t.start()
    queued = s.wait_metric("infer:num_requests_waiting", lambda v: v == 1)
    check(queued == 1, f"the request is accepted and waits on the held engine ({queued})")
    s.proc.send_signal(signal.SIGTERM)
    st, h, b = s.wait_health(503, "shutting_down")
    check(st == 503 and error_shape_ok(b) and b["error"]["code"] == "shutting_down" and "retry-after" in h,
          f"/health is 503 shutting_down while draining: {st} {b}")
    st, h, b = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1}, AUTH)
    check_error(st, b, 503, "a new request while draining")
    check(st == 503 and error_shape_ok(b) and b["error"]["code"] == "shutting_down" and "retry-after" in h,
          f"503 shutting_down with Retry-After while draining: {b} {h}")
    check(t.is_alive() and s.proc.poll() is None, "the server waits for the accepted request")
    check(s.release(), "engine loop released during the drain")
    t.join(timeout=120)
    r = inflight.get("r")
    check(r is not None and r[0] == 200 and r[2] and sum(len(e["choices"]) and 1 for e in r[1]) == 40,
          f"the accepted stream finished all 40 tokens during the drain: {r and (r[0], len(r[1]), r[2])}")
    code = s.wait_exit(timeout=60)
    check(code == 0, f"exit status 0 after the drain (got {code}): {s.output()[-500:]}")

# ---- signals while loading, and a second one while draining ----------------------------------------------
# SIGTERM as soon as the socket is open, the model still loading (or, on a machine that loads it at once,
# already serving: then it drains): either way the server stops itself and exits 0, not killed by the signal.
with Server(bin_dir, model, wait_ready=False) as s:
    code = s.terminate(timeout=60)
    check(code == 0 and "infer-serve: stopped" in s.output(), f"SIGTERM while loading: exit 0 (got {code}): {s.output()[-500:]}")

# A second signal stops at once: the held engine keeps a request outstanding, and the drain timeout is far
# beyond the wait for the exit, so only the second signal can end the process in time.
with Server(bin_dir, model, "--enable-test-hooks", "--drain-timeout", "600") as s:
    check(s.hold(), "engine loop held")
    queued_request = {}
    t = threading.Thread(target=lambda: queued_request.setdefault("r", s.post(
        "/v1/completions", {"prompt": "x", "max_tokens": 1}, timeout=120)))
    t.start()
    check(s.wait_metric("infer:num_requests_waiting", lambda v: v == 1) == 1, "a request waits on the held engine")
    s.proc.send_signal(signal.SIGTERM)
    st, _, b = s.wait_health(503, "shutting_down")
    check(st == 503 and error_shape_ok(b) and b["error"]["code"] == "shutting_down", f"draining: {st} {b}")
    s.proc.send_signal(signal.SIGTERM)
    code = s.wait_exit(timeout=60)
    check(code == 0 and "aborting 1 requests" in s.output(),
          f"a second SIGTERM stops at once with exit 0 (got {code}): {s.output()[-500:]}")
    t.join(timeout=60)
    st, _, b = queued_request.get("r", (None, None, None))
    check(st == 503 and error_shape_ok(b) and b["error"]["code"] == "shutting_down",
          f"the request still waiting is refused 503 shutting_down: {st} {b}")

# ---- priority over HTTP ------------------------------------------------------------------------------------
# vLLM's `priority`: with one sequence running at a time, the request sent last with the lowest priority is
# admitted first once the held engine resumes, and the others follow in priority order.
with Server(bin_dir, model, "--enable-test-hooks", "--max-num-seqs", "1") as s:
    check(s.hold(), "engine loop held for the priority order")
    finished = []
    lock = threading.Lock()

    def ranked(priority):
        st, _, b = s.post("/v1/completions", {"prompt": f"Item {priority}:", "max_tokens": 3, "ignore_eos": True,
                                              "priority": priority, "tag": f"p{priority}"}, timeout=300)
        with lock:
            finished.append((priority, st))
    threads = []
    for i, priority in enumerate([5, 3, 9, -2]):
        threads.append(threading.Thread(target=ranked, args=(priority,)))
        threads[-1].start()
        s.wait_metric("infer:num_requests_waiting", lambda v, n=i + 1: v == n)  # they arrive in this order
    check(s.release(), "engine loop released")
    for t in threads:
        t.join(timeout=300)
    check(finished == [(-2, 200), (3, 200), (5, 200), (9, 200)],
          f"served in priority order, not arrival order (5, 3, 9, -2): {finished}")
    st, _, b = s.post("/v1/completions", {"prompt": "x", "priority": 2**31})
    check(st == 400 and b["error"]["param"] == "priority", f"a priority beyond 32 bits is refused: {st} {b}")
    check(s.terminate(timeout=60) == 0, "exit 0 after SIGTERM")

finish()
