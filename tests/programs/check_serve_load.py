#!/usr/bin/env python3
"""infer-serve under load, with the default model on loopback:
  - a bounded burst beyond capacity: every request is answered 200 or refused 503 with Retry-After and an
    OpenAI error body, none lost or hung, and the KV cache is empty afterwards;
  - a stalled engine (its loop held by the test hook past --stall-timeout while work waits) makes /health
    503 engine_stalled, and the server recovers when it is released;
  - a soak of a few thousand short requests, some cancelled by their clients: resident memory and KV
    usage end where they started.

usage: check_serve_load.py BIN_DIR MODEL"""
import http.client
import json
import random
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness import check, finish
from serve_harness import HOST, Server, error_shape_ok

bin_dir, model = sys.argv[1:3]

# ---- a burst beyond capacity: 2 running, 4 waiting, 48 arrive at once ------------------------------------
with Server(bin_dir, model, "--max-num-seqs", "2", "--max-waiting", "4") as s:
    outcomes = [None] * 48

    def one(i):
        try:
            if i % 2:
                st, h, b = s.post("/v1/completions", {"prompt": f"Request {i}:", "max_tokens": 12, "ignore_eos": True},
                                  timeout=120)
                outcomes[i] = (st, h.get("retry-after"), b)
            else:
                h = {}
                st, evs, done = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": f"Hi {i}"}],
                                                                  "max_tokens": 12, "ignore_eos": True, "stream": True},
                                         timeout=120, headers_out=h)
                outcomes[i] = (st, h.get("retry-after"), evs[0] if st != 200 else {"done": done, "n": len(evs)})
        except Exception as e:  # noqa: BLE001 - a lost or hung request is a failure below
            outcomes[i] = ("exception", None, repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(48)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    hung = sum(t.is_alive() for t in threads)
    ok = [o for o in outcomes if o and o[0] == 200]
    refused = [o for o in outcomes if o and o[0] == 503]
    check(hung == 0, f"no request hung ({hung} still open after {time.time() - t0:.0f} s)")
    check(len(ok) + len(refused) == 48, f"every request answered 200 or 503: {[o and o[0] for o in outcomes]}")
    check(len(ok) >= 6 and len(refused) >= 1, f"some served, some refused: {len(ok)} ok, {len(refused)} refused")
    # the non-streaming 200s are whole completions; the streaming ones ended with [DONE]
    check(all((o[2].get("done") and o[2]["n"] > 1) if "done" in o[2] else o[2]["usage"]["completion_tokens"] == 12
              for o in ok), "every 200 is a complete response")
    check(all(error_shape_ok(o[2]) and o[2]["error"]["code"] == "queue_full" for o in refused),
          f"503 bodies: {refused[:1]}")
    check(all(s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200 for _ in range(3)),
          "after the burst the server serves again")
    # /metrics is the engine thread's last published snapshot, and it publishes after it has handed a step's
    # finished responses to their clients: right after a response the gauges may still show that request
    # admitted and waiting (no KV yet). Wait for both, bounded, as the soak below does.
    usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0)
    waiting = s.wait_metric("infer:num_requests_waiting", lambda v: v == 0)
    check(usage == 0 and waiting == 0, f"KV usage {usage} and queue ({waiting} waiting) empty after the burst")
    check(s.metric("infer:requests_rejected_total", reason="queue_full") == len(refused),
          "every refusal counted in infer:requests_rejected_total")
    hdrs = [o[1] for o in refused]
    check(all(h == "1" for h in hdrs), f"every 503 (streaming or not) carries Retry-After: 1 ({hdrs[:5]})")

