"""tern serve --demo against the official anthropic client (POST /v1/messages, /v1/messages/count_tokens): a message,
a stream assembled by the client's stream helper, a tool-use round trip, count_tokens against the usage of the same
request, thinking on and off, stop sequences, prefix reuse, client disconnects, and Anthropic-shaped errors.

The demo model has random weights: tests that need a known output force it with the test-only request field
tern_debug_forced_output (docs/server.md), which the client sends through extra_body.
"""
import json

import anthropic
import pytest

from test_server_helpers import RawStream, Server, demo_server_fixture, named_sse_events, post_json, request, wait_idle

MODEL = "tern-demo-random-weights"
NO_THINK = {"type": "disabled"}
THINK = {"type": "enabled", "budget_tokens": 1024}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "required": ["city"]},
}
CALL_XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")


server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "1024", "--alias", "claude-local")


@pytest.fixture(scope="module")
def client(server):
    c = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def forced(text):
    return {"extra_body": {"tern_debug_forced_output": text}}


def user(text):
    return [{"role": "user", "content": text}]


def prompt_tokens(message):
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_no_thinking_unless_asked(client):
    # Anthropic's API thinks only when the request asks: without a thinking field the reply is the answer alone
    # (with the template's default, Qwen3.6 would open <think> and the forced text would come back as a thought).
    m = client.messages.create(model=MODEL, max_tokens=32, messages=user("Hello"), **forced("Plain answer."))
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "Plain answer."
    m = client.messages.create(model=MODEL, max_tokens=2048, messages=user("Hello"), thinking=THINK,
                               **forced("A thought.</think>\n\nThe answer."))
    assert [b.type for b in m.content] == ["thinking", "text"]


def test_message(client):
    m = client.messages.create(model=MODEL, max_tokens=32, messages=user("Hello"), thinking=NO_THINK,
                               metadata={"user_id": "u1"}, **forced("Hi there, friend."))
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "Hi there, friend."
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens > 0 and prompt_tokens(m) > 0


def test_max_tokens_and_sampling(client, seed):
    # This client version no longer has arguments for the sampling fields; older clients and tools send them.
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
    m = client.messages.create(model=MODEL, max_tokens=3, messages=user("Count"), thinking=NO_THINK,
                               extra_body={**sampling, "tern_debug_forced_output": "one two three four five six"})
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    # Unforced, the demo model's own tokens: still a valid message.
    m = client.messages.create(model=MODEL, max_tokens=4, messages=user("Hello"), extra_body={"temperature": 1.0})
    assert m.usage.output_tokens <= 4 and m.stop_reason in ("max_tokens", "end_turn")


def test_alias_names_the_model(client):
    m = client.messages.create(model="claude-local", max_tokens=8, messages=user("x"), thinking=NO_THINK,
                               **forced("ok"))
    assert m.content[0].text == "ok"


def test_system_as_string_and_blocks(client):
    a = client.messages.count_tokens(model=MODEL, system="You are terse.", messages=user("Hi"))
    b = client.messages.count_tokens(model=MODEL, system=[{"type": "text", "text": "You are terse."}],
                                     messages=user("Hi"))
    c = client.messages.count_tokens(model=MODEL, messages=user("Hi"))
    assert a.input_tokens == b.input_tokens > c.input_tokens


