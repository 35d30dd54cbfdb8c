"""Bounded load on loopback against tern serve --demo: 32 concurrent streaming clients per round, some hanging up
mid-stream. Every other request completes, the queue metrics add up, a client that leaves cancels its generation
quickly, a full queue answers 503 with Retry-After, and memory does not grow across rounds. Parallel requests
(--parallel) run in the same engine steps: each gets exactly the answer it gets alone, the first tokens of all of
them arrive before any of them ends, and a request admitted while others decode does not wait for them."""
import json
import re
import threading
import time

import pytest

from test_server_helpers import (RawStream, Server, dechunk, metrics, post_json, queue_balance, request, sse_events,
                                 wait_idle)

EOS_BAN = {"151645": -100, "151643": -100}  # the demo tokenizer's end ids: generation runs to max_tokens
CLIENTS = 32
ROUNDS = 3
TOKENS = 8


@pytest.fixture(scope="module")
def server(tern_bin):
    s = Server(tern_bin, "--max-queue", "64", "--ctx-size", "2048")  # request log lines on (the hang-ups' status)
    yield s
    s.stop()


def body(max_tokens, **kw):
    return {"messages": [{"role": "user", "content": "Count with me."}], "stream": True, "max_tokens": max_tokens,
            "logit_bias": EOS_BAN, "stream_options": {"include_usage": True}, **kw}


def one_client(port, hang_up: bool, results: list, i: int):
    try:
        s = RawStream(port, "/v1/chat/completions", body(TOKENS, seed=i))
        if hang_up:
            s.read_until(b"data: ")  # the first chunk, then leave
            s.close()
            results[i] = "left"
            return
        status, data = dechunk(s.read_all())
        s.close()
        events, done = sse_events(data)
        ok = (status == 200 and done and events[-1]["usage"]["completion_tokens"] == TOKENS
              and events[-2]["choices"][0]["finish_reason"] == "length")
        results[i] = "ok" if ok else f"bad: {status} {events[-2:]}"
    except Exception as e:  # reported by the test below
        results[i] = f"error: {e!r}"


def log_lines(server):
    return [json.loads(l) for l in server.log_text().splitlines() if l.startswith("{")]


