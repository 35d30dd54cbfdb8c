"""The endpoints tools expect besides chat: /tokenize and /detokenize against the HF tokenizers library on the same
tokenizer, /props, 405 with Allow for a wrong method on a known path, and the model's names: its id from a Hugging
Face hub cache layout (or a repo id the folder records), --alias, and any other name answered by the model."""
import json
import pathlib
import random
import shutil
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from test_server_helpers import Server, demo_server_fixture, post_json, request

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = "tern-demo-random-weights"
HUB_ID = "tern-tests/tiny-qwen3.6"
HUB_HASH = "0123456789abcdef0123456789abcdef01234567"


demo = demo_server_fixture("--ctx-size", "768")


@pytest.fixture(scope="module")
def qwen3_tokenizer(tmp_path_factory):
    """The demo's tokenizer (the real Qwen3 one) for the HF tokenizers library."""
    out = tmp_path_factory.mktemp("tok") / "qwen3-tokenizer.json"
    subprocess.run(["zstd", "-q", "-d", "-f", str(ROOT / "tests/data/tokenizers/qwen3-tokenizer.json.zst"), "-o",
                    str(out)], check=True)
    return Tokenizer.from_file(str(out))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, seed_module):
    out = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([sys.executable, str(ROOT / "tests/oracles/make_model.py"), "--out", str(out), "--seed",
                    str(seed_module), "--preset", "tiny", "--layout", "hf", "--dtype", "float32"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def seed_module():
    return random.SystemRandom().randrange(1 << 31)


@pytest.fixture(scope="module")
def hub_snapshot(tiny_model, tmp_path_factory):
    """The tiny model laid out as the Hugging Face hub cache lays out a download (blobs linked from a snapshot)."""
    repo = tmp_path_factory.mktemp("hub") / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / HUB_HASH
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_HASH)
    for i, f in enumerate(sorted(tiny_model.iterdir())):
        blob = repo / "blobs" / f"blob{i:04d}"
        shutil.copy(f, blob)
        (snapshot / f.name).symlink_to(pathlib.Path("../../blobs") / blob.name)
    return snapshot


@pytest.fixture(scope="module")
def hub_server(tern_bin, hub_snapshot):
    s = Server(tern_bin, "-m", str(hub_snapshot), "--device", "cpu", "--ctx-size", "256", "--alias", "tiny",
               "--alias", "my-model", demo=False)
    yield s
    s.stop()


def texts(rng):
    out = ["Hello, world!", "", " leading and trailing spaces ", "déjà vu — naïve café", "数学 和 日本語のテキスト",
           "emoji 🙂🚀 and <|im_start|> special", "code:\n\tdef f(x):\n\t\treturn x**2  # comment\n",
           "<think>\nreasoning\n</think>\n\nanswer"]
    alphabet = "abc XYZ 012 .,;!?\n\t é ü 中 文 🙂 <|> _-"
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80))) for _ in range(20)]
    return out


def tokenize(port, content, **kw):
    status, _, data = post_json(port, "/tokenize", {"content": content, **kw})
    assert status == 200, data
    return data["tokens"]


def test_tokenize_matches_hf_tokenizers(demo, qwen3_tokenizer, seed):
    rng = random.Random(seed)
    for text in texts(rng):
        ids = tokenize(demo.port, text)
        assert ids == qwen3_tokenizer.encode(text, add_special_tokens=False).ids, text
        # Qwen's tokenizer adds no BOS/EOS: add_special changes nothing, as in HF.
        assert tokenize(demo.port, text, add_special=True) == qwen3_tokenizer.encode(text).ids
        status, _, data = post_json(demo.port, "/detokenize", {"tokens": ids})
        assert status == 200 and data["content"] == text == qwen3_tokenizer.decode(ids, skip_special_tokens=False)


def test_tokenize_with_pieces(demo, qwen3_tokenizer):
    text = "naïve 🦩 <|im_end|>"
    pieces = tokenize(demo.port, text, with_pieces=True)
    assert [p["id"] for p in pieces] == qwen3_tokenizer.encode(text, add_special_tokens=False).ids
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined == text.encode()
    assert any(isinstance(p["piece"], list) for p in pieces)  # the flamingo emoji is two tokens, neither UTF-8
    im_end = qwen3_tokenizer.token_to_id("<|im_end|>")
    assert im_end in [p["id"] for p in pieces]
    assert im_end not in tokenize(demo.port, text, parse_special=False)


def test_tokenize_and_detokenize_errors(demo):
    for body, param in [({}, "content"), ({"content": 5}, "content"), ({"content": "x", "with_pieces": "yes"},
                                                                     "with_pieces")]:
        status, _, data = post_json(demo.port, "/tokenize", body)
        assert status == 400 and data["error"]["param"] == param, data
    for tokens in [[1, 2, 10**9], [-1], ["a"], [1.5], "1,2"]:
        status, _, data = post_json(demo.port, "/detokenize", {"tokens": tokens})
        assert status == 400 and data["error"]["param"] == "tokens", (tokens, data)
    status, _, data = post_json(demo.port, "/detokenize", {"tokens": []})
    assert status == 200 and data == {"content": ""}


