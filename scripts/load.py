#!/usr/bin/env python3
"""Load through a running tern server (or any OpenAI-compatible one that serves /tokenize): streaming clients at
once, what each of them waits for and how evenly its tokens arrive.

    scripts/load.py --url http://127.0.0.1:8080 together --clients 4 --prompt-tokens 256 --max-tokens 128
    scripts/load.py --url http://127.0.0.1:8080 admit --clients 7 --long-tokens 32768 [--json]

`together`: N clients send a fresh prompt each at the same moment (streamed chat, thinking off, greedy) and read
their answers; printed per client: time to first token, tokens, tok/s; then the aggregate tok/s and the
inter-token gaps (p50, p99, max) over every client.

`admit`: N clients start decoding long answers; once every one of them streams, one more client sends a long prompt
(--long-tokens) with max_tokens 1. Printed: the long prompt's time to first token, and the running clients' gaps
between tokens while it was read (from its send to its first token): p50, p99, max — what a scheduler that chunks
long prompts between decode steps keeps small.

Prompts are random word lists sized with the server's /tokenize (scripts/ttft.py), fresh for every request so that
no prefix cache resumes them. Standard library only.
"""
import argparse
import http.client
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402  (prompt_of: a random text of about n tokens)


def pct(values, q):
    """The q-th percentile (0..100) of values by the nearest rank; None when there are none."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v), max(1, math.ceil(q / 100.0 * len(v)))) - 1]


class Stream:
    """One streamed chat request on its own thread: the send time, every token's arrival, the end."""

    def __init__(self, url, model, text, max_tokens, headers, timeout):
        self.url, self.model, self.text, self.max_tokens = url, model, text, max_tokens
        self.headers, self.timeout = headers, timeout
        self.sent = None
        self.arrivals = []  # perf_counter() of each chunk that carried a token
        self.error = None
        self.usage = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def join(self):
        self.thread.join()

    def _run(self):
        try:
            u = urllib.parse.urlsplit(self.url)
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=self.timeout)
            body = {"messages": [{"role": "user", "content": self.text}], "max_tokens": self.max_tokens,
                    "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
                    "chat_template_kwargs": {"enable_thinking": False}}
            if self.model:
                body["model"] = self.model
            self.sent = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json", **self.headers})
            r = conn.getresponse()
            if r.status != 200:
                self.error = f"answered {r.status}: {r.read()[:300]!r}"
                return
            for j in ttft.sse_events(r):
                now = time.perf_counter()
                for c in j.get("choices") or []:
                    d = c.get("delta") or {}
                    if d.get("content") or d.get("reasoning_content"):
                        self.arrivals.append(now)
                if j.get("usage"):
                    self.usage = j["usage"]
            conn.close()
        except Exception as e:  # reported by the caller, with the others' figures
            self.error = f"{type(e).__name__}: {e}"

    def ttft(self):
        return self.arrivals[0] - self.sent if self.arrivals else None

    def gaps(self, start=None, end=None):
        """Gaps between consecutive tokens whose later token arrived in [start, end]."""
        out = []
        for a, b in zip(self.arrivals, self.arrivals[1:]):
            if (start is None or b >= start) and (end is None or b <= end):
                out.append(b - a)
        return out


def ms(x):
    return None if x is None else round(x * 1e3, 2)


def prompts(url, n, tokens, rng, headers, timeout):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    out = [ttft.prompt_of(conn, tokens, rng, headers)[0] for _ in range(n)]
    conn.close()
    return out


def together(a, rng, headers):
    texts = prompts(a.url, a.clients, a.prompt_tokens, rng, headers, a.timeout)
    streams = [Stream(a.url, a.model, t, a.max_tokens, headers, a.timeout) for t in texts]
    t0 = time.perf_counter()
    for s in streams:
        s.start()
    for s in streams:
        s.join()
    wall = time.perf_counter() - t0
    clients = []
    for i, s in enumerate(streams):
        span = s.arrivals[-1] - s.arrivals[0] if len(s.arrivals) > 1 else None
        clients.append({"client": i, "error": s.error, "ttft_ms": ms(s.ttft()), "tokens": len(s.arrivals),
                        "tok_s": round((len(s.arrivals) - 1) / span, 1) if span else None})
    gaps = [g for s in streams for g in s.gaps()]
    tokens = sum(len(s.arrivals) for s in streams)
    return {"scenario": "together", "clients": clients, "wall_s": round(wall, 3),
            "aggregate_tok_s": round(tokens / wall, 1) if wall > 0 else None,
            "max_ttft_ms": max((c["ttft_ms"] for c in clients if c["ttft_ms"] is not None), default=None),
            "gap_ms": {"p50": ms(pct(gaps, 50)), "p99": ms(pct(gaps, 99)), "max": ms(max(gaps, default=None))}}


