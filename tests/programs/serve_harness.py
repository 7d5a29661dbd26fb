"""What the infer-serve checks share: starting the server on a free loopback port (always stopped, every
wait bounded), plain HTTP calls and server-sent-event reads with the standard library, the /metrics
text parsed, and the server's resident memory."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"


class Server:
    """infer-serve on an ephemeral port (--port 0: the server prints the one it got).

    with Server(bin_dir, model, "--api-key", "k") as s: ...   # ready (health 200) inside the block
    """

    def __init__(self, bin_dir, model, *args, ready_timeout=180, wait_ready=True, launcher=(), env=None):
        """`model` None: the args name the model (--dummy). `launcher`: what runs the server (mpirun -n 2)."""
        self.exe = os.path.join(bin_dir, "infer-serve")
        self.args = [*launcher, self.exe, *(["--model", model] if model else []), "--host", HOST, "--port", "0", *args]
        self.env = env
        self.ready_timeout = ready_timeout
        self.wait_ready = wait_ready
        self.proc = None
        self.port = None
        self.log = tempfile.NamedTemporaryFile(prefix="infer-serve-", suffix=".log", delete=False)
        self.health_at_start = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + 30
        while self.port is None:
            if time.time() > deadline or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"infer-serve did not start listening: {self.output()[-2000:]}")
            m = re.search(r"listening on http://[^:]+:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.02)
        # The first health answer, taken at once: the model is still loading then.
        self.health_at_start = self.request("GET", "/health", timeout=10)
        if self.wait_ready:
            self.wait_healthy(self.ready_timeout)
        return self

    def __exit__(self, *exc):
        self.kill()
        return False

    def wait_healthy(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"infer-serve exited while loading: {self.output()[-2000:]}")
            try:
                if self.request("GET", "/health", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError("infer-serve did not become healthy in time")

    def output(self):
        with open(self.log.name, "r", encoding="utf-8", errors="replace") as f:
            return f.read()

    def terminate(self, timeout=60):
        """SIGTERM, then the exit status (killed and None when it does not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def wait_exit(self, timeout=60):
        """The exit status once the server exits by itself, no signal sent (after the SIGTERM a check sent
        already: a second one would stop it at once); killed and None when it does not exit in time."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    @property
    def url(self):
        return f"http://{HOST}:{self.port}"

    # ---- HTTP ----------------------------------------------------------------------------------------

    def request(self, method, path, body=None, headers=None, timeout=120, raw=None):
        """(status, headers dict lower-cased, body bytes). `body` is JSON-encoded unless `raw` bytes are given."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def post(self, path, body, headers=None, timeout=120):
        status, h, data = self.request("POST", path, body, headers, timeout)
        try:
            return status, h, json.loads(data)
        except ValueError:
            return status, h, data

    def stream(self, path, body, headers=None, timeout=120, headers_out=None):
        """(status, list of JSON events, saw [DONE]) of a streamed response; a refusal's error body is the
        one event. `headers_out`, a dict, receives the response headers (lower-cased)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
            r = conn.getresponse()
            if headers_out is not None:
                headers_out.update({k.lower(): v for k, v in r.getheaders()})
            if r.status != 200:
                return r.status, [json.loads(r.read())], False
            events, done = [], False
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                    break
                events.append(json.loads(payload))
            return r.status, events, done
        finally:
            conn.close()

    def wait_health(self, status, code=None, timeout=30):
        """Polls /health (bounded) until it answers `status` (and, for an error, `code`); returns the last
        (status, headers, body parsed as JSON)."""
        deadline = time.time() + timeout
        while True:
            st, h, b = self.request("GET", "/health", timeout=30)
            body = json.loads(b)
            if (st == status and (code is None or body["error"]["code"] == code)) or time.time() > deadline:
                return st, h, body
            time.sleep(0.02)

    # ---- test hooks (a server started with --enable-test-hooks) ---------------------------------------

    def hold(self):
        """Parks every engine loop: no admission, no step, no heartbeat, until release(). True once the
        server has answered that every loop is parked."""
        return self.request("POST", "/debug/hold", timeout=60)[0] == 200

    def release(self):
        return self.request("POST", "/debug/release", timeout=30)[0] == 200

    def metrics(self):
        status, _, data = self.request("GET", "/metrics", timeout=30)
        assert status == 200, status
        return parse_metrics(data.decode())

    def metric(self, name, **labels):
        """The sum of `name` over the samples whose labels include `labels`."""
        total = 0.0
        for (n, ls), v in self.metrics().items():
            if n == name and all(dict(ls).get(k) == val for k, val in labels.items()):
                total += v
        return total

    def wait_metric(self, name, pred, timeout=20, **labels):
        """Waits (bounded) until pred(value) holds; returns the last value."""
        deadline = time.time() + timeout
        v = self.metric(name, **labels)
        while not pred(v) and time.time() < deadline:
            time.sleep(0.05)
            v = self.metric(name, **labels)
        return v


def parse_metrics(text):
    """Prometheus text → {(name, frozenset(label items)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if not m:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def error_shape_ok(body):
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and set(body["error"]) == {"message", "type", "param", "code"}
            and isinstance(body["error"]["message"], str) and body["error"]["message"])
