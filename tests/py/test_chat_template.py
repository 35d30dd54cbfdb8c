"""`tern template` against transformers' chat-template renderer, byte for byte.

A fresh random corpus of chat-completion bodies (seeded; the seed is printed) is rendered by transformers
(`render_jinja_template`, what `apply_chat_template` calls, with the same message normalisation) and by
`tern template -m DIR` for each template in tests/data/templates. Outputs must be identical; where transformers
raises (raise_exception, bad input), tern must fail with status 1 and, for raise_exception, the same message.
"""
import copy
import json
import pathlib
import random
import subprocess

import pytest

transformers_ctu = pytest.importorskip("transformers.utils.chat_template_utils")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "data" / "templates"
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
N_CASES = 70

WORDS = ["hello", "world", "Bonjour", "naïve", "café", "中文", "テスト", "emoji 😀", "Ελληνικά", "ẞtraße", "tab\there",
         "quote \"x\"", "it's", "back\\slash", "<b>html</b>", "e\u0301", "{{ not jinja }}", "{% raw %}", "50%", "a\nb"]
EDGES = ["", " ", "\n", "\n\n", "\u3000", "\u00a0", "\t", "  \n "]


def text(rng, lo=1, hi=8):
    s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    if rng.random() < 0.3:
        s = rng.choice(EDGES) + s + rng.choice(EDGES)
    return s


def json_value(rng, depth=0):
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "obj"] if depth < 2 else ["str", "int", "float", "bool"])
    if kind == "str":
        return text(rng, 1, 3)
    if kind == "int":
        return rng.choice([0, 1, -7, 42, 10 ** 12])
    if kind == "float":
        return rng.choice([0.5, -2.25, 3.14159, 1e-7, 2.5e20, 100.0, 1e16, 0.0001])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}_{rng.choice(WORDS)}": json_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def tool(rng, i):
    props = {
        "location": {"type": "string", "description": text(rng, 1, 4)},
        "days": {"type": "integer", "minimum": 1},
        "options": {"type": "object", "properties": {"units": {"type": "string", "enum": ["c", "f"]},
                                                     "deep": {"type": "array", "items": {"type": "number"}}}},
    }
    keys = rng.sample(list(props), rng.randint(1, 3))
    fn = {"name": f"tool_{i}_{rng.choice(['get', 'set', 'run'])}", "description": text(rng, 2, 6),
          "parameters": {"type": "object", "properties": {k: props[k] for k in keys}, "required": keys[:1]}}
    return {"type": "function", "function": fn}


def tool_call(rng, i):
    args = {f"arg{j}": json_value(rng) for j in range(rng.randint(0, 3))}
    fn = {"name": f"tool_{i}", "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.5 else args}
    if rng.random() < 0.15:
        return {"name": fn["name"], "arguments": args}  # a bare call without the "function" wrapper
    return {"id": f"call_{rng.randrange(1 << 30):x}", "type": "function", "function": fn}


def assistant(rng, plain):
    m = {"role": "assistant"}
    style = rng.random()
    if style < 0.25:
        m["content"] = f"<think>\n{text(rng)}\n</think>\n\n{text(rng)}"
    elif style < 0.5:
        m["content"] = text(rng)
        m[rng.choice(["reasoning_content", "reasoning_content", "reasoning", "thinking"])] = text(rng)
    else:
        m["content"] = text(rng)
    if rng.random() < 0.35:
        m["tool_calls"] = [tool_call(rng, k) for k in range(rng.randint(1, 3))]
        if rng.random() < 0.4:
            m["content"] = "" if plain else rng.choice(["", None])
    return m


def conversation(rng, plain):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 4)):
        content = text(rng)
        if rng.random() < 0.15 and not plain:
            content = [{"type": "text", "text": text(rng)}, {"type": "text", "text": text(rng)}]
        msgs.append({"role": "user", "content": content})
        if rng.random() < 0.8:
            a = assistant(rng, plain)
            msgs.append(a)
            if a.get("tool_calls"):
                for c in a["tool_calls"]:
                    msgs.append({"role": "tool", "tool_call_id": c.get("id", "x"), "content": text(rng)})
                if rng.random() < 0.7:
                    msgs.append(assistant(rng, plain))
    if rng.random() < 0.05:  # edge cases that raise in the template
        msgs = rng.choice([[{"role": "tool", "content": "r"}],
                           msgs + [{"role": "system", "content": "late"}],
                           msgs + [{"role": "narrator", "content": "x"}]])
    return msgs


