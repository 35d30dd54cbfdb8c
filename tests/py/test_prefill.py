"""A last assistant message is continued (a prefill), not closed with a new turn after it: on /v1/chat/completions
(as llama.cpp and Anthropic's API read it), /v1/messages and Ollama's /api/chat. The prompt is the chat template's
rendering of that turn cut where the message's text ends, and the reply holds only what the model adds.

The demo model has random weights: the continuation is forced with --debug-allow-forced-output, and the prompt is
checked by its token count against /tokenize of the text it must be.
"""
import json

import pytest

from test_server_helpers import demo_server_fixture, post_json, request, sse_events

MODEL = "tern-demo-random-weights"
USER_TURN = "<|im_start|>user\nWhat is six times seven?<|im_end|>\n"

server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "512")


def tokens_of(server, text):
    status, _, body = post_json(server.port, "/tokenize", {"content": text, "parse_special": True})
    assert status == 200, body
    return len(body["tokens"])


def chat(server, last, forced, **extra):
    body = {"model": MODEL, "max_tokens": 20, "tern_debug_forced_output": forced,
            "messages": [{"role": "user", "content": "What is six times seven?"}] + ([last] if last else []), **extra}
    status, _, j = post_json(server.port, "/v1/chat/completions", body)
    assert status == 200, j
    return j


def test_chat_continues_the_assistant_text(server):
    j = chat(server, {"role": "assistant", "content": "The answer is"}, " 42.")
    m = j["choices"][0]["message"]
    assert m["content"] == " 42." and not m.get("reasoning_content"), m  # only the continuation
    assert j["choices"][0]["finish_reason"] == "stop"
    # The prompt: the turn as the template renders it (thinking closed, empty), up to the message's last byte.
    expected = USER_TURN + "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is"
    assert j["usage"]["prompt_tokens"] == tokens_of(server, expected)
    # Trailing whitespace is the client's: kept.
    j = chat(server, {"role": "assistant", "content": "The answer is "}, "42.")
    assert j["usage"]["prompt_tokens"] == tokens_of(server, expected + " ")
    assert j["choices"][0]["message"]["content"] == "42."


def test_chat_prefill_streams_the_same(server):
    body = {"model": MODEL, "max_tokens": 20, "stream": True, "tern_debug_forced_output": " 42, of course.",
            "messages": [{"role": "user", "content": "What is six times seven?"},
                         {"role": "assistant", "content": "The answer is"}]}
    status, _, data = request("POST", server.port, "/v1/chat/completions", body)
    assert status == 200
    events, done = sse_events(data)
    assert done
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == " 42, of course."
    assert not any(d.get("reasoning_content") for d in deltas)


def test_chat_continues_the_thought(server):
    # No content but reasoning_content: the model goes on thinking, then answers.
    j = chat(server, {"role": "assistant", "content": "", "reasoning_content": "Six sevens are"},
             " forty-two.</think>\n\n42")
    m = j["choices"][0]["message"]
    assert m["reasoning_content"].strip() == "forty-two." and m["content"] == "42", m
    assert j["usage"]["prompt_tokens"] == tokens_of(server, USER_TURN + "<|im_start|>assistant\n<think>\nSix sevens are")


def test_empty_assistant_message_starts_the_reply(server):
    plain = chat(server, None, "x")
    empty = chat(server, {"role": "assistant", "content": ""}, "x")
    assert empty["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert plain["usage"]["prompt_tokens"] == tokens_of(server, USER_TURN + "<|im_start|>assistant\n<think>\n")


def test_what_cannot_be_continued_is_a_400(server):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases = [
        ({"role": "assistant", "content": "", "tool_calls": [call]}, {}, "tool calls"),
        ({"role": "assistant", "content": "{\"a\":"}, {"response_format": {"type": "json_object"}}, "constrained"),
    ]
    for last, extra, words in cases:
        body = {"model": MODEL, "max_tokens": 4, **extra,
                "messages": [{"role": "user", "content": "hi"}, last]}
        status, _, j = post_json(server.port, "/v1/chat/completions", body)
        assert status == 400 and j["error"]["param"] == "messages", j
        assert words in j["error"]["message"], j


def test_anthropic_prefill(server):
    body = {"model": MODEL, "max_tokens": 20, "tern_debug_forced_output": " 42.",
            "messages": [{"role": "user", "content": "What is six times seven?"},
                         {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}]}
    status, _, m = post_json(server.port, "/v1/messages", body)
    assert status == 200, m
    assert m["content"] == [{"type": "text", "text": " 42."}], m
    assert m["stop_reason"] == "end_turn"
    expected = USER_TURN + "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is"
    assert m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"] == tokens_of(server, expected)


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_continues_the_assistant_message(server, stream):
    body = {"model": MODEL, "stream": stream, "tern_debug_forced_output": " 42.",
            "messages": [{"role": "user", "content": "What is six times seven?"},
                         {"role": "assistant", "content": "The answer is"}]}
    status, _, data = request("POST", server.port, "/api/chat", body)
    assert status == 200, data
    objects = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    assert "".join(o["message"]["content"] for o in objects) == " 42.", objects
    assert objects[-1]["done"] and objects[-1]["prompt_eval_count"] == tokens_of(
        server, USER_TURN + "<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is")
