"""tern serve --demo against the official openai client's Responses API (POST /v1/responses): a response from a
string and from input items, instructions, streams (event order, sequence numbers, deltas that add up to the final
text, the client's stream helper), max_output_tokens -> incomplete, text.format json_schema / json_object, forced
and automatic function calls with a tool round trip, thinking on and off through reasoning.effort, client
disconnects, and the 400 / 404 / 405 answers.

The demo model has random weights: tests assert the structure of what it writes, or force a known output with the
test-only request field tern_debug_forced_output (docs/server.md), which the client sends through extra_body.
"""
import json
import math
import random
import signal

import jsonschema
import openai
import pytest

from test_server_helpers import (MUTATION_INSERTS, RawStream, Server, dechunk, demo_server_fixture, mutate_body,
                                 named_sse_events, post_json, request, wait_idle)

MODEL = "tern-demo-random-weights"
NO_THINK = {"effort": "none"}
THINK = {"effort": "high"}
TIMEOUT = 120
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                  "required": ["city", "days"], "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": WEATHER_PARAMS, "strict": True}
CALL_XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")

server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "1024")


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    yield c
    c.close()


def forced(text, **extra):
    return {"extra_body": {"tern_debug_forced_output": text, **extra}}


def check_usage(r):
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens
    assert 0 <= u.output_tokens_details.reasoning_tokens <= u.output_tokens


def message_text(r):
    return "".join(part.text for item in r.output if item.type == "message" for part in item.content)


def test_string_input_with_instructions(client):
    r = client.responses.create(model=MODEL, input="Hello", instructions="Be terse.", reasoning=NO_THINK,
                                max_output_tokens=32, metadata={"k": "v"}, user="u1", store=False,
                                **forced("Hi there, friend."))
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    assert r.created_at > 1.6e9
    assert [item.type for item in r.output] == ["message"]
    msg = r.output[0]
    assert msg.id.startswith("msg_") and msg.role == "assistant" and msg.status == "completed"
    assert [p.type for p in msg.content] == ["output_text"] and msg.content[0].text == "Hi there, friend."
    assert r.output_text == "Hi there, friend."
    assert r.instructions == "Be terse." and r.metadata == {"k": "v"} and r.user == "u1"
    check_usage(r)
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    # The instructions are in the prompt.
    plain = client.responses.create(model=MODEL, input="Hello", reasoning=NO_THINK, **forced("ok"))
    assert r.usage.input_tokens > plain.usage.input_tokens


def test_unforced_sampled_output_is_well_formed(client, seed):
    r = client.responses.create(model=MODEL, input="Tell me something.", reasoning=NO_THINK, max_output_tokens=12,
                                temperature=0.9, top_p=0.95, extra_body={"seed": seed})
    assert r.status in ("completed", "incomplete")
    assert r.temperature == pytest.approx(0.9) and r.top_p == pytest.approx(0.95)
    assert all(item.type == "message" for item in r.output)
    assert r.usage.output_tokens <= 12
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 12


def test_item_list_input(client):
    items = [
        {"role": "developer", "content": "You answer in one word."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of "},
                                                         {"type": "input_text", "text": "France?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]},
        {"role": "user", "content": "And of Italy?"},
    ]
    r = client.responses.create(model=MODEL, input=items, instructions="Be exact.", reasoning=NO_THINK,
                                **forced("Rome."))
    assert r.status == "completed" and r.output_text == "Rome."
    shorter = client.responses.create(model=MODEL, input=items[1:], reasoning=NO_THINK, **forced("Rome."))
    assert r.usage.input_tokens > shorter.usage.input_tokens
    # A reasoning item from an earlier turn is accepted (and rendered as that turn's reasoning).
    with_reasoning = [items[1], {"type": "reasoning", "id": "rs_1", "summary": [],
                                 "content": [{"type": "reasoning_text", "text": "France's capital."}]}] + items[2:]
    r2 = client.responses.create(model=MODEL, input=with_reasoning, reasoning=NO_THINK, **forced("Rome."))
    assert r2.status == "completed" and r2.output_text == "Rome."
    # A developer item later in the conversation (agents add some) joins the system message: the same prompt as
    # with it at the start.
    late = [items[1], items[2], items[0], items[3]]
    r3 = client.responses.create(model=MODEL, input=late, instructions="Be exact.", reasoning=NO_THINK,
                                 **forced("Rome."))
    assert r3.status == "completed" and r3.usage.input_tokens == r.usage.input_tokens


def collect(stream):
    events = list(stream)
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(events))), seq
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    return events


