#!/usr/bin/env python3
"""Time to first token through a running tern server (or any OpenAI-compatible one that serves /tokenize):
what a user of the chat API waits for a prompt of N tokens.

    scripts/ttft.py --url http://127.0.0.1:8080 --tokens 4096 --repeats 5 [--json]

Each repeat sends a different prompt of about N tokens (a fresh random text, so that no prefix cache can resume
it) as one user message, streaming with max_tokens 1 and thinking off, and times the request from its first byte
sent to the first streamed token (a chunk with content or reasoning, or the one that ends the answer). The prompt length comes from the server's
/tokenize and is checked against the usage the server reports. Prints one line per repeat and the median
(--json: one JSON object). Standard library only, so that it runs on any machine with python3.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse

WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be or has had "
         "not but one their they first new after two also other some time more its into only when who about over "
         "world year city state river music film team game water light house field market road house power story "
         "garden winter summer morning evening number letter question answer system model signal paper stone").split()


def post(conn, path, body, headers=None):
    h = {"Content-Type": "application/json", **(headers or {})}
    conn.request("POST", path, body=json.dumps(body), headers=h)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit(f"ttft: {path} answered {r.status}: {data[:300]!r}")
    return json.loads(data)


def prompt_of(conn, n_tokens, rng, headers):
    """A random text of n_tokens tokens as the server's /tokenize counts them: a list of random words, then the prefix
    of it whose count is closest to n_tokens (binary search on the number of words; the count grows with it)."""
    head = f"[{rng.getrandbits(64):016x}] "
    words = [rng.choice(WORDS) for _ in range(max(2, int(n_tokens * 1.6)))]

    def count(k):
        return len(post(conn, "/tokenize", {"content": head + " ".join(words[:k])}, headers)["tokens"])

    while count(len(words)) < n_tokens:
        words += [rng.choice(WORDS) for _ in range(len(words))]
    lo, hi = 1, len(words)  # the fewest words whose count reaches n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    k, got = lo, count(lo)
    if k > 1:
        below = count(k - 1)
        if abs(below - n_tokens) < abs(got - n_tokens):
            k, got = k - 1, below
    return head + " ".join(words[:k]), got


def sse_events(r):
    """The JSON objects of a streamed (server-sent events) response, each as soon as its event has arrived."""
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            line = event.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[len(b"data: "):])


def one_request(url, model, text, headers, timeout):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json", **headers})
    r = conn.getresponse()
    if r.status != 200:
        raise SystemExit(f"ttft: /v1/chat/completions answered {r.status}: {r.read()[:300]!r}")
    first, usage = None, None
    for j in sse_events(r):
        for c in j.get("choices") or []:
            d = c.get("delta") or {}
            # The first token's text, or (a token with no text of its own, e.g. the end id) the chunk that
            # ends the one-token answer: either way the first token has been sampled.
            if first is None and (d.get("content") or d.get("reasoning_content") or c.get("finish_reason")):
                first = time.perf_counter() - t0
        if j.get("usage"):
            usage = j["usage"]
    conn.close()
    if first is None:
        raise SystemExit("ttft: the stream ended without a token")
    return first, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt tokens (about)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests first")
    ap.add_argument("--model", default="", help="the model name to send (default: none, the server's)")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.tokens < 1 or a.repeats < 1 or a.warmup < 0:
        ap.error("--tokens and --repeats must be >= 1, --warmup >= 0")
    rng = random.Random(a.seed)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    u = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=a.timeout)
    runs = []
    for i in range(a.warmup + a.repeats):
        text, n = prompt_of(conn, a.tokens, rng, headers)
        ttft, usage = one_request(a.url, a.model, text, headers, a.timeout)
        if i < a.warmup:
            continue
        run = {"ttft_ms": ttft * 1e3, "content_tokens": n,
               "prompt_tokens": (usage or {}).get("prompt_tokens"),
               "cached_tokens": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}
        runs.append(run)
        if not a.json:
            print(f"run {len(runs)}: {run['prompt_tokens']} prompt tokens ({run['cached_tokens']} cached): "
                  f"TTFT {run['ttft_ms']:.1f} ms", file=sys.stderr)
    conn.close()
    med = statistics.median(r["ttft_ms"] for r in runs)
    prompt = statistics.median(r["prompt_tokens"] or r["content_tokens"] for r in runs)
    out = {"url": a.url, "tokens": a.tokens, "repeats": a.repeats, "median_ttft_ms": med,
           "median_prompt_tokens": prompt, "prefill_tok_s": prompt / (med / 1e3), "runs": runs}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"median TTFT {med:.1f} ms for {prompt:.0f} prompt tokens ({out['prefill_tok_s']:.0f} tok/s)")


if __name__ == "__main__":
    main()