def admit(a, rng, headers):
    texts = prompts(a.url, a.clients, a.prompt_tokens, rng, headers, a.timeout)
    long_text = prompts(a.url, 1, a.long_tokens, rng, headers, a.timeout)[0]
    streams = [Stream(a.url, a.model, t, a.max_tokens, headers, a.timeout) for t in texts]
    for s in streams:
        s.start()
    deadline = time.perf_counter() + a.timeout
    while any(len(s.arrivals) < 8 and s.error is None and s.thread.is_alive() for s in streams):
        if time.perf_counter() > deadline:
            raise SystemExit("load: the running clients did not start streaming")
        time.sleep(0.01)
    time.sleep(0.2)  # a steady decode before the long prompt arrives
    long = Stream(a.url, a.model, long_text, 1, headers, a.timeout)
    long.start()
    long.join()
    window_end = long.arrivals[0] if long.arrivals else time.perf_counter()
    running = [s for s in streams if s.thread.is_alive()]  # still decoding when the long prompt's answer began
    for s in streams:
        s.join()
    gaps = [g for s in streams for g in s.gaps(long.sent, window_end)]
    before = [g for s in streams for g in s.gaps(None, long.sent)]
    return {"scenario": "admit", "running_clients": a.clients, "still_running_after_it": len(running),
            "long_prompt_tokens": a.long_tokens, "long_error": long.error, "long_ttft_ms": ms(long.ttft()),
            "errors": [s.error for s in streams if s.error],
            "gaps_while_reading_ms": {"count": len(gaps), "p50": ms(pct(gaps, 50)), "p99": ms(pct(gaps, 99)),
                                      "max": ms(max(gaps, default=None))},
            "gaps_before_ms": {"p50": ms(pct(before, 50)), "p99": ms(pct(before, 99))}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="", help="the model name to send (default: none, the server's)")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    sub = ap.add_subparsers(dest="scenario", required=True)
    t = sub.add_parser("together", help="N clients at once")
    t.add_argument("--clients", type=int, default=4)
    t.add_argument("--prompt-tokens", type=int, default=256)
    t.add_argument("--max-tokens", type=int, default=128)
    d = sub.add_parser("admit", help="a long prompt admitted while N clients decode")
    d.add_argument("--clients", type=int, default=7)
    d.add_argument("--prompt-tokens", type=int, default=64)
    d.add_argument("--max-tokens", type=int, default=2048, help="the running clients' answers (long enough to span "
                   "the long prompt's reading)")
    d.add_argument("--long-tokens", type=int, default=32768)
    a = ap.parse_args()
    if a.clients < 1 or a.prompt_tokens < 1 or a.max_tokens < 1 or getattr(a, "long_tokens", 1) < 1:
        ap.error("counts must be >= 1")
    rng = random.Random(a.seed)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    out = together(a, rng, headers) if a.scenario == "together" else admit(a, rng, headers)
    out["url"] = a.url
    if a.json:
        print(json.dumps(out))
        return
    if out["scenario"] == "together":
        for c in out["clients"]:
            print(f"client {c['client']}: TTFT {c['ttft_ms']} ms, {c['tokens']} tokens, {c['tok_s']} tok/s"
                  + (f", error {c['error']}" if c["error"] else ""))
        print(f"aggregate {out['aggregate_tok_s']} tok/s; max TTFT {out['max_ttft_ms']} ms; gaps p50 "
              f"{out['gap_ms']['p50']} / p99 {out['gap_ms']['p99']} / max {out['gap_ms']['max']} ms")
    else:
        g = out["gaps_while_reading_ms"]
        print(f"long prompt ({out['long_prompt_tokens']} tokens) TTFT {out['long_ttft_ms']} ms"
              + (f", error {out['long_error']}" if out["long_error"] else ""))
        print(f"{out['still_running_after_it']} of {out['running_clients']} clients still decoding after it; their "
              f"gaps while it was read: {g['count']} gaps, p50 {g['p50']} / p99 {g['p99']} / max {g['max']} ms (before: p50 "
              f"{out['gaps_before_ms']['p50']} / p99 {out['gaps_before_ms']['p99']} ms)")
        if out["errors"]:
            print("errors: " + "; ".join(out["errors"]))


if __name__ == "__main__":
    main()