def check_item_events(events):
    """Every item is added, gets its deltas, and is done, in that order; returns {output_index: (type, text)}."""
    items, open_items = {}, set()
    for e in events:
        if e.type == "response.output_item.added":
            assert e.output_index not in items
            items[e.output_index] = [e.item.type, ""]
            open_items.add(e.output_index)
        elif e.type in ("response.output_text.delta", "response.reasoning_text.delta",
                        "response.function_call_arguments.delta"):
            assert e.output_index in open_items, e
            items[e.output_index][1] += e.delta
        elif e.type in ("response.output_text.done", "response.reasoning_text.done"):
            assert e.text == items[e.output_index][1]
        elif e.type == "response.function_call_arguments.done":
            assert e.arguments == items[e.output_index][1]
        elif e.type == "response.output_item.done":
            open_items.remove(e.output_index)
            assert e.item.type == items[e.output_index][0] and e.item.status in ("completed", "incomplete")
    assert not open_items
    return {i: tuple(v) for i, v in items.items()}


def test_stream_event_order_and_deltas(client, seed):
    stream = client.responses.create(model=MODEL, input="Write a line.", reasoning=NO_THINK, max_output_tokens=24,
                                     temperature=1.0, stream=True, extra_body={"seed": seed})
    events = collect(stream)
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    items = check_item_events(events)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == message_text(final.response)
    assert [t for t, _ in items.values()] == [item.type for item in final.response.output]
    assert final.response.usage.output_tokens > 0 and final.response.id == events[0].response.id


def test_stream_helper_assembles_the_response(client):
    text = "The answer is forty-two, as everyone knows."
    with client.responses.stream(model=MODEL, input="Question?", reasoning=NO_THINK, **forced(text)) as stream:
        pieces = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(pieces) == text and len(pieces) > 1
    assert final.status == "completed" and final.output_text == text


def test_raw_stream_with_reasoning(server):
    body = {"model": MODEL, "input": "Think first", "stream": True, "reasoning": THINK, "max_output_tokens": 256,
            "tern_debug_forced_output": "I should greet.</think>\n\nHello!"}
    status, headers, data = request("POST", server.port, "/v1/responses", body, timeout=TIMEOUT)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in data.decode()
    events = named_sse_events(data)
    names = [n for n, _ in events]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", *["response.reasoning_text.delta"] *
        names.count("response.reasoning_text.delta"), "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", *["response.output_text.delta"] *
        names.count("response.output_text.delta"), "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.completed"], names
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    reasoning = "".join(p["delta"] for n, p in events if n == "response.reasoning_text.delta")
    assert reasoning.strip() == "I should greet."
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"][0]["text"] == reasoning and final["output"][0]["id"].startswith("rs_")
    assert final["output"][1]["content"][0]["text"] == "Hello!"
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_max_output_tokens_gives_incomplete(client):
    r = client.responses.create(model=MODEL, input="Count", reasoning=NO_THINK, max_output_tokens=3,
                                **forced("one two three four five six seven"))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.max_output_tokens == 3
    assert r.output[0].status == "incomplete" and r.output_text
    events = collect(client.responses.create(model=MODEL, input="Count", reasoning=NO_THINK, max_output_tokens=3,
                                             stream=True, **forced("one two three four five six seven")))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    check_item_events(events)


ANSWER_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]},
                                                  "tag": {"type": "string", "maxLength": 8}},
                 "required": ["ok", "n", "tag"], "additionalProperties": False}


