"""Speculative decoding (issue 32) against tern serve --demo (CPU): the same answers with `--speculative ngram` as
with `--speculative off`, over many prompts (random and repetitive), with the client's `prediction` (a corrupted
copy of the answer, so that drafts are accepted and rejected: the test asserts some are accepted), in batches (--parallel), under a grammar,
with stop strings and max_tokens, seeded sampling; usage's accepted/rejected prediction tokens and /metrics; a bad
`prediction` is a 400; a client that hangs up mid-stream leaves a healthy server. `--speculative mtp` (the demo
model's MTP head drafts, its weights random): the same answers, alone, with a prediction, in batches and across the
turns of a conversation (the head's cache resumed with the prefix cache).

Prompts come from a generator seeded afresh each run (printed; TERN_TEST_SEED repeats a run).
"""
import concurrent.futures
import json
import random

import pytest

from test_server_helpers import RawStream, Server, metrics, post_json, wait_idle

WORDS = ["alpha", "beta", "gamma", "delta", "copy", "this", "line", "def", "return", "x", "=", "(", ")", "1", "\n"]


@pytest.fixture(scope="module")
def servers(tern_bin):
    off = Server(tern_bin, "--ctx-size", "2048", "--parallel", "4", "--speculative", "off")
    on = Server(tern_bin, "--ctx-size", "2048", "--parallel", "4", "--speculative", "ngram", "--draft-max", "6")
    yield off, on
    off.stop()
    on.stop()


def prompts(rng: random.Random, n: int):
    out = []
    for i in range(n):
        if i % 2 == 0:  # a passage repeated: something to copy
            phrase = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            out.append("Repeat after me: " + " ".join([phrase] * rng.randint(2, 5)))
        else:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))))
    return out


def chat(server, content, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 48,
            "chat_template_kwargs": {"enable_thinking": False}}
    body.update(extra)
    status, _, r = post_json(server.port, "/v1/chat/completions", body, timeout=600)
    assert status == 200, r
    return r


def answer(r):
    m = r["choices"][0]["message"]
    return m.get("content"), m.get("reasoning_content"), m.get("tool_calls"), r["choices"][0]["finish_reason"]


def details(r):
    return r["usage"]["completion_tokens_details"]


def corrupt(rng: random.Random, text: str) -> str:
    """The text with a word of nonsense put in every few dozen characters: drafts that pass for a while, then fail."""
    out, i = [], 0
    while i < len(text):
        n = rng.randint(8, 40)
        out.append(text[i: i + n])
        out.append(rng.choice([" zebra", "§", " 42", "\n\n"]))
        i += n
    return "".join(out)


def test_greedy_answers_are_the_same_with_drafts(servers, seed):
    """Random weights seldom repeat themselves, so beside the n-gram drafts each prompt also gets a prediction: its
    answer with nonsense put in (drafts accepted, then rejected, at every place of a verify step)."""
    off, on = servers
    rng = random.Random(seed)
    accepted = rejected = 0
    for p in prompts(rng, 40):
        a = chat(off, p)
        assert details(a)["accepted_prediction_tokens"] == 0 and details(a)["rejected_prediction_tokens"] == 0
        content = a["choices"][0]["message"]["content"] or p
        for extra in ({}, {"prediction": {"type": "content", "content": corrupt(rng, content)}}):
            b = chat(on, p, **extra)
            assert answer(a) == answer(b), (p, extra)
            assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
            accepted += details(b)["accepted_prediction_tokens"]
            rejected += details(b)["rejected_prediction_tokens"]
    print(f"drafts accepted {accepted}, rejected {rejected}")
    assert accepted > 0, "no draft was accepted: the comparison proves little"


def test_batched_requests_with_drafts_give_the_answers_alone(servers, seed):
    off, on = servers
    rng = random.Random(seed + 1)
    ps = prompts(rng, 12)
    alone = [answer(chat(off, p)) for p in ps]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: answer(chat(on, p)), ps))
    assert together == alone


