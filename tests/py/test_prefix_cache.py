"""Multi-turn prefix reuse through `tern serve --demo` and the official openai client: the second turn of a
conversation resumes most of the first turn's prompt (usage.prompt_tokens_details.cached_tokens) and gives the same
greedy tokens and log-probabilities as a server without the cache; interleaved conversations both resume;
snapshots evicted to host memory still resume; /metrics counts hits, misses, reused tokens and bytes.

The conversations' texts are drawn from a fresh seed each run (printed; TERN_TEST_SEED repeats it).
"""
import random

import openai

from test_server_helpers import demo_server_fixture, metrics

MODEL = "tern-demo-random-weights"
EOS_BAN = {"151645": -100, "151643": -100}  # <|im_end|>, <|endoftext|>: every reply has max_tokens tokens
WORDS = ("river stone lantern copper meadow signal harbor velvet orbit canyon pillar ember quartz willow "
         "compass thunder saffron glacier marble falcon").split()
# Resumed and fresh runs chunk the prefill differently (chunked Gated DeltaNet vs token steps): their logits agree
# to rounding, not bit for bit.
LOGPROB_TOL = 1e-4


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


cached = demo_server_fixture("--ctx-size", "2048")
fresh = demo_server_fixture("--ctx-size", "2048", "--no-prefix-cache")
host_only = demo_server_fixture("--ctx-size", "2048", "--cache-gpu-mb", "0")


def ask(client, messages, max_tokens=8, stream=False):
    kw = dict(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=0,
              logit_bias=EOS_BAN, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, [(t.token, t.logprob) for t in r.choices[0].logprobs.content], r.usage
    content, lps, usage = "", [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            content += c.delta.content or ""
            if c.logprobs and c.logprobs.content:
                lps += [(t.token, t.logprob) for t in c.logprobs.content]
    return content, lps, usage


def same_generation(got, want):
    assert [t for t, _ in got] == [t for t, _ in want]
    for (tok, a), (_, b) in zip(got, want):
        assert abs(a - b) <= LOGPROB_TOL, (tok, a, b)


def conversation(rng, system_words=220):
    return [{"role": "system", "content": text(rng, system_words)}, {"role": "user", "content": text(rng, 12)}]


def cached_tokens(usage):
    return usage.prompt_tokens_details.cached_tokens


def test_second_turn_reuses_the_first(cached, fresh, seed):
    rng = random.Random(seed)
    c, f = make_client(cached), make_client(fresh)
    before = metrics(cached.port)
    msgs = conversation(rng)
    reply1, lp1, u1 = ask(c, msgs)
    assert cached_tokens(u1) == 0
    _, lp1_fresh, _ = ask(f, msgs)
    same_generation(lp1, lp1_fresh)

    msgs2 = msgs + [{"role": "assistant", "content": reply1}, {"role": "user", "content": text(rng, 10)}]
    reply2, lp2, u2 = ask(c, msgs2)
    assert cached_tokens(u2) >= 0.9 * u1.prompt_tokens, (cached_tokens(u2), u1.prompt_tokens)
    assert cached_tokens(u2) < u2.prompt_tokens
    reply2_fresh, lp2_fresh, u2_fresh = ask(f, msgs2)
    assert cached_tokens(u2_fresh) == 0  # --no-prefix-cache
    assert u2_fresh.prompt_tokens == u2.prompt_tokens
    same_generation(lp2, lp2_fresh)
    assert reply2 == reply2_fresh

    # Turn 3, streamed: usage in the last chunk reports the reuse too.
    msgs3 = msgs2 + [{"role": "assistant", "content": reply2}, {"role": "user", "content": text(rng, 10)}]
    _, lp3, u3 = ask(c, msgs3, stream=True)
    assert cached_tokens(u3) >= 0.9 * u2.prompt_tokens
    _, lp3_fresh, _ = ask(f, msgs3)
    same_generation(lp3, lp3_fresh)

    after = metrics(cached.port)
    assert after["tern_prefix_cache_enabled"] == 1
    assert after["tern_prefix_cache_hits_total"] - before["tern_prefix_cache_hits_total"] == 2
    assert after["tern_prefix_cache_misses_total"] - before["tern_prefix_cache_misses_total"] == 1
    assert (after["tern_prefix_cache_tokens_reused_total"] - before["tern_prefix_cache_tokens_reused_total"]
            == cached_tokens(u2) + cached_tokens(u3))
    assert after['tern_prefix_cache_bytes{where="gpu"}'] > 0
    assert after["tern_prefix_cache_snapshots"] > 0
    assert metrics(fresh.port)["tern_prefix_cache_enabled"] == 0


def test_interleaved_conversations_both_hit(cached, fresh, seed):
    rng = random.Random(seed ^ 1)
    c, f = make_client(cached), make_client(fresh)
    a, b = conversation(rng), conversation(rng)
    ra, _, ua = ask(c, a)
    rb, _, ub = ask(c, b)
    a2 = a + [{"role": "assistant", "content": ra}, {"role": "user", "content": text(rng, 9)}]
    b2 = b + [{"role": "assistant", "content": rb}, {"role": "user", "content": text(rng, 9)}]
    _, lpa, ua2 = ask(c, a2)
    _, lpb, ub2 = ask(c, b2)
    assert cached_tokens(ua2) >= 0.9 * ua.prompt_tokens, (cached_tokens(ua2), ua.prompt_tokens)
    assert cached_tokens(ub2) >= 0.9 * ub.prompt_tokens, (cached_tokens(ub2), ub.prompt_tokens)
    same_generation(lpa, ask(f, a2)[1])
    same_generation(lpb, ask(f, b2)[1])
    assert metrics(cached.port)["tern_prefix_cache_sessions"] >= 2


def test_snapshots_in_host_memory_still_resume(host_only, fresh, seed):
    rng = random.Random(seed ^ 2)
    c, f = make_client(host_only), make_client(fresh)
    msgs = conversation(rng)
    reply1, _, u1 = ask(c, msgs)
    m = metrics(host_only.port)
    assert m['tern_prefix_cache_bytes{where="gpu"}'] == 0
    assert m['tern_prefix_cache_bytes{where="host"}'] > 0
    assert m["tern_prefix_cache_snapshots_to_host_total"] > 0
    msgs2 = msgs + [{"role": "assistant", "content": reply1}, {"role": "user", "content": text(rng, 10)}]
    _, lp2, u2 = ask(c, msgs2)
    assert cached_tokens(u2) >= 0.9 * u1.prompt_tokens
    same_generation(lp2, ask(f, msgs2)[1])