def body(rng, plain=False):
    """plain: only what Qwen3's older template handles (string contents)."""
    b = {"model": "m", "messages": conversation(rng, plain)}
    r = rng.random()
    if r < 0.4:
        b["tools"] = [tool(rng, i) for i in range(rng.randint(1, 3))]
    elif r < 0.45:
        b["tools"] = []
    kw = {}
    if rng.random() < 0.4:
        kw["enable_thinking"] = rng.random() < 0.5
    if rng.random() < 0.4:
        kw["preserve_thinking"] = rng.random() < 0.5
    if kw:
        b["chat_template_kwargs"] = kw
    if rng.random() < 0.2:
        b["add_generation_prompt"] = False
    return b


def reference(source, b):
    """transformers' rendering, with the one vLLM convention tern also applies: string arguments -> objects."""
    msgs = copy.deepcopy(b["messages"])
    for m in msgs:
        for c in m.get("tool_calls") or []:
            fn = c.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
    msgs = transformers_ctu._normalize_chat_messages(msgs)
    kwargs = {**SPECIAL, **b.get("chat_template_kwargs", {})}
    rendered, _ = transformers_ctu.render_jinja_template(
        conversations=[msgs], tools=b.get("tools"), chat_template=source,
        add_generation_prompt=b.get("add_generation_prompt", True), **kwargs)
    return rendered[0]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for path in sorted(TEMPLATES.glob("*.jinja")):
        d = tmp_path_factory.mktemp(path.stem)
        (d / "chat_template.jinja").write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
        (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, **SPECIAL}), encoding="utf-8")
        dirs[path.stem] = d
    assert {"qwen3", "qwen3_5", "qwen3_6"} <= set(dirs)
    return dirs


def run_tern(tern_bin, model_dir, b):
    return subprocess.run([tern_bin, "template", "-m", str(model_dir)], input=json.dumps(b).encode(),
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "qwen3_6"])
def test_corpus_matches_transformers(tern_bin, seed, model_dirs, name):
    rng = random.Random(seed)
    source = (model_dirs[name] / "chat_template.jinja").read_text(encoding="utf-8")
    matched = raised = 0
    for i in range(N_CASES):
        b = body(rng, plain=name == "qwen3")
        try:
            want, err = reference(source, b), None
        except Exception as e:  # noqa: BLE001 - any failure of the reference must be a failure of tern too
            want, err = None, e
        r = run_tern(tern_bin, model_dirs[name], b)
        ctx = f"seed={seed} case={i} template={name}\nbody={json.dumps(b, ensure_ascii=False)}"
        if err is not None:
            assert r.returncode == 1, f"{ctx}\ntransformers raised {err!r} but tern printed:\n{r.stdout.decode()}"
            if type(err).__name__ == "TemplateError":
                assert str(err) in r.stderr.decode(), f"{ctx}\nwant message {err}, got {r.stderr.decode()}"
            raised += 1
            continue
        assert r.returncode == 0, f"{ctx}\ntern failed: {r.stderr.decode()}"
        got = r.stdout.decode("utf-8")
        assert got == want, f"{ctx}\n--- transformers\n{want!r}\n--- tern\n{got!r}"
        matched += 1
    print(f"{name}: {matched} identical, {raised} raised in both")
    assert matched >= N_CASES // 2