def test_prediction_is_drafted_and_verified(servers, seed):
    off, on = servers
    rng = random.Random(seed + 2)
    for p in prompts(rng, 6):
        a = chat(off, p, max_tokens=64)
        content = a["choices"][0]["message"]["content"]
        if not content:
            continue
        # The right prediction, a wrong one, and one as text parts.
        for pred in (content, content[: len(content) // 2] + " nothing like it " + content[len(content) // 2:],
                     [{"type": "text", "text": content[:10]}, {"type": "text", "text": content[10:]}]):
            b = chat(on, p, max_tokens=64, prediction={"type": "content", "content": pred})
            assert answer(a) == answer(b)
        right = chat(on, p, max_tokens=64, prediction={"type": "content", "content": content})
        assert details(right)["accepted_prediction_tokens"] > 0
        # With drafts off the prediction is ignored.
        ignored = chat(off, p, max_tokens=64, prediction={"type": "content", "content": content})
        assert answer(ignored) == answer(a) and details(ignored)["accepted_prediction_tokens"] == 0


def test_stop_strings_and_max_tokens_land_where_they_would(servers, seed):
    off, on = servers
    rng = random.Random(seed + 3)
    for p in prompts(rng, 10):
        full = chat(off, p, max_tokens=64)["choices"][0]["message"]["content"] or ""
        for max_tokens in (1, 2, 5, 17):
            assert answer(chat(off, p, max_tokens=max_tokens)) == answer(chat(on, p, max_tokens=max_tokens))
        if len(full) > 12:
            at = rng.randrange(2, len(full) - 4)
            stop = full[at: at + rng.randint(1, 4)]
            a, b = chat(off, p, max_tokens=64, stop=[stop]), chat(on, p, max_tokens=64, stop=[stop])
            assert answer(a) == answer(b), stop
            assert stop not in (b["choices"][0]["message"]["content"] or "")


def test_grammar_with_drafts(servers, seed):
    off, on = servers
    rng = random.Random(seed + 4)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 6}},
              "required": ["name", "items"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    for p in prompts(rng, 6):
        a = chat(off, p, max_tokens=120, response_format=fmt)
        b = chat(on, p, max_tokens=120, response_format=fmt,
                 prediction={"type": "content", "content": '{"name": "copy", "items": [1, 2, 3]}'})
        assert answer(a) == answer(b)
        if a["choices"][0]["finish_reason"] == "stop":
            json.loads(a["choices"][0]["message"]["content"])


def test_seeded_sampling_draws_the_same_tokens(servers, seed):
    off, on = servers
    rng = random.Random(seed + 5)
    for i, p in enumerate(prompts(rng, 8)):
        extra = {"temperature": 0.8, "top_p": 0.95, "seed": seed + i, "max_tokens": 40}
        assert answer(chat(off, p, **extra)) == answer(chat(on, p, **extra))


def test_bad_prediction_is_a_400_naming_the_field(servers):
    _, on = servers
    for pred, param in (("text", "prediction"), ({"type": "image", "content": "x"}, "prediction.type"),
                        ({"type": "content"}, "prediction.content"), ({"type": "content", "content": 3},
                                                                      "prediction.content"),
                        ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                         "prediction.content[0]")):
        status, _, r = post_json(on.port, "/v1/chat/completions",
                                 {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prediction": pred})
        assert status == 400, (pred, r)
        assert r["error"]["param"] == param, (pred, r)


def test_metrics_count_drafts_and_a_hangup_mid_stream_is_clean(servers, seed):
    _, on = servers
    rng = random.Random(seed + 6)
    p = prompts(rng, 1)[0]
    s = RawStream(on.port, "/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 400,
                   "stream": True, "chat_template_kwargs": {"enable_thinking": False},
                   "prediction": {"type": "content", "content": p * 4}})
    s.read_events(4)
    s.close()
    m = wait_idle(on.port)
    assert m["tern_draft_tokens_accepted_total"] > 0
    assert m["tern_draft_tokens_total"] >= m["tern_draft_tokens_accepted_total"]
    assert m["tern_verify_steps_total"] > 0
    assert on.alive()
    chat(on, "still here?")


@pytest.fixture(scope="module")
def mtp_server(tern_bin):
    server = Server(tern_bin, "--ctx-size", "2048", "--parallel", "4", "--speculative", "mtp", "--draft-max", "4")
    yield server
    server.stop()


def test_mtp_drafts_give_the_same_answers(servers, mtp_server, seed):
    """The demo model's head is random, so its drafts are mostly rejected: the corrupted prediction gives accepted
    ones, the head's drafts fill the steps between."""
    off, _ = servers
    rng = random.Random(seed + 7)
    before = metrics(mtp_server.port)["tern_draft_tokens_total"]
    accepted = 0
    for p in prompts(rng, 16):
        a = chat(off, p)
        assert answer(chat(mtp_server, p)) == answer(a), p
        content = a["choices"][0]["message"]["content"] or p
        b = chat(mtp_server, p, prediction={"type": "content", "content": corrupt(rng, content)})
        assert answer(b) == answer(a), p
        accepted += details(b)["accepted_prediction_tokens"]
    assert metrics(mtp_server.port)["tern_draft_tokens_total"] > before, "nothing was drafted"
    assert accepted > 0, "no draft was accepted: the comparison proves little"


def test_mtp_drafts_in_batches_and_conversations(servers, mtp_server, seed):
    off, _ = servers
    rng = random.Random(seed + 8)
    ps = prompts(rng, 8)
    alone = [answer(chat(off, p)) for p in ps]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: answer(chat(mtp_server, p)), ps))
    assert together == alone
    # A conversation over three turns: each turn resumes the session (and its head's cache) from the prefix cache.
    histories = {off.port: [], mtp_server.port: []}
    for turn in range(3):
        got = []
        for server in (off, mtp_server):
            history = histories[server.port]
            history.append({"role": "user", "content": ps[turn]})
            status, _, r = post_json(server.port, "/v1/chat/completions",
                                     {"model": "m", "messages": history, "temperature": 0, "max_tokens": 24,
                                      "chat_template_kwargs": {"enable_thinking": False}}, timeout=600)
            assert status == 200, r
            history.append({"role": "assistant", "content": r["choices"][0]["message"]["content"] or ""})
            got.append(answer(r))
        assert got[0] == got[1], turn
        if turn > 0:
            assert r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) > 0, r["usage"]
