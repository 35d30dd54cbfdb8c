"""Malformed request bodies against tern serve --demo: bad JSON, wrong types, invalid UTF-8, NaN, huge numbers,
deep nesting. Every one must get a 4xx JSON error in OpenAI's shape, and the server must keep serving.
Bounded: a few hundred small requests on loopback."""
import json
import random

import pytest

from test_server_helpers import Server, mutate_body, post_json, queue_balance, request, wait_idle

BASE = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0.5, "stop": ["x"]}

WRONG = {  # field -> values of a wrong type or out of range (each must be refused)
    "messages": [None, 1, "hi", [], [1], [{"role": 1, "content": "x"}], [{"role": "user"}],
                 [{"role": "robot", "content": "x"}], [{"role": "user", "content": {"a": 1}}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                 [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1,2]"}}]}]],
    "temperature": ["hot", -1, 2.5, True, [0.5], {"v": 1}, 1e308],
    "top_p": [0, -0.1, 1.01, "x"],
    "top_k": [1.5, "5", -2],
    "min_p": [2, -1],
    "max_tokens": [-1, 0, 1.5, "10", 2 ** 64, 10 ** 30, True],
    "max_completion_tokens": [-5, "many"],
    "presence_penalty": [3, "x"],
    "frequency_penalty": [-3, [1]],
    "repetition_penalty": [0, -1, "x"],
    "seed": [1.5, "7", [1]],
    "stop": [5, [1], ["a", "b", "c", "d", "e"], {"a": "b"}],
    "logprobs": ["yes", 1],
    "top_logprobs": [21, -1, "3"],
    "n": [2, 0, "1"],
    "stream": ["true", 1],
    "stream_options": ["x", {"include_usage": "yes"}],
    "logit_bias": [[1], {"x": 1}, {"5": 1000}, {"-1": 1}, {"99999999999": 1}, {"5": "a"}],
    "tools": ["x", [1], [{"type": "function"}], [{"type": "function", "function": {"name": ""}}]],
    "tool_choice": ["sometimes", 5, {"type": "function"}],
    "response_format": [{"type": "xml"}, {"type": "json_schema", "json_schema": {}}, "json", {"type": 1},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}],
    "chat_template_kwargs": ["x", [1], {"enable_thinking": "no"}],
    "reasoning_effort": ["extreme", 5],
    "model": [5, ["x"]],  # any name is served (--strict-model-name: test_api_defaults.py)
    "tern_debug_forced_output": [5],
}

RAW_BODIES = [
    b"", b"{", b"}", b"[]", b"null", b"42", b'"text"', b"{'single': 'quotes'}", b'{"messages": [}',
    b'{"messages":[{"role":"user","content":"\xff\xfe\xfd"}]}',               # invalid UTF-8
    b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}',               # a UTF-8-encoded surrogate
    b'{"messages":[{"role":"user","content":"ok"}],"temperature":NaN}',
    b'{"messages":[{"role":"user","content":"ok"}],"temperature":Infinity}',
    b'{"messages":[{"role":"user","content":"ok"}],"temperature":-Infinity}',
    b'{"messages":[{"role":"user","content":"ok"}],"temperature":1e400}',
    b'{"messages":[{"role":"user","content":"ok"}],"max_tokens":1e400}',
    b'{"messages":[{"role":"user","content":"ok"}],"max_tokens":123456789012345678901234567890}',
    b'{"messages":[{"role":"user","content":"ok"}],"seed":1e30}',
    b'{"messages":[{"role":"user","content":"ok"}]}garbage',
    b'{"messages":[{"role":"user","content":"ok"}],"messages":5}',  # duplicate key: the last one wins
    b'{"messages":' + b"[" * 100000 + b"]" * 100000 + b"}",               # deep nesting
    b'{"messages":[{"role":"user","content":"' + b"[" * 5000 + b'"}],"x":' + b"{\"a\":" * 5000 + b"1" + b"}" * 5000 + b"}",
    b"\x00\x01\x02\x03",
]


@pytest.fixture(scope="module")
def server(tern_bin):
    s = Server(tern_bin, "--ctx-size", "256", "-q")
    yield s
    s.stop()


def check_error(port, path, body, what):
    status, headers, data = request("POST", port, path, body, timeout=60)
    assert 400 <= status < 500, f"{what}: status {status}: {data[:200]!r}"
    assert headers.get("content-type", "").startswith("application/json"), what
    err = json.loads(data)["error"]
    assert isinstance(err["message"], str) and err["message"], what
    assert set(err) >= {"message", "type", "param", "code"}, what


def test_wrong_types_and_ranges(server):
    for field, values in WRONG.items():
        for v in values:
            body = dict(BASE)
            body[field] = v
            check_error(server.port, "/v1/chat/completions", json.dumps(body), f"{field}={v!r}")
    for body in ({"prompt": 5}, {"prompt": []}, {"prompt": [[1], [2]]}, {"prompt": "x", "echo": "yes"},
                 {"prompt": "x", "logprobs": 50}, {"prompt": [-1]}, {"prompt": "x", "best_of": 2}):
        check_error(server.port, "/v1/completions", json.dumps(body), f"completions {body!r}")


def test_raw_malformed_bodies(server):
    for i, body in enumerate(RAW_BODIES):
        check_error(server.port, "/v1/chat/completions", body, f"raw body {i}: {body[:60]!r}")
        check_error(server.port, "/v1/completions", body, f"raw completions body {i}")


def test_random_mutations_never_break_the_server(server, seed):
    rng = random.Random(seed)
    text = json.dumps(BASE).encode()
    for _ in range(150):
        b = mutate_body(rng, text)
        status, headers, data = request("POST", server.port, "/v1/chat/completions", b, timeout=60)
        assert status < 500, (b, status, data[:200])
        body = json.loads(data)  # always JSON: an error or a completion
        assert ("error" in body) == (status >= 400), (b, status, body)


def test_still_serving_after_fuzz(server):
    status, _, body = post_json(server.port, "/v1/chat/completions", BASE)
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    assert request("GET", server.port, "/health")[0] == 200
    assert queue_balance(wait_idle(server.port)) == 0
    assert server.alive()
