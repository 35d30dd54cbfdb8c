"""Queued and prefill progress (issue 35) through `tern serve --demo`: a streamed request that sets llama.cpp's
`return_progress` gets, before its first token, chunks whose `prompt_progress` is llama.cpp's
{total, cache, processed, time_ms} (processed from the cached count up to the whole prompt, at each chunk the
scheduler reads) and, while it waits behind others, tern's queued form (queued: true, queued_ahead: the requests
before it, counting down). Every such chunk still has its one choice with an empty delta, so OpenAI's clients parse
it. Without the flag, or without streaming, nothing changes.

The server runs one sequence (--parallel 1), so that a second request waits; prompts are drawn from a fresh seed
each run (printed; TERN_TEST_SEED repeats it).
"""
import random

from test_server_helpers import RawStream, dechunk, demo_server_fixture, post_json, request, sse_events, wait_idle

WORDS = ("river stone lantern copper meadow signal harbor velvet orbit canyon pillar ember quartz willow "
         "compass thunder saffron glacier marble falcon").split()
EOS_BAN = {"151645": -100, "151643": -100}  # <|im_end|>, <|endoftext|>: a reply runs to max_tokens
NO_THINKING = {"enable_thinking": False}
READING_KEYS = {"total", "cache", "processed", "time_ms"}
QUEUED_KEYS = READING_KEYS | {"queued", "queued_ahead"}

server = demo_server_fixture("--ctx-size", "8192", "--parallel", "1", "-q")


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_body(messages, **extra):
    body = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 4,
            "temperature": 0, "logit_bias": EOS_BAN, "chat_template_kwargs": NO_THINKING}
    body.update(extra)
    return body


def stream(port, path, body):
    status, _, data = request("POST", port, path, body, timeout=300)
    assert status == 200, data
    events, done = sse_events(data)
    assert done
    return events


def has_output(event):
    for ch in event.get("choices") or []:
        d = ch.get("delta") or {}
        if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or ch.get("text"):
            return True
    return False


def progress_of(events, usage=None):
    """The stream's progress objects (queued ones, then reading ones), checked for shape and order against the
    answer's events and usage."""
    first_output = next(i for i, e in enumerate(events) if has_output(e))
    queued, reading = [], []
    for i, e in enumerate(events):
        p = e.get("prompt_progress")
        if p is None:
            continue
        assert i < first_output, "progress after the first token"
        assert e["object"] in ("chat.completion.chunk", "text_completion")
        assert len(e["choices"]) == 1 and e["choices"][0]["index"] == 0 and e["choices"][0]["finish_reason"] is None
        if e["object"] == "chat.completion.chunk":
            assert e["choices"][0]["delta"] == {}, e
        else:
            assert e["choices"][0]["text"] == "", e
        if p.get("queued"):
            assert not reading, "queued after the prompt's reading began"
            assert set(p) == QUEUED_KEYS, p
            assert p["processed"] == 0 and p["cache"] == 0 and p["time_ms"] == 0 and p["queued_ahead"] >= 0
            queued.append(p)
        else:
            assert set(p) == READING_KEYS, p
            reading.append(p)
    aheads = [p["queued_ahead"] for p in queued]
    assert all(a > b for a, b in zip(aheads, aheads[1:])), f"queued_ahead counts down: {aheads}"
    assert reading, "no progress while the prompt was read"
    total = reading[0]["total"]
    assert all(p["total"] == total for p in queued + reading)
    assert reading[0]["processed"] == reading[0]["cache"], "the first report is where the reading starts"
    assert all(p["cache"] == reading[0]["cache"] for p in reading)
    done = [p["processed"] for p in reading]
    assert all(a < b for a, b in zip(done, done[1:])), f"processed grows at each chunk: {done}"
    assert done[-1] == total, "the last report has the whole prompt"
    times = [p["time_ms"] for p in reading]
    assert all(a <= b for a, b in zip(times, times[1:])), times
    if usage is not None:
        assert total == usage["prompt_tokens"]
        assert reading[0]["cache"] == usage["prompt_tokens_details"]["cached_tokens"]
    return queued, reading


def usage_of(events):
    return next(e["usage"] for e in reversed(events) if e.get("usage"))