def test_json_schema_output_validates(server, client, seed):
    for i in range(3):
        r = client.responses.create(model=MODEL, input="Answer in JSON.", reasoning=NO_THINK, max_output_tokens=60,
                                    temperature=1.0, extra_body={"seed": seed + i},
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA,
                                                     "strict": True}})
        assert r.status == "completed", r
        jsonschema.validate(json.loads(r.output_text), ANSWER_SCHEMA)
        assert r.text.format.type == "json_schema" and r.text.format.name == "answer"
    r = client.responses.create(model=MODEL, input="JSON please.", reasoning=NO_THINK, max_output_tokens=60,
                                temperature=0.0, text={"format": {"type": "json_object"}},
                                **forced('{"a":[1,2]}'))
    assert json.loads(r.output_text) == {"a": [1, 2]}
    # The constraint refuses text that is not JSON: the forced output cannot be generated.
    status, _, err = post_json(server.port, "/v1/responses", {
        "model": MODEL, "input": "x", "reasoning": NO_THINK, "text": {"format": {"type": "json_object"}},
        "tern_debug_forced_output": "plain words"}, timeout=TIMEOUT)
    assert status == 400, err


def function_calls(r):
    return [item for item in r.output if item.type == "function_call"]


def test_tool_choice_required_gives_valid_calls(client, seed):
    completed = 0
    for i, (choice, parallel) in enumerate([("required", False), ({"type": "function", "name": "get_weather"}, False),
                                            ("required", True)]):
        r = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice=choice,
                                    parallel_tool_calls=parallel, reasoning=NO_THINK, max_output_tokens=200,
                                    temperature=0.8, extra_body={"seed": seed + i})
        if r.status == "incomplete":
            continue
        completed += 1
        calls = function_calls(r)
        assert calls and [item.type for item in r.output] == ["function_call"] * len(calls)
        if not parallel:
            assert len(calls) == 1
        for call in calls:
            assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
            assert call.status == "completed"
            jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    assert completed >= 2


def test_tool_round_trip(client):
    question = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    r = client.responses.create(model=MODEL, input=question, tools=[WEATHER_TOOL], reasoning=NO_THINK,
                                max_output_tokens=256, **forced("Let me check.\n\n" + CALL_XML))
    assert [item.type for item in r.output] == ["message", "function_call"]
    assert r.output[0].content[0].text == "Let me check."
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": 3}

    def follow_up(result):
        return question + [item.model_dump(exclude_none=True) for item in r.output] + [
            {"type": "function_call_output", "call_id": call.call_id, "output": result}]

    answer = client.responses.create(model=MODEL, input=follow_up("18 C, sunny"), tools=[WEATHER_TOOL],
                                     reasoning=NO_THINK, **forced("It is 18 C and sunny."))
    assert answer.status == "completed" and answer.output_text == "It is 18 C and sunny."
    longer = client.responses.create(model=MODEL, input=follow_up("18 C, sunny, light wind from the west"),
                                     tools=[WEATHER_TOOL], reasoning=NO_THINK, **forced("ok"))
    assert longer.usage.input_tokens > answer.usage.input_tokens
    # Streamed, a call arrives as one item with its arguments.
    events = collect(client.responses.create(model=MODEL, input=question, tools=[WEATHER_TOOL], reasoning=NO_THINK,
                                             stream=True, **forced(CALL_XML)))
    items = check_item_events(events)
    assert list(items.values()) == [("function_call", call.arguments)]
    # tool_choice none: the call stays text.
    r = client.responses.create(model=MODEL, input=question, tools=[WEATHER_TOOL], tool_choice="none",
                                reasoning=NO_THINK, **forced(CALL_XML))
    assert [item.type for item in r.output] == ["message"] and "<tool_call>" in r.output_text


def test_reasoning_effort_switches_thinking(client):
    on = client.responses.create(model=MODEL, input="Why?", reasoning=THINK, max_output_tokens=256,
                                 **forced("Because.</think>\n\nIt is so."))
    assert [item.type for item in on.output] == ["reasoning", "message"]
    assert on.output[0].content[0].text.strip() == "Because." and on.output[0].summary == []
    assert on.output_text == "It is so." and on.reasoning.effort == "high"
    assert on.usage.output_tokens_details.reasoning_tokens > 0
    off = client.responses.create(model=MODEL, input="Why?", reasoning={"effort": "minimal"}, **forced("It is so."))
    assert [item.type for item in off.output] == ["message"] and off.output_text == "It is so."
    assert off.usage.output_tokens_details.reasoning_tokens == 0
    # Thinking off renders an empty <think></think> block into the prompt: more prompt tokens.
    assert off.usage.input_tokens > on.usage.input_tokens