def test_key_cases_qwen3_6(tern_bin, model_dirs):
    """Fixed cases named in the issue: tool results at the start, enable_thinking false, preserve_thinking."""
    d = model_dirs["qwen3_6"]
    source = (d / "chat_template.jinja").read_text(encoding="utf-8")
    cases = [
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "user", "content": "q1"},
                      {"role": "assistant", "content": "a1", "reasoning_content": "old"},
                      {"role": "user", "content": "q2"}], "chat_template_kwargs": {"preserve_thinking": True}},
        {"messages": [{"role": "user", "content": "go"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c1", "type": "function",
                           "function": {"name": "f", "arguments": "{\"a\": 1, \"b\": \"x\", \"c\": [true]}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "r1"},
                      {"role": "tool", "tool_call_id": "c1", "content": "r2"}],
         "tools": [tool(random.Random(1), 0)]},
    ]
    for b in cases:
        r = run_tern(tern_bin, d, b)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout.decode() == reference(source, b)
    r = run_tern(tern_bin, d, {"messages": [{"role": "tool", "content": "r"}]})
    assert r.returncode == 1 and "No user query found in messages." in r.stderr.decode()


def test_unsupported_construct_names_line(tern_bin, tmp_path):
    (tmp_path / "chat_template.jinja").write_text("line one\n{% if x %}a{% endif %}\n{% include 'x' %}\n")
    r = run_tern(tern_bin, tmp_path, {"messages": [{"role": "user", "content": "hi"}]})
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "include" in err and "line 3" in err, err


SNIPPETS = [
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "{% for m in messages %}{{ loop.index }}:{{ m.role }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for m in messages[::-1] if m.role != 'system' %}{{ loop.revindex0 }}{{ m.content|length }} {% endfor %}",
    "{{ messages|map(attribute='role')|join('|') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}",
    "{% macro f(x, y='d', z=none) -%}\n  [{{ x }}|{{ y }}|{{ z }}]\n{%- endmacro %}{{ f(1) }}{{ f(2, z=3) }}{{ f('a', 'b') }}",
    "{{ tools|tojson }}\n{{ tools[0]|tojson(indent=2) }}\n{{ tools|tojson(sort_keys=true) }}",
    "{{ {'é': 'ü', 'n': [1.5, 2e-7, 1e22, -0.0, true, none]}|tojson }} {{ {'a': 1}|tojson(separators=(',', ':')) }}",
    "{{ '  x y  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ ' \u3000ü\u00a0 '|trim }}|{{ 'abc'|upper }}{{ 'ÀB'|lower }}",
    "{{ 'a-b c'|title }} {{ 'hello world'.title() }} {{ 'hELLO'|capitalize }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a.b.c'.rsplit('.', 1) }}",
    "{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ 'aXbXc'.replace('X', '-') }} {{ 'abcabc'.find('c') }} {{ 'é1'.count('1') }}",
    "{{ 'héllo wörld'[1:8:2] }} {{ 'héllo'[-2:] }} {{ [1, 2, 3, 4][1:-1] }} {{ [1, 2, 3][5:] }} {{ 'abc'[::-1] }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 4 }} {{ 2 ** 8 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ 0.1 + 0.2 }} {{ 1e100 }}",
    "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ messages is iterable }} {{ messages[0] is mapping }} {{ 'a' is sequence }} {{ 1 is number }} {{ 1.0 is float }} {{ true is boolean }}",
    "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort(reverse=true) }} {{ [1, 1, 2]|unique|list }} {{ [4, 2]|max }} {{ [4, 2]|min }} {{ [1, 2]|sum }}",
    "{{ {'b': 1, 'a': 2}|dictsort }} {% for k, v in {'z': 1, 'y': 2}.items() %}{{ k }}{{ v }}{% endfor %} {{ {'a': 1}.get('b', 'dflt') }} {{ {'a': 1}.keys()|list }}",
    "{{ none }} {{ true }} {{ [none, 'it\\'s', \"q\\\"\", 1.0] }} {{ {'k': [1, {'n': none}]} }} {{ '%' }}",
    "{{ x|default('d') }} {{ ''|default('e', true) }} {{ '12'|int + 1 }} {{ '3.5'|float }} {{ 'x'|int }} {{ -3|abs }} {{ 2.567|round(1) }}",
    "{% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% set t %}block {{ 1 + 1 }}{% endset %}{{ t|upper }} {% set a, b = 'xy' %}{{ b }}{{ a }}",
    "{%- if messages[0]['role'] == 'system' -%}\n    SYS: {{ messages[0]['content'] }}\n{%- else -%}\n    none\n{%- endif %}\n   {# comment #}\nend",
    "{{ 'a' if x else 'b' }} {{ x or 'fallback' }} {{ 0 and 1 }} {{ not messages }} {{ 1 < 2 <= 2 }} {{ 'b' in ['a', 'b'] }} {{ 'z' not in {'z': 1} }}",
    "{{ (messages|length - 1) - 1 }} {{ messages[-1].content }} {{ messages[0].missing is defined }} {{ 'x' ~ 1 ~ none }}",
    "{{ 'line1\nline2\n\nline4'|indent(2) }}|{{ 'a b  c'|wordcount }}|{{ '<a href=\"x\">'|e }}|{{ [1, 2]|join(', ') }}|{{ 'ab'|list }}|{{ 'abc'|reverse }}",
]


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_matches_jinja2(tern_bin, tmp_path, index):
    """Features beyond the Qwen templates: each snippet rendered by transformers' jinja2 set-up and by tern."""
    source = SNIPPETS[index]
    b = {"messages": [{"role": "system", "content": "Sys ✓"}, {"role": "user", "content": "héllo"},
                      {"role": "assistant", "content": "ok"}],
         "tools": [{"type": "function", "function": {"name": "f", "description": "d é",
                                                     "parameters": {"type": "object", "properties": {"b": {}, "a": {}}}}}]}
    want = reference(source, b)
    (tmp_path / "t.jinja").write_text(source, encoding="utf-8")
    r = subprocess.run([tern_bin, "template", "--template", str(tmp_path / "t.jinja")], input=json.dumps(b).encode(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0, f"{source!r}: {r.stderr.decode()}"
    assert r.stdout.decode() == want, source
