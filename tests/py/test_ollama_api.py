"""Ollama's REST API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version) against
tern serve --demo, over plain HTTP (the `ollama` client package is not a dependency). Streams are NDJSON: one JSON
object per line.

The demo model has random weights: exact outputs are forced with tern_debug_forced_output (the server runs with
--debug-allow-forced-output); unforced runs check what holds whatever the tokens are (stream == non-stream with the
same seed and temperature 0; format constrains the output to valid JSON).
"""
import json
import random
import re

import jsonschema
import pytest

from test_server_helpers import (RawStream, Server, demo_server_fixture, mutate_body, post_json, queue_balance, request,
                                 wait_idle)

MODEL = "tern-demo-random-weights"
CALL_XML = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
FINAL_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration")

server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "1024", "--alias", "qwen-local")


def user(text):
    return [{"role": "user", "content": text}]


def chat(port, **body):
    body.setdefault("model", MODEL)
    body.setdefault("stream", False)
    status, headers, data = post_json(port, "/api/chat", body, timeout=300)
    assert status == 200, data
    assert headers["content-type"].startswith("application/json")
    return data


def stream(port, path, body):
    """The objects of an NDJSON stream (checks the framing: one object per line, the last one done)."""
    status, headers, data = request("POST", port, path, dict(body, stream=True), timeout=300)
    assert status == 200, data
    assert headers["content-type"] == "application/x-ndjson"
    text = data.decode("utf-8")
    assert text.endswith("\n") and "data:" not in text and "[DONE]" not in text
    objects = [json.loads(line) for line in text.split("\n")[:-1]]
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    return objects


def check_final(obj, reason="stop"):
    assert obj["done"] is True and obj["done_reason"] == reason, obj
    for key in FINAL_FIELDS:
        assert isinstance(obj[key], int) and obj[key] >= 0, (key, obj)
    assert obj["prompt_eval_count"] > 0 and obj["eval_count"] > 0 and obj["total_duration"] > 0, obj
    assert obj["total_duration"] >= obj["prompt_eval_duration"] + obj["eval_duration"], obj
    assert RFC3339.match(obj["created_at"]), obj["created_at"]


def test_chat_forced_output(server):
    r = chat(server.port, messages=user("Hi"), think=False, tern_debug_forced_output="Hello there, friend.",
             keep_alive="5m", options={"num_ctx": 1024, "num_gpu": 99, "mirostat": 0})  # unknown options: ignored
    assert r["model"] == MODEL
    assert r["message"] == {"role": "assistant", "content": "Hello there, friend."}
    check_final(r)


def test_chat_stream_equals_non_stream(server, seed):
    body = {"model": MODEL, "messages": user("Write something."), "think": False,
            "options": {"temperature": 0, "seed": seed, "num_predict": 24}}
    whole = chat(server.port, **body)
    objects = stream(server.port, "/api/chat", body)
    text = "".join(o["message"]["content"] for o in objects)
    assert text == whole["message"]["content"]
    assert all(o["message"]["role"] == "assistant" and "thinking" not in o["message"] for o in objects)
    last = objects[-1]
    check_final(last, whole["done_reason"])
    assert last["eval_count"] == whole["eval_count"] and last["prompt_eval_count"] == whole["prompt_eval_count"]


def test_stream_is_the_default(server):
    status, headers, data = request("POST", server.port, "/api/chat",
                                    {"model": MODEL, "messages": user("Hi"), "think": False,
                                     "tern_debug_forced_output": "One two three."})
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    objects = [json.loads(line) for line in data.decode().splitlines()]
    assert len(objects) >= 2 and objects[-1]["done"] is True
    assert "".join(o["message"]["content"] for o in objects) == "One two three."