def test_error_after_the_stream_started_is_an_error_event(server):
    # A forced output that the json_object constraint refuses fails inside the engine, after the headers are sent.
    body = {"model": MODEL, "input": "x", "stream": True, "reasoning": NO_THINK,
            "text": {"format": {"type": "json_object"}}, "tern_debug_forced_output": "plain words"}
    status, _, data = request("POST", server.port, "/v1/responses", body, timeout=TIMEOUT)
    assert status == 200
    events = named_sse_events(data)
    assert [n for n, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert [p["sequence_number"] for _, p in events] == [0, 1, 2, 3]
    error = events[2][1]
    assert error["message"] and "code" in error and "param" in error
    failed = events[3][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == error["message"]


def test_sigterm_ends_a_stream_with_a_final_event(tern_bin):
    s = Server(tern_bin, "-q", "--debug-allow-forced-output", "--ctx-size", "1024")
    try:
        body = {"model": MODEL, "input": "Go", "stream": True, "reasoning": NO_THINK, "max_output_tokens": 600,
                "tern_debug_forced_output": "word " * 600}
        stream = RawStream(s.port, "/v1/responses", body, timeout=TIMEOUT)
        stream.read_until(b"response.output_text.delta")
        s.proc.send_signal(signal.SIGTERM)
        status, data = dechunk(stream.read_all())
        stream.close()
        events = named_sse_events(data)
        assert status == 200 and events[-1][0] in ("response.failed", "response.completed"), data[-300:]
        assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
        if events[-1][0] == "response.failed":  # cancelled before the 600 words were out
            assert "shutting down" in events[-1][1]["response"]["error"]["message"]
        assert s.proc.wait(timeout=15) == 0
    finally:
        s.stop()


def test_client_disconnect_cancels(server):
    before = wait_idle(server.port)
    body = {"model": MODEL, "input": "Go", "stream": True, "reasoning": NO_THINK, "max_output_tokens": 400,
            "tern_debug_forced_output": "word " * 400}
    s = RawStream(server.port, "/v1/responses", body, timeout=TIMEOUT)
    s.read_until(b"response.output_text.delta")
    s.close()
    after = wait_idle(server.port)
    key = 'tern_queue_finished_total{outcome="cancelled"}'
    assert after.get(key, 0) == before.get(key, 0) + 1
    assert after["tern_completion_tokens_total"] - before["tern_completion_tokens_total"] < 400


BAD_BODIES = [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
    ({"input": "x", "tools": [WEATHER_TOOL, {"type": "code_interpreter"}]}, "tools[1].type", "code_interpreter"),
    ({"input": "x", "previous_response_id": "resp_123"}, "previous_response_id", "stateless"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "stateless"),
    ({"input": "x", "temperature": -0.5}, "temperature", "temperature"),
    ({"input": "x", "temperature": 3}, "temperature", "temperature"),
    ({"input": "x", "top_p": 0}, "top_p", "top_p"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"input": "x", "max_tokens": 5}, "max_tokens", "max_output_tokens"),
    ({"input": "x", "frobnicate": True}, "frobnicate", "frobnicate"),
    ({}, "input", "input"),
    ({"input": 5}, "input", "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].image_url", "does not fetch"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0]", "not supported"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{bad"}]},
     "input[0].arguments", "arguments"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stateless"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "web_search_call"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "tools"),
    ({"input": "x", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name", "nope"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice.type", "file_search"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type", "xml"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema", "schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "strin"}}}},
     "text.format.schema", "type"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort", "extreme"),
    ({"input": "x", "stream": "yes"}, "stream", "boolean"),
    ({"input": "x", "metadata": {"a": 1}}, "metadata", "string"),
    ({"input": "x", "background": True}, "background", "stateless"),
]


@pytest.mark.parametrize("body,param,word", BAD_BODIES, ids=[b[1] + "-" + b[2] for b in BAD_BODIES])
def test_bad_fields_are_400_naming_the_field(server, body, param, word):
    status, _, data = post_json(server.port, "/v1/responses", {"model": MODEL, **body}, timeout=TIMEOUT)
    assert status == 400, data
    err = data["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert word in err["message"], err


def test_malformed_and_non_finite_bodies(server, client):
    status, _, data = request("POST", server.port, "/v1/responses", "{not json", timeout=TIMEOUT)
    assert status == 400 and "error" in json.loads(data)
    # NaN is not JSON (Python's json writes it anyway): refused as an unreadable body.
    status, _, data = request("POST", server.port, "/v1/responses",
                              json.dumps({"model": MODEL, "input": "x", "temperature": math.nan}), timeout=TIMEOUT)
    assert status == 400 and "error" in json.loads(data)
    status, _, data = request("POST", server.port, "/v1/responses",
                              '{"model": "%s", "input": "x", "temperature": 1e999}' % MODEL, timeout=TIMEOUT)
    assert status == 400 and "error" in json.loads(data)
    status, _, data = post_json(server.port, "/v1/responses", {"model": MODEL, "input": "x", "temperature": "hot"},
                                timeout=TIMEOUT)
    assert status == 400 and data["error"]["param"] == "temperature"
    # Through the client: its exception carries the error.
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", temperature=-1)
    assert "temperature" in str(e.value)
    # Another model's name is the served model (a 404 only with --strict-model-name: test_api_defaults.py).
    assert client.responses.create(model="gpt-5", input="x", max_output_tokens=1).model == MODEL


def test_routes_405_and_404(server, client):
    status, headers, data = request("GET", server.port, "/v1/responses", timeout=TIMEOUT)
    assert status == 405 and headers["allow"] == "POST" and "error" in json.loads(data)
    status, _, data = request("GET", server.port, "/v1/responses/resp_abc123", timeout=TIMEOUT)
    err = json.loads(data)["error"]
    assert status == 404 and "resp_abc123" in err["message"] and "stateless" in err["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_abc123")
    status, _, data = request("GET", server.port, "/v1/nothing", timeout=TIMEOUT)
    assert status == 404 and "/v1/responses" in json.loads(data)["error"]["message"]
    # Without the /v1 prefix too.
    status, _, data = post_json(server.port, "/responses", {"model": MODEL, "input": "x", "reasoning": NO_THINK,
                                                            "tern_debug_forced_output": "ok"}, timeout=TIMEOUT)
    assert status == 200 and data["object"] == "response" and data["output"][0]["content"][0]["text"] == "ok"


FUZZ_BASE = {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                                       {"type": "function_call", "call_id": "c1", "name": "get_weather",
                                        "arguments": json.dumps({"city": "Oslo", "days": 2})},
                                       {"type": "function_call_output", "call_id": "c1", "output": "cold"}],
             "instructions": "Be brief.", "tools": [WEATHER_TOOL], "tool_choice": "auto", "max_output_tokens": 4,
             "reasoning": {"effort": "none"}, "text": {"format": {"type": "text"}}, "temperature": 0.5}


def test_random_mutations_never_break_the_server(server, seed):
    rng = random.Random(seed)
    text = json.dumps(FUZZ_BASE).encode()
    for _ in range(120):
        b = mutate_body(rng, text, MUTATION_INSERTS[:-1] + (b"null", b"0"), 20)
        status, _, data = request("POST", server.port, "/v1/responses", b, timeout=TIMEOUT)
        assert status < 500, (b, status, data[:200])
        body = json.loads(data)  # always JSON: an error or a response
        assert ("error" in body and body.get("object") != "response") == (status >= 400), (b, status, body)
    # Every field (top level, items, parts, tools) replaced by a value of another type.
    values = [None, 0, -1, 1.5, "", "x", [], {}, True, [1], {"a": 1}, [{}], 1e300]

    def paths(v, prefix=()):
        yield prefix
        children = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else []
        for k, child in children:
            yield from paths(child, prefix + (k,))

    for path in list(paths(FUZZ_BASE))[1:]:
        body = json.loads(json.dumps(FUZZ_BASE))
        target = body
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value = rng.choice(values)
        status, _, data = request("POST", server.port, "/v1/responses", body, timeout=TIMEOUT)
        # Any model name is the served model (no 404 without --strict-model-name).
        assert status in (200, 400), (path, target, status, data[:300])
        out = json.loads(data)
        if status == 400:
            assert out["error"]["message"], out
    status, _, body = post_json(server.port, "/v1/responses", FUZZ_BASE, timeout=TIMEOUT)
    assert status == 200 and body["status"] in ("completed", "incomplete")
    assert server.alive()
