"""tern serve --demo against the official openai client: chat (plain and streamed, usage in streams), stop strings,
seeds, logprobs, tools through forced tool-call output, enable_thinking, /v1/completions, /v1/models, and errors.

The demo model has random weights, so its own text is noise: tests that need a known output use the server's
test-only option --debug-allow-forced-output and the request field tern_debug_forced_output (docs/server.md).
Every request asks for a handful of tokens; the whole file takes well under a minute on two cores.
"""
import json
import random
import time

import openai
import pytest

from test_server_helpers import demo_server_fixture, metrics, post_json, queue_balance, request, wait_idle

MODEL = "tern-demo-random-weights"
EOS_BAN = {"151645": -100, "151643": -100}  # <|im_end|>, <|endoftext|> of the demo's Qwen3 tokenizer


server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "512", "--max-body-bytes", "65536")


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def chat(client, content="Hello", **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def forced(text, **extra):
    return {"extra_body": {"tern_debug_forced_output": text, **extra}}


def no_think(**extra):
    return {"chat_template_kwargs": {"enable_thinking": False}, **extra}


def stream_collect(stream):
    """Accumulates a chat stream: (reasoning, content, tool_calls by index, finish_reason, usage, chunks)."""
    reasoning, content, calls, finish, usage, chunks = "", "", {}, None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return reasoning, content, calls, finish, usage, chunks


def reasoning_of(message):
    return (message.model_extra or {}).get("reasoning_content")


def test_models_health_metrics(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert request("GET", server.port, "/health")[0] == 200
    assert json.loads(request("GET", server.port, "/health")[2]) == {"status": "ok"}
    m = metrics(server.port)
    for name in ("tern_queue_waiting", "tern_requests_running", "tern_prompt_tokens_total",
                 "tern_completion_tokens_total", "tern_decode_tokens_per_second", "tern_prefill_tokens_per_second",
                 "tern_time_to_first_token_seconds_sum"):
        assert name in m, name
    status, _, page = request("GET", server.port, "/")
    assert status == 200 and b"/v1/chat/completions" in page


def test_chat_non_streaming(client, seed):
    r = chat(client, max_tokens=6, seed=seed)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert c.message.role == "assistant"
    assert 1 <= r.usage.completion_tokens <= 6
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_with_usage_matches_non_streaming(client, seed):
    kw = dict(max_tokens=8, seed=seed, temperature=0.8)
    plain = chat(client, "Tell me a story", **kw)
    stream = chat(client, "Tell me a story", stream=True, stream_options={"include_usage": True}, **kw)
    reasoning, content, calls, finish, usage, chunks = stream_collect(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and usage is not None  # the usage chunk comes last, with no choices
    assert all(ch.usage is None for ch in chunks[:-1])
    assert usage.completion_tokens == plain.usage.completion_tokens
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert finish == plain.choices[0].finish_reason
    assert content == (plain.choices[0].message.content or "")
    assert reasoning == (reasoning_of(plain.choices[0].message) or "")


def test_stream_without_usage_has_no_usage_chunk(client):
    stream = chat(client, max_tokens=3, stream=True)
    chunks = list(stream)
    assert all(ch.usage is None for ch in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_seed_reproducibility(client, seed):
    kw = dict(max_tokens=8, temperature=1.0, top_p=1.0, extra_body={"top_k": 0}, logit_bias=EOS_BAN)
    a = chat(client, "Pick a number", seed=seed, **kw)
    b = chat(client, "Pick a number", seed=seed, **kw)
    assert a.usage.completion_tokens == b.usage.completion_tokens == 8
    assert a.choices[0].message == b.choices[0].message


def test_stop_strings_never_leak(client, seed):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    for _ in range(3):
        text = " ".join(rng.choice(words) for _ in range(12))
        stop_word = rng.choice(text.split()[3:])
        stop = stop_word[1:4]  # a piece that can span tokens
        r = chat(client, max_tokens=64, stop=[stop, "never-there"], **forced(text, **no_think()))
        content = r.choices[0].message.content
        assert stop not in content
        assert content.rstrip() == text[: text.index(stop)].rstrip(), (text, stop, content)
        assert r.choices[0].finish_reason == "stop"
        # Streamed, the held-back text is released the same way.
        s = chat(client, max_tokens=64, stop=stop, stream=True, **forced(text, **no_think()))
        assert stream_collect(s)[1].rstrip() == content.rstrip()


def test_logprobs(client):
    r = chat(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, logit_bias=EOS_BAN)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 5
    for e in entries:
        assert e.logprob <= 0.0
        assert len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert e.logprob == pytest.approx(lps[0], abs=1e-5)  # greedy: the chosen token is the most probable
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token or "\ufffd" in e.token
    # Streamed: the same entries arrive spread over the chunks.
    s = chat(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, logit_bias=EOS_BAN, stream=True)
    streamed = [e for ch in s for c in ch.choices if c.logprobs for e in c.logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-5)


def test_reasoning_and_enable_thinking(client):
    r = chat(client, max_tokens=64, **forced("Two and two.</think>\n\nIt is 4."))
    m = r.choices[0].message
    assert reasoning_of(m).strip() == "Two and two."
    assert m.content == "It is 4."
    # enable_thinking false: the template closes the think block; the output is all content.
    r = chat(client, max_tokens=64, **forced("Just 4.", **no_think()))
    assert r.choices[0].message.content == "Just 4."
    assert not reasoning_of(r.choices[0].message)
    # Streamed: reasoning only in reasoning_content, never in content.
    s = chat(client, max_tokens=64, stream=True, **forced("Two and two.</think>\n\nIt is 4."))
    reasoning, content, _, finish, _, _ = stream_collect(s)
    assert reasoning.strip() == "Two and two." and content == "It is 4." and finish == "stop"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


def call_xml(name, **args):
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@pytest.mark.parametrize("stream", [False, True])
def test_one_tool_call_after_think(client, stream):
    text = "The user wants weather.</think>\n\n" + call_xml("get_weather", city="Paris", days=3)
    r = chat(client, "Weather in Paris?", max_tokens=200, tools=[WEATHER, TIME], stream=stream, **forced(text))
    if stream:
        reasoning, content, calls, finish, _, _ = stream_collect(r)
        calls = [calls[i] for i in sorted(calls)]
    else:
        m = r.choices[0].message
        reasoning, content, finish = reasoning_of(m), m.content, r.choices[0].finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls]
    assert reasoning.strip() == "The user wants weather."
    assert not content  # no XML leaks into content
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}  # typed by the schema


@pytest.mark.parametrize("stream", [False, True])
def test_several_tool_calls(client, stream):
    text = ("Two lookups.</think>\n\nLet me check.\n\n" + call_xml("get_weather", city="Oslo") + "\n" +
            call_xml("get_time", zone="CET"))
    r = chat(client, max_tokens=300, tools=[WEATHER, TIME], stream=stream, **forced(text))
    if stream:
        reasoning, content, calls, finish, _, _ = stream_collect(r)
        calls = [calls[i] for i in sorted(calls)]
    else:
        m = r.choices[0].message
        reasoning, content, finish = reasoning_of(m), m.content, r.choices[0].finish_reason
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls]
    assert content.strip() == "Let me check."
    assert finish == "tool_calls"
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Oslo"}, {"zone": "CET"}]
    assert len({c["id"] for c in calls}) == 2
    # parallel_tool_calls false keeps the first call only.
    r = chat(client, max_tokens=300, tools=[WEATHER, TIME], parallel_tool_calls=False, **forced(text))
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_tool_round_trip_is_accepted(client):
    """A replayed assistant turn with arguments as a string and as an object, then the tool results."""
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_keeps_text(client):
    text = "ok</think>\n\n" + call_xml("get_weather", city="Paris")
    r = chat(client, max_tokens=200, tools=[WEATHER], tool_choice="none", **forced(text))
    m = r.choices[0].message
    assert not m.tool_calls and "<function=get_weather>" in m.content
    assert r.choices[0].finish_reason == "stop"


def test_completions(client, server):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0,
                                  logit_bias=EOS_BAN)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    s = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0,
                                  logit_bias=EOS_BAN, stream=True, stream_options={"include_usage": True})
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 5
    e = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2, echo=True, logprobs=2)
    assert e.choices[0].text.startswith("Once upon a time")
    assert len(e.choices[0].logprobs.tokens) == e.usage.completion_tokens or e.choices[0].finish_reason == "stop"
    f = client.completions.create(model=MODEL, prompt=[9707, 11, 1879], max_tokens=20,
                                  extra_body={"tern_debug_forced_output": "forced words"})
    assert f.choices[0].text == "forced words" and f.usage.prompt_tokens == 3