def test_generate_with_template_and_raw(server):
    status, _, r = post_json(server.port, "/api/generate", {
        "model": MODEL, "prompt": "The capital of France?", "system": "Be brief.", "think": False, "stream": False,
        "tern_debug_forced_output": "Paris."})
    assert status == 200, r
    assert r["response"] == "Paris." and "message" not in r and "thinking" not in r and "context" not in r
    check_final(r)
    templated = r["prompt_eval_count"]

    prompt = "The capital of France is"
    status, _, r = post_json(server.port, "/api/generate", {"model": MODEL, "prompt": prompt, "raw": True,
                                                            "stream": False, "tern_debug_forced_output": " Paris"})
    assert status == 200, r
    assert r["response"] == " Paris"
    check_final(r)
    status, _, toks = post_json(server.port, "/tokenize", {"content": prompt})
    assert r["prompt_eval_count"] == len(toks["tokens"]) < templated  # raw: the prompt's own tokens, no template

    objects = stream(server.port, "/api/generate", {"model": MODEL, "prompt": prompt, "raw": True,
                                                    "tern_debug_forced_output": " Paris, of course."})
    assert "".join(o["response"] for o in objects) == " Paris, of course."
    check_final(objects[-1])


def test_think_on_and_off(server):
    r = chat(server.port, messages=user("Hi"), think=True,
             tern_debug_forced_output="I should greet.</think>\n\nHello!")
    assert r["message"]["thinking"] == "I should greet." and r["message"]["content"] == "Hello!"
    r = chat(server.port, messages=user("Hi"), think=False, tern_debug_forced_output="Hello!")
    assert "thinking" not in r["message"] and r["message"]["content"] == "Hello!"
    # Without `think`, the template's default: Qwen3.6 thinks.
    r = chat(server.port, messages=user("Hi"), tern_debug_forced_output="By default.</think>\n\nHello!")
    assert r["message"]["thinking"] == "By default." and r["message"]["content"] == "Hello!"

    objects = stream(server.port, "/api/chat", {"model": MODEL, "messages": user("Hi"), "think": True,
                                                "tern_debug_forced_output": "Greet them.</think>\n\nHello!"})
    assert "".join(o["message"].get("thinking", "") for o in objects) == "Greet them."
    assert "".join(o["message"]["content"] for o in objects) == "Hello!"

    status, _, r = post_json(server.port, "/api/generate", {
        "model": MODEL, "prompt": "Hi", "think": True, "stream": False,
        "tern_debug_forced_output": "Short.</think>\n\nHello!"})
    assert status == 200 and r["thinking"] == "Short." and r["response"] == "Hello!", r
    # An assistant turn's thinking is accepted in the history.
    r = chat(server.port, think=True, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "thinking": "Greet."},
        {"role": "user", "content": "Again"}], tern_debug_forced_output="Hm.</think>\n\nHello again!")
    assert r["message"]["content"] == "Hello again!"


def test_format_json_and_schema(server, seed):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    # "json": one JSON object (free JSON from random weights often runs past num_predict: then the start of one).
    for i in range(3):
        r = chat(server.port, messages=user("Answer in JSON."), think=False, format="json",
                 options={"seed": seed + i, "temperature": 1.0, "num_predict": 200})
        if r["done_reason"] == "stop":
            assert isinstance(json.loads(r["message"]["content"]), dict), r
        else:
            assert r["done_reason"] == "length" and r["message"]["content"].lstrip().startswith("{"), r
    # A schema: what finishes validates, and a small schema finishes.
    stops = 0
    for i in range(4):
        r = chat(server.port, messages=user("Answer in JSON."), think=False, format=schema,
                 options={"seed": seed + i, "temperature": 0.7, "num_predict": 200})
        if r["done_reason"] != "stop":
            continue
        stops += 1
        jsonschema.validate(json.loads(r["message"]["content"]), schema)
    assert stops >= 2, f"only {stops} of 4 runs finished within 200 tokens"
    objects = stream(server.port, "/api/chat", {"model": MODEL, "messages": user("JSON"), "think": False,
                                                "format": schema, "options": {"seed": seed, "num_predict": 200}})
    if objects[-1]["done_reason"] == "stop":
        jsonschema.validate(json.loads("".join(o["message"]["content"] for o in objects)), schema)
    # With thinking on, the constraint starts after the reasoning.
    r = chat(server.port, messages=user("JSON please"), think=True, format=schema,
             tern_debug_forced_output='Think.</think>\n\n{"name": "Ann", "age": 30}')
    assert r["message"]["thinking"] == "Think."
    jsonschema.validate(json.loads(r["message"]["content"]), schema)


