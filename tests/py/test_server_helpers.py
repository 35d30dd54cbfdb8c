"""Helpers for the server tests: start `tern serve --demo` on a free loopback port, raw HTTP, metrics parsing.

Not a test module itself (it defines no tests); the test_server*.py files import it.
"""
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time

import pytest

HOST = "127.0.0.1"
START_TIMEOUT_S = 180  # the demo model builds in well under a second; CI machines are slow and shared


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """A running `tern serve` process; stop() ends it (SIGTERM, then SIGKILL after a bound)."""

    def __init__(self, tern_bin: str, *args: str, demo: bool = True):
        """demo=False: no --demo (args then name the model with -m DIR)."""
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="tern-serve-", suffix=".log", delete=False)
        cmd = [tern_bin, "serve", *(["--demo"] if demo else []), "--host", HOST, "--port", str(self.port), *args]
        env = dict(os.environ)
        env.setdefault("TERN_THREADS", "2")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.base = f"http://{HOST}:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tern serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                status, _, _ = request("GET", self.port, "/health", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tern serve not ready after {START_TIMEOUT_S}s:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def demo_server_fixture(*args: str):
    """A module-scoped fixture: one `tern serve --demo *args` for the tests of a file, stopped after them. Assign it
    to the fixture's name: `server = demo_server_fixture("--ctx-size", "512")`."""

    @pytest.fixture(scope="module")
    def demo_server(tern_bin):
        s = Server(tern_bin, *args)
        yield s
        s.stop()

    return demo_server


def request(method, port, path, body=None, headers=None, timeout=60):
    """One HTTP request over a fresh connection: (status, headers dict (lower-case names), body bytes)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8", errors="surrogateescape")
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def post_json(port, path, body, headers=None, timeout=60):
    status, h, data = request("POST", port, path, body, headers, timeout)
    return status, h, json.loads(data) if data else None


def sse_events(data: bytes):
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    events, done = [], False
    for block in data.decode("utf-8").split("\n\n"):
        block = block.strip()
        if not block or block.startswith(":"):
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "event after [DONE]"
        events.append(json.loads(payload))
    return events, done


def named_sse_events(body: bytes):
    """[(event name, payload)] of a stream whose events carry `event: NAME` lines (Anthropic, OpenAI Responses);
    checks that each names its payload's type."""
    out = []
    for block in body.decode().split("\n\n"):
        lines = [ln for ln in block.strip().split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, payload = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert payload["type"] == name
        out.append((name, payload))
    return out


MUTATION_INSERTS = (b"[", b"{", b"\"", b"\\", b"\xc3", b"NaN", b"-", b"1e999", b"\x00")


def mutate_body(rng, text: bytes, inserts=MUTATION_INSERTS, max_repeat=50) -> bytes:
    """A random damage of a request body: truncated, a few bytes flipped, or a run of one of `inserts` put in."""
    b = bytearray(text)
    op = rng.randrange(3)
    if op == 0:
        b = b[: rng.randrange(len(b))]                     # truncated
    elif op == 1:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)  # flipped bytes
    else:
        pos = rng.randrange(len(b))
        b[pos:pos] = rng.choice(inserts) * rng.randrange(1, max_repeat)
    return bytes(b)


def metrics(port) -> dict:
    """The /metrics samples: {"name{labels}": value}."""
    status, _, data = request("GET", port, "/metrics")
    assert status == 200
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def queue_balance(m: dict) -> float:
    """accepted - (finished + waiting + running): 0 when the queue accounting adds up."""
    finished = sum(v for k, v in m.items() if k.startswith("tern_queue_finished_total"))
    return m["tern_queue_accepted_total"] - finished - m["tern_queue_waiting"] - m["tern_requests_running"]


def wait_idle(port, timeout_s=60):
    """Waits until no request runs or waits; returns the metrics then."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(port)
        if m["tern_queue_waiting"] == 0 and m["tern_requests_running"] == 0:
            return m
        assert time.monotonic() < deadline, f"server still busy after {timeout_s}s: {m}"
        time.sleep(0.05)


class RawStream:
    """A streaming POST over a raw socket, so that a test can read part of it and hang up."""

    def __init__(self, port, path, body, timeout=60, headers=None):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        data = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        self.sock.sendall(head + data)
        self.buf = b""

    def read_until(self, needle: bytes, limit=1 << 20) -> bytes:
        while needle not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buf += chunk
            assert len(self.buf) < limit
        return self.buf

    def read_events(self, n: int) -> bytes:
        """Reads until n SSE events have arrived (the first is the role chunk, sent before generation starts)."""
        while self.buf.count(b"data: ") < n:
            chunk = self.sock.recv(4096)
            assert chunk, "the stream ended early"
            self.buf += chunk
        return self.buf

    def read_all(self) -> bytes:
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return self.buf
            self.buf += chunk
            if self.buf.endswith(b"0\r\n\r\n"):
                return self.buf

    def close(self):
        self.sock.close()


def dechunk(raw: bytes) -> tuple:
    """Splits a raw HTTP/1.1 response into (status, body) and undoes chunked transfer coding."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" not in head.lower():
        return status, rest
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2:]
    return status, body