def test_errors_are_openai_shaped(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, temperature=5)
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        chat(client, n=2)
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format={"type": "xml"})
    assert "response_format" in str(e.value)
    # Another model's name is the served model (tern serve --strict-model-name makes it a 404: test_api_defaults.py).
    r = client.chat.completions.create(model="gpt-9", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    assert r.model == MODEL
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}])
    assert "does not fetch" in str(e.value)
    status, _, body = post_json(server.port, "/v1/nowhere", {})
    assert status == 404 and body["error"]["message"]
    status, _, body = post_json(server.port, "/v1/chat/completions", {"messages": "x" * 70000})
    assert status == 413 and "65536" in body["error"]["message"]
    # A prompt longer than the context: 400 with both numbers.
    status, _, body = post_json(server.port, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "word " * 1000}]})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "512" in body["error"]["message"] and "prompt has" in body["error"]["message"]


def test_truncate_prompt_tokens_keeps_the_prompts_end(server):
    """truncate_prompt_tokens (vLLM's field): a prompt longer than the context is cut to its last N tokens instead
    of a 400; usage counts what the model saw; invalid values are rejected; too large an N still gets the 400."""
    long_msg = {"messages": [{"role": "user", "content": "word " * 1000}], "max_tokens": 4, "temperature": 0}
    status, _, body = post_json(server.port, "/v1/chat/completions", {**long_msg, "truncate_prompt_tokens": 100})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == 100
    # A prompt already shorter than N is unchanged.
    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    _, _, plain = post_json(server.port, "/v1/chat/completions", short)
    _, _, kept = post_json(server.port, "/v1/chat/completions", {**short, "truncate_prompt_tokens": 500})
    assert kept["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] < 500
    # N at or beyond the context: the truncated prompt still does not fit.
    status, _, body = post_json(server.port, "/v1/chat/completions", {**long_msg, "truncate_prompt_tokens": 600})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "truncate_prompt_tokens" in body["error"]["message"]
    for bad in (0, -1, "10", 1.5):
        status, _, body = post_json(server.port, "/v1/chat/completions", {**short, "truncate_prompt_tokens": bad})
        assert status == 400 and body["error"]["param"] == "truncate_prompt_tokens", (bad, body)
    # /v1/completions: the same; echo returns the text the model saw (the prompt's end).
    status, _, body = post_json(server.port, "/v1/completions",
                                {"prompt": "alpha " * 900 + "omega", "max_tokens": 1, "truncate_prompt_tokens": 50,
                                 "echo": True})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == 50
    text = body["choices"][0]["text"]
    assert "omega" in text and text.count("alpha") < 60
    status, _, body = post_json(server.port, "/v1/completions", {"prompt": "alpha " * 900, "max_tokens": 1})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


def test_request_log_lines(server):
    lines = [json.loads(l) for l in server.log_text().splitlines() if l.startswith("{")]
    chats = [l for l in lines if l.get("path") == "/v1/chat/completions" and l.get("status") == 200]
    assert chats, "no request log lines"
    for l in chats:
        assert {"time", "method", "status", "ms", "id", "prompt_tokens", "completion_tokens", "finish"} <= set(l)


def log_lines(server, path, status):
    """The request log lines of `path` with `status` so far, oldest first."""
    lines = [json.loads(l) for l in server.log_text().splitlines() if l.startswith("{")]
    return [l for l in lines if l.get("path") == path and l.get("status") == status]


def log_line(server, path, status, seen, words, timeout_s=5):
    """A log line of `path` with `status` after the `seen` ones (log_lines before the request) whose error names
    `words`; fails when none comes. The line is written just after the answer, and the module's server has answered
    other tests' requests on the same path (one of them may still be logging)."""
    deadline = time.monotonic() + timeout_s
    while True:
        new = log_lines(server, path, status)[seen:]
        hits = [l for l in new if words in l.get("error", "")]
        if hits or time.monotonic() > deadline:
            assert hits, f"no new log line for {path} {status} that names {words!r}: {new}"
            return hits[0]
        time.sleep(0.05)


def test_log_line_of_an_error_says_why(server):
    # A 400 on each API shape (OpenAI's, Anthropic's, Ollama's) and an error written before any handler (404).
    for path, body, words in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [], "stream": False}, "messages"),
        ("/api/chat", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "robot"),
    ]:
        seen = len(log_lines(server, path, 400))
        status, _, data = request("POST", server.port, path, body)
        assert status == 400, data
        log_line(server, path, 400, seen, words)
    seen = len(log_lines(server, "/v1/nowhere", 404))
    status, _, _ = request("GET", server.port, "/v1/nowhere")
    assert status == 404
    log_line(server, "/v1/nowhere", 404, seen, "Unknown route")


def test_queue_accounting_adds_up(server):
    m = wait_idle(server.port)
    assert queue_balance(m) == 0, m
    assert m["tern_queue_rejected_total"] == 0


def test_conversation_starting_with_tool_results(client):
    """Agents resume with tool results and no user turn: Qwen's template raises "No user query found"; the server
    renders such a conversation behind an empty user turn instead of failing."""
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:  # other template errors still say what is wrong
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": "a"}, {"role": "system", "content": "late system message"}])
    assert "template" in str(e.value)