def test_tool_call_round_trip(server):
    r = chat(server.port, messages=user("Weather in Paris?"), tools=[WEATHER_TOOL], think=False,
             tern_debug_forced_output=CALL_XML)
    calls = r["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"] == {"city": "Paris", "days": 3}
    assert r["message"]["content"] == ""
    check_final(r)

    history = user("Weather in Paris?") + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": calls[0]["function"]}]},
        {"role": "tool", "content": "18 C and sunny", "tool_name": "get_weather"}]
    r = chat(server.port, messages=history, tools=[WEATHER_TOOL], think=False,
             tern_debug_forced_output="It is 18 C and sunny.")
    assert r["message"]["content"] == "It is 18 C and sunny." and "tool_calls" not in r["message"]
    # The tool result reached the prompt: it is longer than the same history with an empty result.
    empty = history[:2] + [dict(history[2], content="")]
    without = chat(server.port, messages=empty, tools=[WEATHER_TOOL], think=False, tern_debug_forced_output="ok")
    assert r["prompt_eval_count"] > without["prompt_eval_count"]

    objects = stream(server.port, "/api/chat", {"model": MODEL, "messages": user("Weather?"), "think": False,
                                                "tools": [WEATHER_TOOL],
                                                "tern_debug_forced_output": "Let me check.\n\n" + CALL_XML})
    streamed = [c for o in objects for c in o["message"].get("tool_calls", [])]
    assert [c["function"]["arguments"] for c in streamed] == [{"city": "Paris", "days": 3}]
    assert "".join(o["message"]["content"] for o in objects) == "Let me check."
    # Without tools the call stays text.
    r = chat(server.port, messages=user("Weather?"), think=False, tern_debug_forced_output=CALL_XML)
    assert "tool_calls" not in r["message"] and "<tool_call>" in r["message"]["content"]


def test_num_predict_length_and_stop(server):
    r = chat(server.port, messages=user("Count"), think=False, options={"num_predict": 5},
             tern_debug_forced_output="word " * 50)
    check_final(r, "length")
    assert r["eval_count"] == 5
    r = chat(server.port, messages=user("Count"), think=False, options={"stop": ["STOP"], "num_predict": -1},
             tern_debug_forced_output="one two STOP three")
    assert r["message"]["content"] == "one two " and r["done_reason"] == "stop"


def test_names_and_unknown_model(server):
    for name in (MODEL, MODEL + ":latest", "qwen-local", "qwen-local:latest"):
        r = chat(server.port, model=name, messages=user("Hi"), think=False, tern_debug_forced_output="ok")
        assert r["model"] == name and r["message"]["content"] == "ok"
    # Another model's name is the served model, echoed as its id (a 404 with --strict-model-name:
    # test_api_defaults.py).
    r = chat(server.port, model="llama3:8b", messages=user("Hi"), think=False, tern_debug_forced_output="ok")
    assert r["model"] == MODEL and r["message"]["content"] == "ok"
    status, _, data = post_json(server.port, "/api/show", {"model": "llama3:8b"})
    assert status == 200 and data["model_info"]["general.basename"] == MODEL


def test_load_only_requests(server):
    r = chat(server.port, messages=[])
    assert r["done"] is True and r["done_reason"] == "load" and r["message"]["content"] == ""
    status, _, r = post_json(server.port, "/api/generate", {"model": MODEL})
    assert status == 200 and r["done_reason"] == "load" and r["response"] == ""