def test_long_prompt_reports_its_reading_chunk_by_chunk(server, seed):
    rng = random.Random(seed)
    messages = [{"role": "user", "content": text(rng, 4000)}]  # over two of the CPU runner's 2,048-token chunks
    events = stream(server.port, "/v1/chat/completions", chat_body(messages, return_progress=True))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = usage_of(events)
    queued, reading = progress_of(events, usage)
    assert not queued, "nothing ran before it"
    assert usage["prompt_tokens"] > 4096
    assert len(reading) >= 4, [p["processed"] for p in reading]  # the start, then at least three chunks
    assert reading[0]["processed"] == 0


def test_no_progress_without_the_flag_or_without_streaming(server, seed):
    rng = random.Random(seed)
    messages = [{"role": "user", "content": text(rng, 300)}]
    for extra in ({}, {"return_progress": False}, {"return_progress": None}):
        events = stream(server.port, "/v1/chat/completions", chat_body(messages, **extra))
        assert not any("prompt_progress" in e for e in events), extra
        assert all(e["choices"] or e.get("usage") for e in events)
    status, _, body = post_json(server.port, "/v1/chat/completions",
                                dict(chat_body(messages, return_progress=True), stream=False))
    assert status == 200 and body["object"] == "chat.completion" and "prompt_progress" not in body


def test_cached_prefix_is_counted(server, seed):
    rng = random.Random(seed)
    messages = [{"role": "system", "content": text(rng, 400)}, {"role": "user", "content": text(rng, 10)}]
    first = stream(server.port, "/v1/chat/completions", chat_body(messages, return_progress=True))
    _, reading1 = progress_of(first, usage_of(first))
    assert reading1[0]["cache"] == 0
    # The same conversation again: it resumes from the snapshot where the generation prompt begins.
    again = stream(server.port, "/v1/chat/completions", chat_body(messages, return_progress=True))
    usage = usage_of(again)
    _, reading2 = progress_of(again, usage)
    assert 0 < reading2[0]["cache"] < reading2[0]["total"], reading2
    assert reading2[0]["processed"] == reading2[0]["cache"]


def test_waiting_requests_learn_their_place(server, seed):
    rng = random.Random(seed)
    wait_idle(server.port)
    # One long answer holds the only sequence...
    hog = RawStream(server.port, "/v1/chat/completions",
                    chat_body([{"role": "user", "content": "go on"}], max_tokens=7000),
                    timeout=300)
    a = b = None
    try:
        hog.read_events(2)  # its role chunk and a first token: it runs
        # ...so a waits first in the queue, then b behind it.
        a = RawStream(server.port, "/v1/chat/completions",
                      chat_body([{"role": "user", "content": text(rng, 50)}], return_progress=True), timeout=300)
        a.read_until(b'"queued":true')
        b = RawStream(server.port, "/v1/chat/completions",
                      chat_body([{"role": "user", "content": text(rng, 60)}], return_progress=True), timeout=300)
        b.read_until(b'"queued_ahead":1')
    finally:
        hog.close()  # the client leaves: its generation is cancelled and the sequence is free
    answers = []
    for s in (a, b):
        status, body = dechunk(s.read_all())
        s.close()
        assert status == 200
        events, done = sse_events(body)
        assert done
        answers.append(events)
    queued_a, _ = progress_of(answers[0], usage_of(answers[0]))
    queued_b, _ = progress_of(answers[1], usage_of(answers[1]))
    assert [p["queued_ahead"] for p in queued_a] == [0]
    assert [p["queued_ahead"] for p in queued_b] == [1, 0]
    wait_idle(server.port)


def test_completions_report_progress_too(server, seed):
    rng = random.Random(seed)
    body = {"prompt": text(rng, 200), "stream": True, "max_tokens": 3, "return_progress": True, "logit_bias": EOS_BAN,
            "stream_options": {"include_usage": True}}
    events = stream(server.port, "/v1/completions", body)
    _, reading = progress_of(events, usage_of(events))
    assert reading[-1]["processed"] == reading[-1]["total"]


def test_bad_return_progress_is_a_400_naming_it(server):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        status, _, err = post_json(server.port, path, dict(body, stream=True, return_progress="yes"))
        assert status == 400, err
        assert err["error"]["param"] == "return_progress"
        assert err["error"]["message"] == "'return_progress' must be a boolean, got a string."