def log_line(server, match, timeout_s=5):
    """The last request log line that `match`es (it is written just after the answer, so it may come late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [l for l in log_lines(server) if match(l)]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, "no such request log line"
        time.sleep(0.05)


def test_rounds_of_concurrent_streams(server):
    rss = []
    before = metrics(server.port)
    for r in range(ROUNDS):
        results = [None] * CLIENTS
        threads = [threading.Thread(target=one_client, args=(server.port, i % 4 == 3, results, i))
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a client is stuck"
        bad = [x for x in results if x not in ("ok", "left")]
        assert not bad, bad
        m = wait_idle(server.port)
        assert queue_balance(m) == 0, m
        assert m["tern_queue_rejected_total"] == 0
        rss.append(server.rss_kb())
    after = metrics(server.port)
    n = CLIENTS * ROUNDS
    assert after["tern_queue_accepted_total"] - before["tern_queue_accepted_total"] == n
    done = sum(after[k] - before.get(k, 0) for k in after if k.startswith("tern_queue_finished_total"))
    assert done == n
    completed = after['tern_queue_finished_total{outcome="completed"}'] - before['tern_queue_finished_total{outcome="completed"}']
    assert completed >= n * 3 // 4  # every client that stayed got its answer
    print("rss kB per round:", rss)
    assert rss[-1] - rss[0] < 24 * 1024, f"memory grew across rounds: {rss} kB"


def test_disconnect_cancels_generation(server):
    m0 = wait_idle(server.port)
    s = RawStream(server.port, "/v1/chat/completions", body(1500))
    head = s.read_events(3)  # two tokens arrived: the generation is under way
    request_id = re.search(rb'"id":"(chatcmpl-[^"]+)"', head).group(1).decode()
    t_close = time.monotonic()
    s.close()
    m = wait_idle(server.port, timeout_s=10)
    stopped_after = time.monotonic() - t_close
    cancelled = m['tern_queue_finished_total{outcome="cancelled"}'] - m0['tern_queue_finished_total{outcome="cancelled"}']
    generated = m["tern_completion_tokens_total"] - m0["tern_completion_tokens_total"]
    assert cancelled == 1, m
    assert 1 <= generated < 1500
    print(f"stopped {stopped_after * 1000:.0f} ms after the hang-up, {generated:.0f} tokens generated")
    assert stopped_after < 3
    # The log line keeps the 200 the stream already sent, and says that the client left.
    line = log_line(server, lambda l: l.get("id") == request_id)
    assert line["status"] == 200 and line["client_closed"] is True, line


def test_disconnect_cancels_non_streaming_generation(server):
    m0 = wait_idle(server.port)
    s = RawStream(server.port, "/v1/chat/completions", {**body(1500), "stream": False})
    deadline = time.monotonic() + 30
    while metrics(server.port)["tern_requests_running"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    s.close()
    m = wait_idle(server.port, timeout_s=10)
    assert m['tern_queue_finished_total{outcome="cancelled"}'] - m0['tern_queue_finished_total{outcome="cancelled"}'] == 1
    assert m["tern_completion_tokens_total"] - m0["tern_completion_tokens_total"] < 1500
    # Logged and counted as what it is: 499 (nginx's "client closed request"), not a 400.
    line = log_line(server, lambda l: l.get("status") == 499)
    assert line["client_closed"] is True and line["stream"] is False and "closed the connection" in line["error"], line
    assert not [l for l in log_lines(server) if l.get("status") == 400]
    key = 'tern_http_responses_total{route="/v1/chat/completions",status="499"}'
    assert metrics(server.port)[key] == 1


def test_full_queue_answers_503(tern_bin):
    s = Server(tern_bin, "--parallel", "1", "--max-queue", "1", "--ctx-size", "4096", "-q")
    try:
        running = RawStream(s.port, "/v1/chat/completions", body(3000))
        running.read_events(2)  # generating
        waiting = RawStream(s.port, "/v1/chat/completions", body(10))
        deadline = time.monotonic() + 30
        while metrics(s.port)["tern_queue_waiting"] < 1:  # queued behind it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, headers, data = request("POST", s.port, "/v1/chat/completions", body(10))
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert json.loads(data)["error"]["code"] == "queue_full"
        waiting.close()  # leaves the queue without running
        running.close()  # cancels the running generation
        m = wait_idle(s.port, timeout_s=10)
        assert m["tern_queue_rejected_total"] == 1
        assert m['tern_queue_finished_total{outcome="cancelled"}'] == 2
        assert queue_balance(m) == 0
        status, _, out = post_json(s.port, "/v1/chat/completions", {**body(3), "stream": False})
        assert status == 200 and out["usage"]["completion_tokens"] == 3
    finally:
        s.stop()


def test_api_key_and_forced_output_flag(tern_bin):
    s = Server(tern_bin, "--api-key", "sekret", "--cors-origin", "http://example.com", "-q")
    try:
        msg = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
        status, _, out = post_json(s.port, "/v1/chat/completions", msg)
        assert status == 401 and out["error"]["type"] == "authentication_error"
        status, _, out = post_json(s.port, "/v1/chat/completions", msg, {"Authorization": "Bearer wrong"})
        assert status == 401
        status, headers, out = post_json(s.port, "/v1/chat/completions", msg, {"Authorization": "Bearer sekret"})
        assert status == 200 and headers["access-control-allow-origin"] == "http://example.com"
        for auth in ({"Authorization": "bearer sekret"}, {"x-api-key": "sekret"}):  # the scheme in any case; Anthropic's
            assert post_json(s.port, "/v1/chat/completions", msg, auth)[0] == 200, auth
        status, _, out = post_json(s.port, "/v1/chat/completions", msg, {"Authorization": "Bearersekret"})
        assert status == 401 and "x-api-key" in out["error"]["message"]
        assert request("GET", s.port, "/health")[0] == 200  # open without the key
        status, _, out = post_json(s.port, "/v1/chat/completions", {**msg, "tern_debug_forced_output": "x"},
                                   {"Authorization": "Bearer sekret"})
        assert status == 400 and "--debug-allow-forced-output" in out["error"]["message"]
        status, headers, _ = request("OPTIONS", s.port, "/v1/chat/completions")
        assert status == 204 and "Authorization" in headers["access-control-allow-headers"]
        # SIGTERM during a long generation: the process exits cleanly and promptly (the stream ends with a final
        # event: test_server_hardening.py checks it).
        stream = RawStream(s.port, "/v1/chat/completions", body(3000), headers={"Authorization": "Bearer sekret"})
        stream.read_events(2)
        t0 = time.monotonic()
        s.proc.terminate()
        assert s.proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 10
        stream.close()
    finally:
        s.stop()



def stream_tokens(port, max_tokens, seed, content, out: dict, key):
    """Streams one greedy or seeded request; records its text and when its first and last chunks came."""
    s = RawStream(port, "/v1/chat/completions",
                  {**body(max_tokens, seed=seed), "messages": [{"role": "user", "content": content}],
                   **({"temperature": 0} if seed is None else {"temperature": 0.9})})
    status, data = dechunk(s.read_all())
    s.close()
    events, done = sse_events(data)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    out[key] = {"status": status, "done": done, "text": text, "usage": events[-1].get("usage")}


def test_parallel_requests_get_their_own_answers(tern_bin):
    s = Server(tern_bin, "--parallel", "4", "--ctx-size", "2048", "-q")
    try:
        prompts = [("Count with me.", None), ("Name a colour.", 11), ("Tell me a story.", None), ("Why?", 12)]
        alone = {}
        for i, (content, seed) in enumerate(prompts):  # one after another
            stream_tokens(s.port, 24 + 8 * i, seed, content, alone, i)
        m0 = metrics(s.port)
        together = {}
        threads = [threading.Thread(target=stream_tokens, args=(s.port, 24 + 8 * i, seed, content, together, i))
                   for i, (content, seed) in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a client is stuck"
        for i in range(len(prompts)):
            assert together[i]["status"] == 200 and together[i]["done"], together[i]
            assert together[i]["usage"]["completion_tokens"] == 24 + 8 * i
            assert together[i]["text"] == alone[i]["text"], f"request {i} answered differently among others"
        m = wait_idle(s.port)
        assert queue_balance(m) == 0, m
        # Steps carried several requests at once.
        shared = m['tern_engine_batch_size_count'] - m0['tern_engine_batch_size_count'] - (
            m['tern_engine_batch_size_bucket{le="1"}'] - m0['tern_engine_batch_size_bucket{le="1"}'])
        assert shared > 0, m
    finally:
        s.stop()


def test_request_admitted_while_another_decodes_starts_at_once(tern_bin):
    s = Server(tern_bin, "--parallel", "2", "--ctx-size", "4096", "-q")
    try:
        long_one = RawStream(s.port, "/v1/chat/completions", body(2000))
        long_one.read_events(2)  # decoding
        t0 = time.monotonic()
        status, _, out = post_json(s.port, "/v1/chat/completions", {**body(4), "stream": False})
        took = time.monotonic() - t0
        assert status == 200 and out["usage"]["completion_tokens"] == 4
        m = metrics(s.port)
        assert m["tern_requests_running"] == 1, "the long request still runs: the short one did not wait for it"
        print(f"short request beside a running one: {took:.3f} s")
        long_one.close()
        wait_idle(s.port, timeout_s=10)
    finally:
        s.stop()


def long_prompt_answer(port, content):
    """The greedy answer's tokens (their bytes, from the log-probabilities) and the usage of one streamed request."""
    st = RawStream(port, "/v1/chat/completions", {**body(12), "messages": [{"role": "user", "content": content}],
                                                   "temperature": 0, "logprobs": True})
    status, data = dechunk(st.read_all())
    st.close()
    events, done = sse_events(data)
    assert status == 200 and done, (status, events[-2:])
    tokens = [tuple(t["bytes"]) for e in events if e.get("choices") and e["choices"][0].get("logprobs")
              for t in e["choices"][0]["logprobs"]["content"]]
    return tokens, events[-1]["usage"]


