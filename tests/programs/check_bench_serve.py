#!/usr/bin/env python3
"""infer-bench-serve's client against a server that closes connections it does not say it will close.

On the H200 (2026-12-05), llama.cpp's llama-server closed nearly every kept-alive connection after its
response without a `Connection: close` header: at 200 concurrent, 991 of 1,200 requests went out on a
connection the server had already closed. The client resends such a request once, but took the resend's
connection from its idle pool too, and when that one was stale as well the request failed (9 of 1,200):
failures of the client, charged to the server. Here a small asyncio server does the same thing on purpose
(HTTP/1.1 replies, no `Connection: close`, then it hangs up), so most kept-alive connections in the pool
are stale at any moment. Every request must complete, resent on a new connection when its reused one was
closed; the record counts the resends.

usage: check_bench_serve.py BIN_DIR"""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading

from harness import check, finish

bin_dir = sys.argv[1]
bench = os.path.join(bin_dir, "infer-bench-serve")
OUTPUT_LEN = 4


def sse_body():
    events = [{"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]} for i in range(OUTPUT_LEN)]
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 8, "completion_tokens": OUTPUT_LEN}})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next((int(h.split(":", 1)[1]) for h in lines if h.lower().startswith("content-length:")), 0)
        if length:
            await reader.readexactly(length)
        if lines[0].startswith("GET /v1/models"):
            body, kind = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}), "application/json"
        else:
            body, kind = sse_body(), "text/event-stream"
        data = body.encode()
        # HTTP/1.1 without "Connection: close": the client may keep this connection, which closes next.
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(port_box, ready):
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_box.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()
    asyncio.run(main())


if not os.path.exists(bench):
    print("infer-bench-serve is not built: nothing to check")
    sys.exit(77)
port_box, ready = [], threading.Event()
threading.Thread(target=serve, args=(port_box, ready), daemon=True).start()
ready.wait(10)
out = os.path.join(tempfile.mkdtemp(prefix="infer-bench-serve-"), "record.json")
n = 400
r = subprocess.run([bench, "--url", f"http://127.0.0.1:{port_box[0]}", "--num-prompts", str(n), "--max-concurrency", "32",
                    "--random-input-len", "8", "--random-output-len", str(OUTPUT_LEN), "--result-file", out],
                   capture_output=True, text=True, timeout=300)
rec = json.load(open(out)) if os.path.exists(out) else {}
check(r.returncode == 0, f"infer-bench-serve exits 0: {r.returncode} {r.stdout[-1500:]} {r.stderr[-500:]}")
check(rec.get("completed") == n and rec.get("failed") == 0,
      f"every request completes against a server that hangs up after each reply: {rec.get('completed')} completed, "
      f"{rec.get('failed')} failed, errors {rec.get('errors')}")
check(rec.get("total_output_tokens") == n * OUTPUT_LEN, f"tokens counted: {rec.get('total_output_tokens')}")
# With every connection closed after one reply, a kept-alive connection is never good twice: each reuse is
# resent, and each request but the first per client slot opens a new connection for its resend.
resent = rec.get("retried_on_closed_connection", -1)
check(resent > 0 and rec.get("connections_opened", 0) >= n,
      f"stale connections were resent on new ones: {resent} resent, {rec.get('connections_opened')} opened")
print(f"{n} requests, {resent} resent after a stale kept-alive connection, {rec.get('connections_opened')} connections")
finish()