def test_stream_assembled_by_client(client):
    text = "The answer is forty-two, as everyone knows."
    with client.messages.stream(model=MODEL, max_tokens=64, messages=user("Question?"), thinking=NO_THINK,
                                **forced(text)) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text and len(pieces) > 1
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_stream_event_sequence_with_thinking(server):
    body = {"model": MODEL, "max_tokens": 2048, "stream": True, "thinking": THINK, "messages": user("Think first"),
            "tern_debug_forced_output": "I should greet.</think>\n\nHello!"}
    status, headers, data = request("POST", server.port, "/v1/messages", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = named_sse_events(data)
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert "[DONE]" not in data.decode()
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["usage"]["output_tokens"] == 0
    blocks = {}
    for name, p in events:
        if name == "content_block_start":
            blocks[p["index"]] = {"type": p["content_block"]["type"], "text": "", "stopped": False}
        elif name == "content_block_delta" and p["delta"]["type"] == "signature_delta":
            assert blocks[p["index"]]["type"] == "thinking" and not blocks[p["index"]]["stopped"]
            blocks[p["index"]]["signature"] = p["delta"]["signature"]
        elif name == "content_block_delta":
            key = {"thinking_delta": "thinking", "text_delta": "text"}[p["delta"]["type"]]
            assert blocks[p["index"]]["type"] == key and "signature" not in blocks[p["index"]]
            blocks[p["index"]]["text"] += p["delta"][key]
        elif name == "content_block_stop":
            blocks[p["index"]]["stopped"] = True
    assert [b["type"] for b in blocks.values()] == ["thinking", "text"]
    assert all(b["stopped"] for b in blocks.values())
    assert blocks[0]["text"].strip() == "I should greet." and blocks[1]["text"] == "Hello!"
    assert blocks[0]["signature"].startswith("tern-") and "signature" not in blocks[1]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0


def test_thinking_on_and_off(client):
    on = client.messages.create(model=MODEL, max_tokens=2048, messages=user("Why?"), thinking=THINK,
                                **forced("Because.</think>\n\nIt is so."))
    assert [b.type for b in on.content] == ["thinking", "text"]
    assert on.content[0].thinking.strip() == "Because." and on.content[0].signature.startswith("tern-")
    assert on.content[1].text == "It is so."
    off = client.messages.create(model=MODEL, max_tokens=64, messages=user("Why?"), thinking=NO_THINK,
                                 **forced("It is so."))
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "It is so."
    # The template's switch: thinking off renders an empty <think></think> block into the prompt.
    n_on = client.messages.count_tokens(model=MODEL, messages=user("Why?"), thinking=THINK).input_tokens
    n_off = client.messages.count_tokens(model=MODEL, messages=user("Why?"), thinking=NO_THINK).input_tokens
    assert n_off > n_on
    assert prompt_tokens(on) == n_on and prompt_tokens(off) == n_off


def test_stop_sequence(client):
    m = client.messages.create(model=MODEL, max_tokens=64, messages=user("x"), thinking=NO_THINK,
                               stop_sequences=["STOP"], **forced("Hello STOP world"))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "Hello "


def test_count_tokens_equals_prompt_tokens(client):
    kw = dict(model=MODEL, system="Be brief.", tools=[WEATHER_TOOL],
              messages=[{"role": "user", "content": "Weather in Paris?"}])
    counted = client.messages.count_tokens(**kw).input_tokens
    m = client.messages.create(max_tokens=8, thinking=NO_THINK, **kw, **forced("ok"))
    n_off = client.messages.count_tokens(thinking=NO_THINK, **kw).input_tokens
    n_on = client.messages.count_tokens(thinking=THINK, **kw).input_tokens
    assert prompt_tokens(m) == n_off
    assert counted > 0 and counted == n_off  # no thinking field: no thinking, as on Anthropic's API
    assert n_on < n_off  # thinking on: the prompt is shorter by the empty think block
    without_tools = client.messages.count_tokens(model=MODEL, system="Be brief.",
                                                 messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert without_tools.input_tokens < counted


def test_tool_use_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    m = client.messages.create(model=MODEL, max_tokens=256, messages=messages, tools=[WEATHER_TOOL],
                               tool_choice={"type": "any"}, thinking=NO_THINK, **forced(CALL_XML))
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1
    use = uses[0]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and use.input == {"city": "Paris", "days": 3}

    def follow_up(result):
        return messages + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]},
        ]

    answer = client.messages.create(model=MODEL, max_tokens=64, messages=follow_up("18 C, sunny"),
                                    tools=[WEATHER_TOOL], thinking=NO_THINK, **forced("It is 18 C and sunny."))
    assert answer.stop_reason == "end_turn" and answer.content[0].text == "It is 18 C and sunny."
    # The tool result is in the prompt: a longer result is more prompt tokens.
    short = client.messages.count_tokens(model=MODEL, messages=follow_up("18 C"), tools=[WEATHER_TOOL]).input_tokens
    long = client.messages.count_tokens(model=MODEL, messages=follow_up("18 C, sunny, light wind from the west"),
                                        tools=[WEATHER_TOOL]).input_tokens
    assert long > short
    # tool_result content as text blocks, and is_error, are accepted too.
    blocks = follow_up([{"type": "text", "text": "timeout"}])
    blocks[-1]["content"][0]["is_error"] = True
    assert client.messages.count_tokens(model=MODEL, messages=blocks, tools=[WEATHER_TOOL]).input_tokens > 0


def test_tool_use_streamed(client):
    with client.messages.stream(model=MODEL, max_tokens=256, messages=user("Weather in Paris?"),
                                tools=[WEATHER_TOOL], tool_choice={"type": "auto"},
                                thinking=NO_THINK, **forced("Let me check.\n\n" + CALL_XML)) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert final.content[1].name == "get_weather" and final.content[1].input == {"city": "Paris", "days": 3}
    assert final.stop_reason == "tool_use"