def test_long_prompt_read_in_pieces_beside_a_stream_gets_its_answer_alone(tern_bin):
    """A prompt of ~1,500 tokens arrives while another request decodes: with --step-tokens 64 the demo runner's chunks
    run a share of their layers per step (tern_engine_prompt_pieces_total counts them), the running stream keeps
    getting tokens, and the long prompt's greedy tokens are the ones it gets alone (on a second server, so that no
    prefix-cache snapshot of the first run serves the second)."""
    content = "Repeat after me: " + " ".join(f"w{i}" for i in range(700))
    s = Server(tern_bin, "--parallel", "2", "--ctx-size", "4096", "-q")
    try:
        alone, _ = long_prompt_answer(s.port, content)
    finally:
        s.stop()
    s = Server(tern_bin, "--parallel", "2", "--ctx-size", "4096", "--step-tokens", "64", "-q")
    try:
        running = RawStream(s.port, "/v1/chat/completions", body(3000))
        running.read_events(2)  # decoding
        together, usage = long_prompt_answer(s.port, content)
        assert usage["prompt_tokens"] > 1000 and usage["completion_tokens"] == 12, usage
        assert len(alone) == 12 and together == alone, "the long prompt answered differently when read in pieces"
        m = metrics(s.port)
        assert m["tern_engine_prompt_pieces_total"] >= 3, m
        assert m["tern_requests_running"] == 1, "the running stream still decodes"
        running.read_events(2)  # and goes on
        running.close()
        wait_idle(s.port, timeout_s=10)
    finally:
        s.stop()