def test_tags_show_version_ps(server):
    status, _, tags = request("GET", server.port, "/api/tags")
    tags = json.loads(tags)
    assert status == 200
    names = [m["name"] for m in tags["models"]]
    assert names == [MODEL + ":latest", "qwen-local:latest"]
    for m in tags["models"]:
        assert m["model"] == m["name"] and RFC3339.match(m["modified_at"])
        assert m["size"] == 0  # the demo has no weight files
        assert re.fullmatch(r"[0-9a-f]{64}", m["digest"]) and m["digest"] == tags["models"][0]["digest"]
        assert m["details"]["family"] == "qwen3_5_moe" and m["details"]["format"] == "safetensors"
        assert set(m["details"]) >= {"parameter_size", "quantization_level", "families"}

    status, _, show = post_json(server.port, "/api/show", {"model": MODEL + ":latest"})
    assert status == 200
    assert show["capabilities"] == ["completion", "tools", "thinking", "vision"]  # the demo has a vision encoder
    assert show["model_info"]["qwen3_5_moe.context_length"] == 1024
    assert "<|im_start|>" in show["template"] and show["details"] == tags["models"][0]["details"]
    status, _, old = post_json(server.port, "/api/show", {"name": "qwen-local"})  # the older field name
    assert status == 200 and old["template"] == show["template"]

    status, _, version = request("GET", server.port, "/api/version")
    assert status == 200 and re.fullmatch(r"\d+\.\d+\.\d+.*", json.loads(version)["version"])

    status, _, ps = request("GET", server.port, "/api/ps")
    ps = json.loads(ps)
    assert status == 200 and len(ps["models"]) == 1
    p = ps["models"][0]
    assert p["name"] == MODEL + ":latest" and p["context_length"] == 1024 and p["digest"] == tags["models"][0]["digest"]
    assert {"size", "size_vram", "expires_at", "details"} <= set(p)