# ---- a stalled engine: work queued behind an engine loop that does not turn ----------------------------
# The test hook parks the loop as a forward pass that never returns would, whatever the machine's speed.
with Server(bin_dir, model, "--enable-test-hooks", "--stall-timeout", "0.3") as s:
    check(s.hold(), "the engine loop is held")
    # No turn for longer than the stall timeout is healthy while nothing waits on the engine.
    idle = s.wait_metric("infer:engine_seconds_since_progress", lambda v: v > 0.3)
    st, _, _ = s.request("GET", "/health")
    check(idle > 0.3 and st == 200, f"idle and held past the stall timeout ({idle:.2f} s) is healthy: {st}")
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", s.post(
        "/v1/completions", {"prompt": "Hello", "max_tokens": 1}, timeout=120)))
    t.start()
    st, h, body = s.wait_health(503, "engine_stalled")
    check(st == 503 and error_shape_ok(body) and body["error"]["code"] == "engine_stalled"
          and h.get("retry-after") == "1", f"/health is 503 engine_stalled with work queued on a held loop: {st} {body}")
    check(s.metric("infer:engine_healthy") == 0, "infer:engine_healthy is 0 while stalled")
    check(t.is_alive(), "the queued request waits while the loop is held")
    check(s.release(), "the engine loop is released")
    t.join(timeout=120)
    st, _, body = result.get("r", (None, None, None))
    check(st == 200 and body["usage"]["completion_tokens"] == 1, f"the queued request completes once released: {st}")
    st, _, _ = s.request("GET", "/health")
    check(st == 200, f"healthy again once the engine makes progress: {st}")

# ---- soak: a few thousand short requests, some cancelled -------------------------------------------------
N = 2000
with Server(bin_dir, model, "--max-waiting", "1024") as s:
    words = ["alpha", "beta", "gamma", "delta", "sea", "sky", "river", "stone", "light", "tree"]

    def prompt(rng):
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))

    def cancelled(rng):
        body = json.dumps({"prompt": prompt(rng), "max_tokens": 200, "ignore_eos": True,
                           "stream": rng.random() < 0.5}).encode()
        sock = socket.create_connection((HOST, s.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(rng.uniform(0, 0.2))
        sock.close()
        return "cancelled"

    def worker(seed, count, results):
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(HOST, s.port, timeout=120)
        for _ in range(count):
            if rng.random() < 0.05:
                results.append(cancelled(rng))
                continue
            path = "/v1/completions" if rng.random() < 0.7 else "/v1/chat/completions"
            body = {"prompt": prompt(rng)} if path == "/v1/completions" else \
                {"messages": [{"role": "user", "content": prompt(rng)}]}
            body.update({"max_tokens": 1 if rng.random() < 0.8 else 3, "temperature": rng.choice([0, 0.7])})
            try:
                conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                results.append(r.status if r.status != 200 or json.loads(data)["usage"] else "bad body")
            except (OSError, http.client.HTTPException) as e:
                results.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection(HOST, s.port, timeout=120)
        conn.close()

    def run(total, seed):
        lanes = 32
        results = []
        with ThreadPoolExecutor(lanes) as pool:
            for f in [pool.submit(worker, seed * 100 + i, total // lanes + (i < total % lanes), results)
                      for i in range(lanes)]:
                f.result(timeout=900)
        return results

    warm = run(192, 1)  # warm-up: allocator pools, caches and thread stacks reach their working size
    check(all(r in (200, "cancelled") for r in warm), f"warm-up all answered: {set(map(str, warm))}")
    s.wait_metric("infer:num_requests_running", lambda v: v == 0)
    rss0 = s.rss_kib()
    t0 = time.time()
    res = run(N, 2)
    elapsed = time.time() - t0
    check(len(res) == N and all(r in (200, "cancelled") for r in res),
          f"soak: {N} requests answered or cancelled ({ {str(r) for r in res} })")
    ncancel = res.count("cancelled")
    check(ncancel > 50, f"soak cancelled {ncancel} requests")
    usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0)
    running = s.wait_metric("infer:num_requests_running", lambda v: v == 0)
    waiting = s.wait_metric("infer:num_requests_waiting", lambda v: v == 0)
    check(usage == 0 and running == 0 and waiting == 0, f"soak: KV usage {usage}, running {running}, waiting {waiting} at the end")
    # Read at the same point as rss0: right after the engine is seen idle, with no pause to let anything
    # "settle" (nothing the engine owns is still in flight, and what the HTTP threads free is not given
    # back to the system anyway).
    rss1 = s.rss_kib()
    grew = rss1 - rss0
    check(grew < max(16 * 1024, rss0 // 20), f"soak: resident memory {rss0} KiB -> {rss1} KiB (+{grew} KiB)")
    aborted = s.metric("infer:request_success_total", finished_reason="abort")
    check(aborted >= 1, f"cancelled requests were aborted in the engine ({aborted})")
    print(f"soak: {N} requests in {elapsed:.1f} s ({N / elapsed:.0f} req/s), {ncancel} cancelled, "
          f"RSS {rss0} -> {rss1} KiB")
    check(s.terminate(timeout=60) == 0, "exit 0 after SIGTERM")

finish()