def test_props_of_the_demo(demo):
    status, _, data = request("GET", demo.port, "/props")
    assert status == 200
    p = json.loads(data)
    assert p["model"] == DEMO and p["random_weights"] is True and p["model_path"] == ""
    assert p["n_ctx"] == 768 and p["total_slots"] == 1
    settings = p["default_generation_settings"]
    for key in ("temperature", "top_p", "top_k", "min_p", "max_tokens"):
        assert key in settings, key
    assert "<|im_start|>" in p["chat_template"] and p["build_info"].startswith("tern ")


def test_wrong_method_is_405_with_allow(demo):
    for method, path, allow in [("GET", "/v1/chat/completions", "POST"), ("GET", "/v1/completions", "POST"),
                                ("GET", "/tokenize", "POST"), ("POST", "/health", "GET"), ("POST", "/props", "GET"),
                                ("DELETE", "/v1/models", "GET"), ("PUT", "/v1/models/x", "GET"),
                                ("GET", "/v1/messages/count_tokens", "POST")]:
        status, headers, data = request(method, demo.port, path, {} if method != "GET" else None)
        assert status == 405, (method, path, status, data)
        assert headers["allow"] == allow, (method, path, headers)
        body = json.loads(data)
        assert ("error" in body and "message" in body["error"]), body
    status, headers, data = request("GET", demo.port, "/no/such/route")
    assert status == 404 and "allow" not in headers
    assert json.loads(data)["error"]["code"] == "not_found"


def test_hub_cache_id_and_aliases(hub_server, hub_snapshot):
    status, _, data = request("GET", hub_server.port, "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(data)["data"]] == [HUB_ID, "tiny", "my-model"]
    status, _, data = request("GET", hub_server.port, "/props")
    p = json.loads(data)
    assert p["model"] == HUB_ID and p["aliases"] == ["tiny", "my-model"] and p["random_weights"] is False
    assert p["model_path"] == str(hub_snapshot)
    for name in (HUB_ID, "tiny", "my-model"):
        status, _, data = post_json(hub_server.port, "/v1/chat/completions",
                                    {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and data["model"] == HUB_ID, (name, data)
        assert request("GET", hub_server.port, "/v1/models/" + name)[0] == 200
    # Any other name is the served model, under its id (--strict-model-name: 404, test_api_defaults.py).
    status, _, data = post_json(hub_server.port, "/v1/chat/completions",
                                {"model": "tiny-other", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and data["model"] == HUB_ID, data
    status, _, data = request("GET", hub_server.port, "/v1/models/tiny-other")
    assert status == 200 and json.loads(data)["id"] == HUB_ID
    status, _, data = post_json(hub_server.port, "/v1/messages",
                                {"model": "tiny-other", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
    assert status == 200 and data["model"] == HUB_ID, data
    assert f'use model "{HUB_ID}" or "tiny" or "my-model"' in hub_server.log_text()


def test_hub_tokenizer_matches(hub_server, hub_snapshot, seed):
    tok = Tokenizer.from_file(str(hub_snapshot / "tokenizer.json"))
    for text in texts(random.Random(seed))[:10]:
        ids = tokenize(hub_server.port, text)
        assert ids == tok.encode(text, add_special_tokens=False).ids, text
        status, _, data = post_json(hub_server.port, "/detokenize", {"tokens": ids})
        assert status == 200 and data["content"] == tok.decode(ids, skip_special_tokens=False)


def model_name(tern_bin, folder, *extra):
    r = subprocess.run([tern_bin, "generate", "-m", str(folder), "--device", "cpu", "-p", "x", "-n", "1", "--json",
                        *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["model"]


def test_recorded_repo_id(tern_bin, tiny_model, tmp_path):
    named = tmp_path / "tiny-qwen3.6"
    shutil.copytree(tiny_model, named)
    config = json.loads((named / "config.json").read_text())
    config["_name_or_path"] = HUB_ID
    (named / "config.json").write_text(json.dumps(config))
    assert model_name(tern_bin, named) == HUB_ID
    # Recorded for another folder name (a fine-tune of that repo saved elsewhere): the folder's own name.
    other = tmp_path / "my-finetune"
    shutil.copytree(named, other)
    assert model_name(tern_bin, other) == "my-finetune"
    # A model card linking its own repo (converted checkpoints).
    card = tmp_path / "Tiny-4bit"
    shutil.copytree(tiny_model, card)
    (card / "README.md").write_text("Converted from [base](https://huggingface.co/tern-tests/tiny) into "
                                    "[tern-tests-mlx/Tiny-4bit](https://huggingface.co/tern-tests-mlx/Tiny-4bit).\n")
    assert model_name(tern_bin, card) == "tern-tests-mlx/Tiny-4bit"
    assert model_name(tern_bin, tiny_model) == "model"
    assert model_name(tern_bin, card, "--name", "custom") == "custom"
