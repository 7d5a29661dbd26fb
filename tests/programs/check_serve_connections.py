#!/usr/bin/env python3
"""infer-serve's connection handling under what real traffic brings, with the default model on loopback.
Every client here is a raw asyncio socket, so the test controls each byte and each hang-up:
  - a burst: 400 requests, 200 at once, each on a new connection with its headers and body in two writes
    (as cpp-httplib's client sends them): every one answered 200;
  - 1,000 concurrent streaming clients, all accepted and queued on the held engine at once (no thread pool
    bounds them), then every stream completes, within a bound;
  - 200 slow clients sending their headers at 1 byte/s: /health and a completion are answered in under
    1 s meanwhile, and every slow one is cut at the header deadline;
  - clients hanging up, streaming and not, while waiting for a slot, while prefilling and while decoding:
    num_requests_waiting, num_requests_running and KV usage are back to 0 within 1 s;
  - 100 rejected multi-megabyte bodies (a prompt far beyond the context, a body over the limit): resident
    memory grows by less than 20 MB;
  - a body shorter than its Content-Length is cut at the body deadline; a client that half-closes after a
    complete request gets the whole reply; beyond --max-connections a new connection gets 503 at once.

usage: check_serve_connections.py BIN_DIR MODEL [PART...]   (parts: burst streams slow hangups bodies edges; all
                                                           by default)"""
import asyncio
import json
import resource
import sys
import time

from harness import check, finish
from serve_harness import HOST, Server, error_shape_ok

bin_dir, model = sys.argv[1:3]
PARTS = sys.argv[3:] or ["burst", "streams", "slow", "hangups", "bodies", "edges"]

# 1,000 streams need 1,000 sockets here (and as many in the server).
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(_hard, 65536), _hard))


# ---- a minimal HTTP/1.1 client over asyncio streams ----------------------------------------------------

def request_bytes(method, path, body=b"", headers=None, close=True):
    h = {"Host": HOST, "Content-Type": "application/json", "Content-Length": str(len(body))}
    if close:
        h["Connection"] = "close"
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode(), body