def test_forced_tool_choice_is_constrained(client):
    # tool_choice tool: the reply must be a call of that tool; forcing other text is refused by the constraint.
    m = client.messages.create(model=MODEL, max_tokens=256, messages=user("x"), tools=[WEATHER_TOOL],
                               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                               thinking=NO_THINK, **forced(CALL_XML))
    assert [b.type for b in m.content] == ["tool_use"] and m.stop_reason == "tool_use"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=64, messages=user("x"), tools=[WEATHER_TOOL],
                               tool_choice={"type": "any"}, thinking=NO_THINK, **forced("Just text."))
    assert error_of(e)["type"] == "invalid_request_error"


def test_tool_choice_none_keeps_calls_as_text(client):
    m = client.messages.create(model=MODEL, max_tokens=256, messages=user("x"), tools=[WEATHER_TOOL],
                               tool_choice={"type": "none"}, thinking=NO_THINK, **forced(CALL_XML))
    assert [b.type for b in m.content] == ["text"] and "<tool_call>" in m.content[0].text
    assert m.stop_reason == "end_turn"


def test_prefix_reuse_on_the_next_turn(client):
    history = [{"role": "user", "content": "Tell me about prefix caches. " * 20}]
    first = client.messages.create(model=MODEL, max_tokens=32, messages=history, thinking=NO_THINK,
                                   **forced("They keep what was computed."))
    history += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And then?"}]
    second = client.messages.create(model=MODEL, max_tokens=32, messages=history, thinking=NO_THINK,
                                    **forced("Then reuse it."))
    assert second.usage.cache_read_input_tokens > prompt_tokens(first) // 2
    assert second.usage.input_tokens < prompt_tokens(second) - prompt_tokens(first) // 2


def test_client_disconnect_cancels(server):
    before = wait_idle(server.port)
    body = {"model": MODEL, "max_tokens": 400, "stream": True, "thinking": NO_THINK, "messages": user("Go"),
            "tern_debug_forced_output": "word " * 400}
    s = RawStream(server.port, "/v1/messages", body)
    s.read_until(b"content_block_delta")
    s.close()
    after = wait_idle(server.port)
    key = 'tern_queue_finished_total{outcome="cancelled"}'
    assert after.get(key, 0) == before.get(key, 0) + 1
    assert after["tern_completion_tokens_total"] - before["tern_completion_tokens_total"] < 400


def error_of(exc_info):
    body = exc_info.value.body
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def test_errors_are_anthropic_shaped(server, client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    err = error_of(e)
    # An image whose bytes are only PNG's signature: a 400 naming the image and why (test_images_api.py has more).
    assert err["type"] == "invalid_request_error" and "messages[0].content[0].source.data" in err["message"]
    assert "PNG" in err["message"]
    # Another model's name is the served model, named by its id (--strict-model-name: a not_found_error, in
    # test_api_defaults.py).
    assert client.messages.create(model="claude-opus-9", max_tokens=1, messages=user("x")).model == MODEL
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=8, messages=user("x"), extra_body={"temperature": 1.5})
    assert "temperature" in error_of(e)["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=8, messages=user("x"), tools=[WEATHER_TOOL],
                               tool_choice={"type": "tool", "name": "nope"})
    assert "nope" in error_of(e)["message"]
    # A final assistant message is a prefill: continued (test_prefill.py), no longer refused.

    cases = [
        ({"model": MODEL, "messages": user("x")}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 0, "messages": user("x")}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 8, "messages": []}, "messages"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"model": MODEL, "max_tokens": 8, "messages": user("x"), "stop_sequences": "STOP"}, "stop_sequences"),
        ({"model": MODEL, "max_tokens": 8, "messages": user("x"), "thinking": {"type": "enabled"}}, "budget_tokens"),
        ({"model": MODEL, "max_tokens": 8, "messages": user("x"), "tool_choice": {"type": "any"}}, "tools"),
        ({"model": MODEL, "max_tokens": 8, "messages": user("x"), "top_k": -1}, "top_k"),
    ]
    for body, word in cases:
        status, _, data = post_json(server.port, "/v1/messages", body)
        assert status == 400, (body, data)
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error", data
        assert word in data["error"]["message"], (word, data)
    status, _, data = request("POST", server.port, "/v1/messages", "{not json")
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"
    status, headers, data = request("GET", server.port, "/v1/messages")
    assert status == 405 and headers["allow"] == "POST" and json.loads(data)["type"] == "error"


def test_api_key_as_x_api_key(tern_bin):
    s = Server(tern_bin, "--api-key", "sekrit", "--ctx-size", "256")
    try:
        good = anthropic.Anthropic(base_url=s.base, api_key="sekrit", max_retries=0, timeout=60)
        assert good.messages.count_tokens(model=MODEL, messages=user("x")).input_tokens > 0
        bad = anthropic.Anthropic(base_url=s.base, api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.count_tokens(model=MODEL, messages=user("x"))
        assert error_of(e)["type"] == "authentication_error"
        good.close()
        bad.close()
    finally:
        s.stop()