def test_bad_input_is_400_naming_the_field(server):
    good = {"model": MODEL, "messages": user("Hi"), "stream": False}
    cases = [
        ({"messages": user("Hi")}, "model"),
        (dict(good, model=7), "model"),
        (dict(good, messages="Hi"), "messages"),
        (dict(good, messages=[{"role": "robot", "content": "x"}]), "role"),
        (dict(good, messages=[{"role": "user", "content": ["x"]}]), "content"),
        (dict(good, messages=[{"role": "user", "content": "x", "images": ["aGk="]}]), "images"),
        (dict(good, stream="yes"), "stream"),
        (dict(good, think="maybe"), "think"),
        (dict(good, format="xml"), "format"),
        (dict(good, format={"type": "object", "properties": {"a": {"$ref": "http://x"}}}), "format"),
        (dict(good, options=[1]), "options"),
        (dict(good, options={"temperature": "hot"}), "options.temperature"),
        (dict(good, options={"temperature": 5}), "options.temperature"),
        (dict(good, options={"top_k": 1.5}), "options.top_k"),
        (dict(good, options={"num_predict": 0}), "options.num_predict"),
        (dict(good, options={"num_ctx": 100000}), "options.num_ctx"),
        (dict(good, options={"stop": 3}), "options.stop"),
        (dict(good, tools={"name": "x"}), "tools"),
        (dict(good, keep_alive=[]), "keep_alive"),
        (dict(good, messages=[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                   "arguments": [1]}}]}]),
         "arguments"),
    ]
    for body, word in cases:
        status, headers, data = post_json(server.port, "/api/chat", body)
        assert status == 400, (body, data)
        assert list(data) == ["error"] and word in data["error"], (word, data)
    for body, word in (({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
                       ({"model": MODEL, "prompt": "x", "images": ["aGk="]}, "images"),
                       ({"model": MODEL, "prompt": "x", "raw": "no"}, "raw")):
        status, _, data = post_json(server.port, "/api/generate", body)
        assert status == 400 and word in data["error"], (word, data)
    # Not JSON; NaN and infinities (not JSON either, or out of range once parsed).
    for text in ("{not json", '{"model": "%s", "messages": [], "options": {"temperature": NaN}}' % MODEL,
                 '{"model": "%s", "messages": [], "options": {"temperature": 1e999}}' % MODEL, "[1, 2]"):
        status, _, data = request("POST", server.port, "/api/chat", text)
        assert status == 400 and list(json.loads(data)) == ["error"], (text, data)
    status, headers, data = request("GET", server.port, "/api/chat")
    assert status == 405 and headers["allow"] == "POST" and list(json.loads(data)) == ["error"]
    status, _, data = request("GET", server.port, "/api/nothing")
    assert status == 404 and "/api/chat" in json.loads(data)["error"]
    assert server.alive()


def test_content_type_as_curl_sends_it(server):
    # `curl -d` sends application/x-www-form-urlencoded: accepted on /api/ (Ollama's documented calls), but not
    # from a web page (an Origin header), where the JSON media type is what keeps other sites out.
    body = {"model": MODEL, "messages": user("Hi"), "stream": False, "think": False, "tern_debug_forced_output": "ok"}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, data = request("POST", server.port, "/api/chat", body, headers=form)
    assert status == 200 and json.loads(data)["message"]["content"] == "ok"
    status, _, data = request("POST", server.port, "/api/chat", body, headers=dict(form, Origin="http://evil.example"))
    assert status == 415 and list(json.loads(data)) == ["error"]
    status, _, data = request("POST", server.port, "/v1/chat/completions", body, headers=form)
    assert status == 415


def test_client_disconnect_cancels(server):
    before = wait_idle(server.port)
    body = {"model": MODEL, "messages": user("Go"), "think": False, "tern_debug_forced_output": "word " * 400}
    s = RawStream(server.port, "/api/chat", body)
    s.read_until(b'"done":false')
    s.close()
    after = wait_idle(server.port)
    key = 'tern_queue_finished_total{outcome="cancelled"}'
    assert after.get(key, 0) == before.get(key, 0) + 1
    assert after["tern_completion_tokens_total"] - before["tern_completion_tokens_total"] < 400


def test_random_mutations_never_break_the_server(server, seed):
    rng = random.Random(seed)
    bodies = [{"model": MODEL, "messages": user("hi"), "stream": False, "think": False, "tools": [WEATHER_TOOL],
               "options": {"num_predict": 1, "temperature": 0.5, "stop": ["x"]}, "format": "json"},
              {"model": MODEL, "prompt": "hi", "raw": True, "stream": False, "options": {"num_predict": 1}}]
    for i in range(120):
        path = "/api/chat" if i % 2 == 0 else "/api/generate"
        b = mutate_body(rng, json.dumps(bodies[i % 2]).encode())
        status, headers, data = request("POST", server.port, path, b, timeout=120)
        assert status < 500, (b, status, data[:200])
        text = data.decode("utf-8", errors="replace")
        if status == 200 and headers["content-type"] == "application/x-ndjson":  # a mutated "stream": false
            objects = [json.loads(line) for line in text.splitlines()]
            assert objects[-1]["done"] is True, text
            continue
        body = json.loads(text)
        assert ("error" in body) == (status >= 400), (b, status, body)
        if status >= 400:
            assert list(body) == ["error"], body
    assert queue_balance(wait_idle(server.port)) == 0
    assert server.alive()


def test_api_key_errors_are_ollama_shaped(tern_bin):
    s = Server(tern_bin, "--api-key", "sekrit", "--ctx-size", "256")
    try:
        status, _, data = request("GET", s.port, "/api/tags")
        assert status == 401 and list(json.loads(data)) == ["error"]
        status, _, data = request("GET", s.port, "/api/tags", headers={"Authorization": "Bearer sekrit"})
        assert status == 200 and json.loads(data)["models"][0]["name"] == MODEL + ":latest"
    finally:
        s.stop()
