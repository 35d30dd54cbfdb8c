"""A thinking budget through the server: `thinking_budget` on /v1/chat/completions (a tern extension), Anthropic's
`thinking.budget_tokens` on /v1/messages, and `tern serve --thinking-budget N` as the default for requests without one. Once the budget is spent inside the open <think> block, the server forces a
short note and </think>, and the answer follows. The demo model has random weights, so it practically never closes
its reasoning on its own within these few tokens: the note's presence and place are what the tests check (the exact
token counting is covered by the generator's unit tests).
"""
import json

import anthropic
import pytest

from test_server_helpers import Server, demo_server_fixture, named_sse_events, post_json, request, sse_events

MODEL = "tern-demo-random-weights"
NOTE = "The thinking budget is spent; time to answer with what I have."

server = demo_server_fixture("--ctx-size", "1024", "--debug-allow-forced-output")


def chat(server, seed, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 40,
            "seed": seed, **extra}
    status, _, j = post_json(server.port, "/v1/chat/completions", body, timeout=120)
    assert status == 200, j
    return j


def test_budget_zero_closes_the_reasoning_at_once(server, seed):
    j = chat(server, seed, thinking_budget=0)
    assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    m = j["choices"][0]["message"]
    assert m["reasoning_content"].strip() == NOTE  # only the note: no reasoning token was sampled
    assert m["content"]  # the answer follows the reasoning


def test_budget_cuts_the_reasoning_and_the_answer_follows(server, seed):
    j = chat(server, seed, thinking_budget=6, max_tokens=80)
    assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6  # the note is not counted as reasoning
    m = j["choices"][0]["message"]
    reasoning = m["reasoning_content"]
    assert reasoning.rstrip().endswith(NOTE), reasoning
    assert reasoning.rstrip()[: -len(NOTE)].strip(), "six reasoning tokens come before the note"
    assert m["content"], j
    # Without a budget the same request reasons on past the note's place (max_tokens ends it inside <think>).
    free = chat(server, seed, max_tokens=40)["choices"][0]["message"]
    assert NOTE not in (free.get("reasoning_content") or "") + (free.get("content") or "")


def test_budget_streams_the_same(server, seed):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30, "seed": seed,
            "thinking_budget": 3, "stream": True}
    status, _, data = request("POST", server.port, "/v1/chat/completions", body, timeout=120)
    assert status == 200
    events, done = sse_events(data)
    assert done
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content") or "" for e in events if e["choices"])
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert reasoning.rstrip().endswith(NOTE) and content


def test_budget_is_ignored_without_reasoning(server, seed):
    j = chat(server, seed, thinking_budget=0, chat_template_kwargs={"enable_thinking": False})
    m = j["choices"][0]["message"]
    assert NOTE not in (m.get("content") or "") and not m.get("reasoning_content")


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_bad_budget_is_a_400_naming_the_field(server, bad):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "thinking_budget": bad}
    if bad is None:
        body["thinking_budget"] = None  # null: as if absent
        status, _, j = post_json(server.port, "/v1/chat/completions", body)
        assert status == 200, j
        return
    status, _, j = post_json(server.port, "/v1/chat/completions", body)
    assert status == 400 and "thinking_budget" in json.dumps(j), j


def test_anthropic_budget_tokens_is_enforced(server):
    c = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
    try:
        m = c.messages.create(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "Hello"}],
                              thinking={"type": "enabled", "budget_tokens": 5})
    finally:
        c.close()
    kinds = [b.type for b in m.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    assert m.content[0].thinking.rstrip().endswith(NOTE), m.content[0].thinking


def test_server_default_budget(tern_bin, seed):
    s = Server(tern_bin, "--ctx-size", "512", "--thinking-budget", "0")
    try:
        status, _, body = request("GET", s.port, "/props")
        assert status == 200 and json.loads(body)["default_generation_settings"]["thinking_budget"] == 0
        m = chat(s, seed)["choices"][0]["message"]  # no budget in the request: the server's applies
        assert m["reasoning_content"].strip() == NOTE
        m = chat(s, seed, thinking_budget=4, max_tokens=30)["choices"][0]["message"]  # the request's wins
        assert m["reasoning_content"].rstrip().endswith(NOTE) and m["reasoning_content"].strip() != NOTE
        # The Responses API has no budget field: the server's applies there too.
        status, _, r = post_json(s.port, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 30,
                                                           "temperature": 0}, timeout=120)
        assert status == 200, r
        reasoning = [i for i in r["output"] if i["type"] == "reasoning"]
        assert reasoning and reasoning[0]["content"][0]["text"].strip() == NOTE, r["output"]
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    finally:
        s.stop()


def tokenize(server, text):
    status, _, body = post_json(server.port, "/tokenize", {"content": text})
    assert status == 200, body
    return body["tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_mark_a_cut_thought_and_complete(tern_bin, stream):
    """--reasoning-budget (llama.cpp's name of --thinking-budget) 0 closes the thought at once. On the Responses API
    the cut thought is a reasoning item with status "incomplete", and the response is "completed" because the answer
    after it ended normally (the forced output runs out: finish stop)."""
    s = Server(tern_bin, "--ctx-size", "512", "--reasoning-budget", "0", "--debug-allow-forced-output")
    try:
        # The budget's close tokens take the place of the forced output's first tokens: pad with as many.
        close = len(tokenize(s, "\n\n" + NOTE + "\n</think>\n\n"))
        pad, answer = " x" * close, " The answer."
        assert tokenize(s, pad + answer) == tokenize(s, pad) + tokenize(s, answer) and len(tokenize(s, pad)) == close
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 60, "stream": stream,
                "tern_debug_forced_output": pad + answer}
        status, _, data = request("POST", s.port, "/v1/responses", body, timeout=120)
        assert status == 200, data
        if stream:
            events = [payload for _, payload in named_sse_events(data)]
            done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
            assert done[0]["type"] == "reasoning" and done[0]["status"] == "incomplete", done
            assert events[-1]["type"] == "response.completed", events[-1]
            r = events[-1]["response"]
        else:
            r = json.loads(data)
        assert r["status"] == "completed" and r["incomplete_details"] is None, r
        kinds = [(i["type"], i["status"]) for i in r["output"]]
        assert kinds == [("reasoning", "incomplete"), ("message", "completed")], kinds
        assert r["output"][0]["content"][0]["text"].strip() == NOTE
        assert r["output"][1]["content"][0]["text"].strip() == "The answer."
    finally:
        s.stop()


def test_responses_thought_closed_by_the_model_is_completed(server):
    # No budget at all: the model's own </think> leaves the reasoning item completed.
    status, _, r = post_json(server.port, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 30,
                                                            "tern_debug_forced_output": "Hm.</think>\n\nYes."})
    assert status == 200, r
    assert [(i["type"], i["status"]) for i in r["output"]] == [("reasoning", "completed"), ("message", "completed")]
    assert r["status"] == "completed"


def test_a_think_tag_in_the_answer_is_text(server, seed):
    # Thinking off, a JSON answer whose string holds "<think>": nothing is counted as reasoning, nothing forced.
    answer = '{"s": "the tag <think> opens one and more words follow here"}'
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    j = chat(server, seed, thinking_budget=2, max_tokens=60, chat_template_kwargs={"enable_thinking": False},
             response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
             tern_debug_forced_output=answer)
    assert j["choices"][0]["message"]["content"] == answer
    assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