async def read_response(reader):
    """(status, headers lower-cased, body) of one response; 1xx interim responses are skipped."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("the connection closed before a response")
        status = int(line.split()[1])
        headers = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, v = h.decode().split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if status >= 200:
            break
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return status, headers, body


def sse_events(body):
    """The data payloads of an event stream; [DONE] included as the string."""
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: "):
            payload = block[len(b"data: "):].decode()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def failure_cause(e):
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, ConnectionRefusedError):
        return "connect: refused"
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, (asyncio.IncompleteReadError, ConnectionError)):
        return f"closed: {e}"
    return repr(e)


async def exchange(port, method, path, body=b"", headers=None, two_writes=False, timeout=120):
    """One request on a new connection; (status, headers, body) or raises."""
    reader, writer = await asyncio.open_connection(HOST, port)  # asyncio sets TCP_NODELAY
    try:
        head, data = request_bytes(method, path, body, headers)
        if two_writes:  # two send()s, two segments: the body arrives after the headers, as httplib sends it
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(0.001)
            writer.write(data)
        else:
            writer.write(head + data)
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


def completion(prompt, max_tokens=1, stream=False, **extra):
    return json.dumps(dict({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                            "stream": stream}, **extra)).encode()


async def metric(s, name, **labels):
    return await asyncio.to_thread(s.metric, name, **labels)


async def wait_metrics(s, want, timeout):
    """Polls /metrics until every {name: value} in `want` holds; (seconds taken, last values)."""
    t0 = time.monotonic()
    while True:
        try:
            m = await asyncio.to_thread(s.metrics)
            got = {n: sum(v for (k, _), v in m.items() if k == n) for n in want}
        except OSError as e:  # a server that cannot answer /metrics in time
            got = {"/metrics": failure_cause(e)}
        if got == want or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, got
        await asyncio.sleep(0.01)


# ---- 1. a burst of new connections, headers and body in two writes -----------------------------------
async def burst(s, total=400, at_once=200):
    gate = asyncio.Semaphore(at_once)
    causes = {}

    async def one(i):
        async with gate:
            try:
                st, _, b = await exchange(s.port, "POST", "/v1/completions", completion(f"Burst {i}:"), two_writes=True)
                key = "200" if st == 200 and json.loads(b)["usage"]["completion_tokens"] == 1 else f"HTTP {st}"
            except Exception as e:  # noqa: BLE001 - counted by cause
                key = failure_cause(e)
            causes[key] = causes.get(key, 0) + 1
    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(total)))
    return causes, time.monotonic() - t0


def part_burst():
    with Server(bin_dir, model, "--max-waiting", "1024") as s:
        causes, took = asyncio.run(burst(s))
        print(f"burst: 400 requests, 200 at once, two writes each: {causes} in {took:.1f} s")
        check(causes == {"200": 400}, f"burst: all 400 answered 200, none lost ({causes})")
        check(s.metric("infer:http_requests_total", route="/v1/completions", status="200") == 400,
              "burst: 400 responses counted")


# ---- 2. a thousand concurrent streaming clients ---------------------------------------------------------
async def thousand_streams(s, n=1000):
    conns = []
    for i in range(n):  # opened one by one so the kernel's accept queue is not what is measured here
        conns.append(await asyncio.open_connection(HOST, s.port))
    for i, (_, w) in enumerate(conns):
        head, data = request_bytes("POST", "/v1/completions", completion(f"Stream {i % 10}", 2, True), close=False)
        w.write(head + data)
    await asyncio.gather(*(w.drain() for _, w in conns))
    queued_after, got = await wait_metrics(s, {"infer:num_requests_waiting": n}, 60)
    try:
        released = await asyncio.to_thread(s.release)
    except OSError as e:
        released = failure_cause(e)
    t0 = time.monotonic()

    async def finish_one(r, w):
        try:
            st, _, b = await asyncio.wait_for(read_response(r), 300)
            ev = sse_events(b)
            return "ok" if st == 200 and ev and ev[-1] == "[DONE]" and len(ev) == 3 else f"HTTP {st}: {b[:100]!r}"
        except Exception as e:  # noqa: BLE001 - counted by cause
            return failure_cause(e)
        finally:
            w.close()
    results = await asyncio.gather(*(finish_one(r, w) for r, w in conns))
    return got.get("infer:num_requests_waiting", got), queued_after, released, results, time.monotonic() - t0


def part_streams():
    with Server(bin_dir, model, "--max-waiting", "2048", "--enable-test-hooks") as s:
        check(s.hold(), "engine held while the streams arrive")
        waiting, queued_after, released, results, took = asyncio.run(thousand_streams(s))
        outcome = {r: results.count(r) for r in set(results)}
        print(f"1000 streams: {waiting} queued together ({queued_after:.1f} s), then {outcome} in {took:.1f} s")
        check(waiting == 1000, f"1000 streaming requests read and queued at once on the held engine ({waiting})")
        check(released is True, f"engine released ({released})")
        check(outcome == {"ok": 1000}, f"every one of 1000 streams completes with [DONE] ({outcome})")
        check(took < 120, f"the 1000 streams finish within 120 s of the release ({took:.1f} s)")
        usage = s.wait_metric("infer:kv_cache_usage_perc", lambda v: v == 0)
        check(usage == 0, f"KV empty after the 1000 streams ({usage})")


# ---- 3. slow clients: headers at 1 byte/s -----------------------------------------------------------------
async def slow_clients(s, n=200):
    head, _ = request_bytes("POST", "/v1/completions", b"x" * 10)
    cut = [None] * n

    async def drip(i):
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection(HOST, s.port)
        try:
            for k in range(len(head)):
                if time.monotonic() - t0 > 15:
                    cut[i] = (time.monotonic() - t0, "not cut after 15 s")
                    return
                writer.write(head[k:k + 1])
                await writer.drain()
                try:  # one second per byte, ending early when the server answers or closes
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                    cut[i] = (time.monotonic() - t0, data[:12].decode(errors="replace") or "closed")
                    return
                except asyncio.TimeoutError:
                    pass
            cut[i] = (time.monotonic() - t0, "sent whole headers")
        except (ConnectionError, OSError) as e:
            cut[i] = (time.monotonic() - t0, failure_cause(e))
        finally:
            writer.close()
    drips = [asyncio.create_task(drip(i)) for i in range(n)]
    await asyncio.sleep(2)  # all connected, each a few bytes in
    timings = []
    for _ in range(3):
        async def timed(*args):
            t0 = time.monotonic()
            try:
                st, _, _ = await exchange(s.port, *args, timeout=10)
            except Exception as e:  # noqa: BLE001
                st = failure_cause(e)
            return st, time.monotonic() - t0
        timings.append((*await timed("GET", "/health"), *await timed("POST", "/v1/completions", completion("Hello"))))
        await asyncio.sleep(0.5)
    await asyncio.gather(*drips)
    return timings, cut


def part_slow():
    with Server(bin_dir, model) as s:
        timings, cut = asyncio.run(slow_clients(s))
        print("slow clients: health/completion while 200 drip headers:",
              ", ".join(f"{a} in {b * 1e3:.0f} ms / {c} in {d * 1e3:.0f} ms" for a, b, c, d in timings))
        check(all(a == 200 and b < 1 and c == 200 and d < 1 for a, b, c, d in timings),
              f"with 200 slow clients, /health and a completion answer 200 in under 1 s: {timings}")
        when = sorted(t for t, _ in cut)
        how = {w: sum(1 for _, x in cut if x == w) for _, w in cut}
        print(f"slow clients cut after {when[0]:.1f}-{when[-1]:.1f} s: {how}")
        check(all(w.startswith("HTTP/1.1 408") for _, w in cut), f"every slow client is answered 408 and cut: {how}")
        check(when[-1] < 5 + 2.5, f"cut by the 5 s header deadline (the last after {when[-1]:.1f} s)")
        check(s.metric("infer:http_requests_total", status="408") == 200, "the 408s are counted")


# ---- 4. clients hanging up while waiting, prefilling, decoding ------------------------------------------
LONG = 4000  # tokens a blocker would generate: far more than the test lasts


async def open_request(port, body):
    reader, writer = await asyncio.open_connection(HOST, port)
    head, data = request_bytes("POST", "/v1/completions", body, close=False)
    writer.write(head + data)
    await writer.drain()
    return reader, writer


async def hang_ups(s):
    out = []
    zero = {"infer:num_requests_waiting": 0, "infer:num_requests_running": 0, "infer:kv_cache_used_blocks": 0}

    # decoding: the request has produced tokens
    for stream in (True, False):
        gen0 = await metric(s, "infer:generation_tokens_total")
        r, w = await open_request(s.port, completion("Tell me a story", LONG, stream))
        if stream:
            got = b""
            while b"data: " not in got:
                got += await asyncio.wait_for(r.read(4096), 60)
        else:
            t0 = time.monotonic()
            while await metric(s, "infer:generation_tokens_total") < gen0 + 2 and time.monotonic() - t0 < 60:
                await asyncio.sleep(0.01)
        running = await metric(s, "infer:num_requests_running")
        w.close()
        took, got = await wait_metrics(s, zero, 10)
        out.append((f"decoding, {'streaming' if stream else 'non-streaming'}", running == 1, took, got))

    # prefilling: a 3000-token prompt in chunks of 16 tokens a step, no token generated yet
    for stream in (True, False):
        gen0 = await metric(s, "infer:generation_tokens_total")
        # a prompt of its own each time: the prefix cache must not have computed any of it already
        r, w = await open_request(s.port, completion([1 + (i + 500 * stream) % 1000 for i in range(3000)], LONG, stream))
        t0 = time.monotonic()
        while await metric(s, "infer:num_requests_running") < 1 and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.005)
        prefilling = await metric(s, "infer:generation_tokens_total") == gen0
        w.close()
        took, got = await wait_metrics(s, zero, 10)
        prefilling = prefilling and await metric(s, "infer:generation_tokens_total") == gen0
        out.append((f"prefilling, {'streaming' if stream else 'non-streaming'}", prefilling, took, got))

    # waiting: both slots taken by decoding requests, 3 streaming and 3 non-streaming clients queue behind
    blockers = [await open_request(s.port, completion("Once upon a time", LONG, True)) for _ in range(2)]
    for r, _ in blockers:
        got = b""
        while b"data: " not in got:
            got += await asyncio.wait_for(r.read(4096), 60)
    waiters = [await open_request(s.port, completion(f"Waiter {i}", 8, i % 2 == 0)) for i in range(6)]
    queued, got = await wait_metrics(s, {"infer:num_requests_waiting": 6, "infer:num_requests_running": 2}, 30)
    ok = got == {"infer:num_requests_waiting": 6, "infer:num_requests_running": 2}
    for _, w in waiters:
        w.close()
    took, got = await wait_metrics(s, {"infer:num_requests_waiting": 0, "infer:num_requests_running": 2}, 10)
    out.append(("waiting, 3 streaming + 3 non-streaming", ok, took, got))
    for _, w in blockers:
        w.close()
    took, got = await wait_metrics(s, zero, 10)
    out.append(("the 2 decoding blockers", True, took, got))
    return out


def part_hangups():
    with Server(bin_dir, model, "--max-num-seqs", "2", "--max-num-batched-tokens", "16", "--max-model-len", "8192") as s:
        for stage, state_ok, took, got in asyncio.run(hang_ups(s)):
            print(f"hang-up while {stage}: back to {got} in {took * 1e3:.0f} ms")
            check(state_ok, f"hang-up while {stage}: the request was in that stage when its client left")
            check(took < 1 and all(v == 0 for k, v in got.items() if k != "infer:num_requests_running")
                  and got.get("infer:num_requests_running") in (0, 2),
                  f"hang-up while {stage}: waiting, running and KV blocks back within 1 s ({took:.2f} s, {got})")


# ---- 5. rejected multi-megabyte bodies: bounded memory -----------------------------------------------
async def big_bodies(s, n=100, at_once=8):
    gate = asyncio.Semaphore(at_once)
    words = ("lorem ipsum dolor sit amet " * 120000).encode()  # 3.2 MB of prompt
    too_long = b'{"prompt": "' + words + b'", "max_tokens": 1}'
    too_big = b'{"prompt": "' + words + words[:2 * 1024 * 1024] + b'", "max_tokens": 1}'  # 5.3 MB > 4 MiB
    statuses = {}

    async def one(i):
        async with gate:
            try:
                st, _, b = await exchange(s.port, "POST", "/v1/completions", too_long if i % 2 else too_big)
                key = st if error_shape_ok(json.loads(b)) else f"{st} without an OpenAI body"
            except Exception as e:  # noqa: BLE001 - counted by cause
                key = failure_cause(e)
            statuses[key] = statuses.get(key, 0) + 1
    await asyncio.gather(*(one(i) for i in range(n)))
    return statuses


def part_bodies():
    with Server(bin_dir, model) as s:
        for _ in range(4):
            s.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        rss0 = s.rss_kib()
        t0 = time.monotonic()
        statuses = asyncio.run(big_bodies(s))
        took = time.monotonic() - t0
        rss1 = s.rss_kib()
        print(f"100 rejected bodies of 3.2-5.3 MB: {statuses} in {took:.1f} s, RSS {rss0} -> {rss1} KiB "
              f"(+{(rss1 - rss0) / 1024:.1f} MB)")
        check(statuses == {400: 50, 413: 50}, f"the too-long prompts get 400, the oversized bodies 413: {statuses}")
        check(rss1 - rss0 < 20 * 1024, f"resident memory grew by less than 20 MB ({(rss1 - rss0) / 1024:.1f} MB)")
        check(s.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})[0] == 200, "serving after the big bodies")


# ---- 6. short bodies, half-closes, the connection cap -------------------------------------------------
async def edges(s, cap):
    out = {}
    # A Content-Length beyond the body: cut at the body deadline; others are served meanwhile.
    reader, writer = await asyncio.open_connection(HOST, s.port)
    head, _ = request_bytes("POST", "/v1/completions", b"x" * 1000)
    writer.write(head + b'{"prompt": "hi"')
    await writer.drain()
    t0 = time.monotonic()
    st, _, _ = await exchange(s.port, "GET", "/health", timeout=10)
    out["health while a body is short"] = (st, time.monotonic() - t0)
    try:
        st, _, b = await asyncio.wait_for(read_response(reader), 30)
        out["short body"] = (st, time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001
        out["short body"] = (failure_cause(e), time.monotonic() - t0)
    writer.close()

    # A client that sends a whole request and half-closes (shutdown(SHUT_WR)) still gets its reply.
    for stream in (False, True):
        reader, writer = await asyncio.open_connection(HOST, s.port)
        head, data = request_bytes("POST", "/v1/completions", completion("The sea is", 4, stream))
        writer.write(head + data)
        await writer.drain()
        writer.write_eof()
        try:
            st, _, b = await asyncio.wait_for(read_response(reader), 60)
            good = (sse_events(b)[-1] == "[DONE]") if stream else json.loads(b)["usage"]["completion_tokens"] == 4
            out[f"half-close, {'streaming' if stream else 'whole'}"] = (st, good)
        except Exception as e:  # noqa: BLE001
            out[f"half-close, {'streaming' if stream else 'whole'}"] = (failure_cause(e), False)
        writer.close()

    # The connection cap: `cap` idle connections open, the next is refused 503 at once, and once some
    # close new ones are served.
    idle = [await asyncio.open_connection(HOST, s.port) for _ in range(cap)]
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    try:
        st, h, b = await exchange(s.port, "GET", "/health", timeout=10)
        out["beyond the cap"] = (st, h.get("retry-after"), json.loads(b)["error"].get("code") if st != 200 else None,
                                 time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001
        out["beyond the cap"] = (failure_cause(e), None, None, time.monotonic() - t0)
    for _, w in idle:
        w.close()
    await asyncio.sleep(0.2)
    st, _, _ = await exchange(s.port, "GET", "/health", timeout=10)
    out["after the idle ones left"] = st
    return out


def part_edges():
    with Server(bin_dir, model, "--body-timeout", "2", "--max-connections", "64") as s:
        out = asyncio.run(edges(s, 64))
        print("edges:", out)
        st, took = out["health while a body is short"]
        check(st == 200 and took < 1, f"a short body holds no one up: /health {st} in {took:.2f} s")
        st, took = out["short body"]
        check(st == 408 and 1.5 < took < 4, f"a body shorter than its Content-Length is cut at the 2 s deadline: {st} "
              f"after {took:.1f} s")
        for what in ("half-close, whole", "half-close, streaming"):
            check(out[what] == (200, True), f"{what}: the client that half-closed gets the whole reply: {out[what]}")
        st, retry, code, took = out["beyond the cap"]
        check(st == 503 and retry == "1" and code == "too_many_connections" and took < 1,
              f"beyond --max-connections a new connection gets 503 at once: {out['beyond the cap']}")
        check(out["after the idle ones left"] == 200, "served again below the cap")
        check(s.metric("infer:http_requests_total", status="503") >= 1, "the cap's 503 is counted")


for part in PARTS:
    globals()["part_" + part]()
finish()
