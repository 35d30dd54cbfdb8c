"""Checkpoint loading against independent tools: transformers' save_pretrained (HF layout) and mlx-lm's converter
(MLX layout) write the same random model; tern must load both into identical internal weights, print identical
inspect summaries, quantise a BF16 checkpoint byte-exactly as mlx-lm does, reject broken checkpoints with exit
code 1 and a message (never a signal), and its safetensors header parser must survive libFuzzer."""
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAKE_MODEL = ROOT / "tests" / "oracles" / "make_model.py"


def make_model(out, seed, *args):
    r = subprocess.run([sys.executable, str(MAKE_MODEL), "--out", str(out), "--seed", str(seed), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return pathlib.Path(out)


def run_tern(tern_bin, *args, check=True):
    r = subprocess.run([tern_bin, *map(str, args)], capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, f"tern {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}"
    return r


def inspect_json(tern_bin, model, *extra):
    return json.loads(run_tern(tern_bin, "inspect", "-m", model, "--json", *extra).stdout)


def read_safetensors(path):
    """Independent reader: {name: (dtype, shape, raw bytes)}."""
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[8 + n + b:8 + n + e])
    return out


def read_dir(d):
    out = {}
    for f in sorted(pathlib.Path(d).glob("*.safetensors")):
        out.update(read_safetensors(f))
    return out


def bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The same random tiny model written by transformers (per-expert and official fused forms) and by mlx-lm.
    The official form leaves out the MTP draft head, which mlx-lm drops (test_mtp.py has it)."""
    seed = int(os.environ.get("TERN_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed={seed}")
    base = tmp_path_factory.mktemp("ckpt")
    return {
        "seed": seed,
        "hf": make_model(base / "hf", seed),
        "hf_official": make_model(base / "hf_official", seed, "--hf-format", "official", "--no-mtp",
                                  "--max-shard-size", "400KB"),
        "mlx": make_model(base / "mlx", seed, "--layout", "mlx", "--bits", "4"),
    }


def test_inspect_summaries_agree(tern_bin, models):
    hf = inspect_json(tern_bin, models["hf"])
    official = inspect_json(tern_bin, models["hf_official"])
    mlx = inspect_json(tern_bin, models["mlx"])
    assert hf["source"]["layout"] == "hf" and hf["source"]["experts"] == "per-expert"
    assert official["source"]["layout"] == "hf" and official["source"]["experts"] == "fused"
    assert official["source"]["key_prefix"] == "model.language_model." and official["source"]["files"] > 1
    assert set(official["source"]["skipped"]) == {"model.visual."}
    assert mlx["source"]["layout"] == "mlx" and mlx["source"]["key_prefix"] == "language_model.model."
    assert hf["model"] == mlx["model"], "inspect summaries differ between the HF and MLX layouts"
    assert official["model"] == mlx["model"]
    formats = mlx["model"]["weights"]["by_kind"]
    assert formats["router"]["formats"] == {"affine8": 4}
    assert formats["experts"]["formats"] == {"affine4": 12}
    assert mlx["model"]["vocab_real"] < mlx["model"]["config"]["vocab_size"]
    text = run_tern(tern_bin, "inspect", "-m", models["hf_official"]).stdout
    assert "layout       hf" in text and "skipped      model.visual.*" in text and "memory" in text
    assert "mtp head     absent: no mtp.* tensors" in text


def test_internal_weights_identical(tern_bin, models, tmp_path):
    dumps = {}
    for name in ["hf", "hf_official", "mlx"]:
        run_tern(tern_bin, "inspect", "-m", models[name], "--dump-weights", tmp_path / f"{name}.safetensors",
                 "--no-progress")
        dumps[name] = read_safetensors(tmp_path / f"{name}.safetensors")
    ref = dumps["mlx"]
    for other in ["hf", "hf_official"]:
        d = dumps[other]
        assert sorted(d) == sorted(ref)
        for k in ref:
            dt, shape, raw = ref[k]
            assert d[k][:2] == (dt, shape), k
            if k.endswith(("_norm", "final_norm")) and not k.endswith("gdn_norm"):
                # HF: fp32 (1 + w); MLX: bf16(1 + w) as mlx-lm stores it. Equal up to one bf16 rounding.
                a, b = np.frombuffer(d[k][2], np.float32), np.frombuffer(raw, np.float32)
                np.testing.assert_allclose(a, b, rtol=2 ** -8, atol=0, err_msg=k)
            else:
                assert d[k][2] == raw, f"internal tensor {k} differs between {other} and mlx"


def test_quantize_matches_mlx_lm(tern_bin, models, tmp_path):
    """tern quantize of the HF BF16 checkpoint writes the bytes mlx-lm's converter writes."""
    out = tmp_path / "q"
    run_tern(tern_bin, "quantize", "--in", models["hf"], "--out", out, "--no-progress")
    ours, theirs = read_dir(out), read_dir(models["mlx"])
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        assert ours[k][:2] == theirs[k][:2], f"{k}: {ours[k][:2]} vs mlx-lm {theirs[k][:2]}"
        assert ours[k][2] == theirs[k][2], f"{k}: bytes differ from mlx-lm's converter"
    cfg_ours = json.loads((out / "config.json").read_text())
    cfg_theirs = json.loads((models["mlx"] / "config.json").read_text())
    assert cfg_ours["quantization"] == cfg_theirs["quantization"]
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()
    # tern and mlx-lm both load it; mlx-lm gives the same logits as for its own conversion.
    assert inspect_json(tern_bin, out)["model"] == inspect_json(tern_bin, models["mlx"])["model"]
    import mlx.core as mx
    from mlx_lm import load
    toks = mx.array([[1, 5, 9, 200, 3]])
    a = np.array(load(str(out))[0](toks).astype(mx.float32))
    b = np.array(load(str(models["mlx"]))[0](toks).astype(mx.float32))
    np.testing.assert_array_equal(a, b)


def test_dtype_options(tern_bin, models):
    bf16 = inspect_json(tern_bin, models["hf_official"], "--dtype", "bf16")
    kinds = bf16["model"]["weights"]["by_kind"]
    assert all(set(k["formats"]) == {"bf16"} for k in kinds.values())
    assert bf16["load"]["heap_bytes"] == bf16["model"]["weights"]["vector_bytes"], "BF16 matrices should be used in place"
    r = run_tern(tern_bin, "inspect", "-m", models["mlx"], "--dtype", "bf16", check=False)
    assert r.returncode == 1 and "--dtype bf16" in r.stderr
    r = run_tern(tern_bin, "inspect", "-m", models["mlx"], "--dtype", "fp8", check=False)
    assert r.returncode == 1 and "--dtype" in r.stderr


def test_realdims_layouts_agree(tern_bin, tmp_path):
    seed = random.SystemRandom().randrange(1 << 31)
    print(f"seed={seed}")
    hf = make_model(tmp_path / "hf", seed, "--preset", "realdims")
    mlx = make_model(tmp_path / "mlx", seed, "--preset", "realdims", "--layout", "mlx", "--bits", "4")
    a, b = inspect_json(tern_bin, hf), inspect_json(tern_bin, mlx)
    assert a["model"] == b["model"]
    assert a["model"]["config"]["head_dim"] == 256 and a["model"]["config"]["linear_num_value_heads"] == 32
    for name, d in (("hf", hf), ("mlx", mlx)):
        run_tern(tern_bin, "inspect", "-m", d, "--dump-weights", tmp_path / f"{name}.st", "--no-progress")
    x, y = read_safetensors(tmp_path / "hf.st"), read_safetensors(tmp_path / "mlx.st")
    for k in y:
        if "norm" not in k or "gdn_norm" in k:
            assert x[k] == y[k], k


def test_unquantised_and_8bit_mlx(tern_bin, models, tmp_path):
    """mlx-lm files stored BF16 (--bits 0) load in place and equal the HF checkpoint loaded with --dtype bf16; 8-bit
    files load as affine8; make_model gives the same weights for the same seed."""
    seed = models["seed"]
    again = make_model(tmp_path / "again", seed)
    assert read_dir(again) == read_dir(models["hf"]), "make_model is not deterministic for a seed"
    bf16 = make_model(tmp_path / "bf16", seed, "--layout", "mlx", "--bits", "0")
    q8 = make_model(tmp_path / "q8", seed, "--layout", "mlx", "--bits", "8")
    s = inspect_json(tern_bin, bf16)
    assert all(set(k["formats"]) == {"bf16"} for k in s["model"]["weights"]["by_kind"].values())
    assert s["load"]["heap_bytes"] == s["model"]["weights"]["vector_bytes"]
    hf_bf16 = inspect_json(tern_bin, models["hf"], "--dtype", "bf16")["model"]
    assert s["model"]["weights"] == hf_bf16["weights"] and s["model"]["config"] == hf_bf16["config"]
    run_tern(tern_bin, "inspect", "-m", bf16, "--dump-weights", tmp_path / "a.st", "--no-progress")
    run_tern(tern_bin, "inspect", "-m", models["hf_official"], "--dtype", "bf16", "--dump-weights", tmp_path / "b.st",
             "--no-progress")
    a, b = read_safetensors(tmp_path / "a.st"), read_safetensors(tmp_path / "b.st")
    assert sorted(a) == sorted(b)
    for k in a:
        if k.endswith("_norm") and not k.endswith("gdn_norm"):
            np.testing.assert_allclose(np.frombuffer(a[k][2], np.float32), np.frombuffer(b[k][2], np.float32),
                                       rtol=2 ** -8, atol=0, err_msg=k)
        else:
            assert a[k] == b[k], k
    s8 = inspect_json(tern_bin, q8)
    assert all(set(k["formats"]) == {"affine8"} for k in s8["model"]["weights"]["by_kind"].values())
    q4 = inspect_json(tern_bin, bf16, "--dtype", "q4")
    assert q4["model"]["weights"] == inspect_json(tern_bin, models["mlx"])["model"]["weights"]


# ---- broken checkpoints: exit code 1 with a message, never a signal ----

def rewrite_header(path, edit):
    """Applies edit(header dict) and rewrites the file with the same data section."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data[8 + n:])


def first_tensor(header, suffix):
    return next(k for k in sorted(header) if k.endswith(suffix))


def break_offsets(d):
    def edit(h):
        k = first_tensor(h, "in_proj_z.weight")
        h[k]["data_offsets"][1] += 10 ** 9
    rewrite_header(d / "model.safetensors", edit)


def break_shape(d):
    def edit(h):
        k = first_tensor(h, "in_proj_z.weight")
        h[k]["shape"] = list(reversed(h[k]["shape"])) + [1]
    rewrite_header(d / "model.safetensors", edit)


def break_missing(d):
    def edit(h):
        del h[first_tensor(h, "post_attention_layernorm.weight")]
    rewrite_header(d / "model.safetensors", edit)


def break_truncated(d):
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:100])


def break_dtype(d):
    def edit(h):
        k = first_tensor(h, "in_proj_a.weight")
        h[k]["dtype"] = "I32"
        h[k]["shape"] = [h[k]["shape"][0], h[k]["shape"][1] // 2]
    rewrite_header(d / "model.safetensors", edit)


def break_unexpected(d):
    def edit(h):
        k = first_tensor(h, "norm.weight")
        h["model.layers.0.mystery.weight"] = dict(h[k])
        h["model.layers.0.mystery.weight"]["data_offsets"] = [h[k]["data_offsets"][0]] * 2
        h["model.layers.0.mystery.weight"]["shape"] = [0]
    rewrite_header(d / "model.safetensors", edit)


def break_config(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = cfg["layer_types"][:-1]
    (d / "config.json").write_text(json.dumps(cfg))


def break_bad_json_header(d):
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[8] = ord("[")
    p.write_bytes(bytes(data))


BREAKS = {
    "bad_offsets": (break_offsets, ["in_proj_z", "past the end"]),
    "wrong_shape": (break_shape, ["in_proj_z", "expected"]),
    "missing_tensor": (break_missing, ["missing tensor", "post_attention_layernorm"]),
    "truncated_header": (break_truncated, ["truncated"]),
    "wrong_dtype": (break_dtype, ["in_proj_a", "I32"]),
    "unexpected_tensor": (break_unexpected, ["unexpected tensor", "mystery"]),
    "bad_config": (break_config, ["layer_types"]),
    "bad_json_header": (break_bad_json_header, ["model.safetensors"]),
}


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_broken_checkpoint_fails_cleanly(tern_bin, models, tmp_path, kind):
    d = tmp_path / kind
    shutil.copytree(models["hf"], d)
    breaker, fragments = BREAKS[kind]
    breaker(d)
    for args in (["inspect", "-m", d], ["inspect", "-m", d, "--dump-weights", tmp_path / "x.st", "--no-progress"]):
        r = run_tern(tern_bin, *args, check=False)
        assert r.returncode == 1, f"{kind}: exit {r.returncode} (negative = signal)\n{r.stderr}"
        for f in fragments:
            assert f in r.stderr, f"{kind}: '{f}' not in:\n{r.stderr}"


def test_shard_missing_from_index(tern_bin, models, tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(models["hf_official"], d)
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[1].unlink()
    r = run_tern(tern_bin, "inspect", "-m", d, check=False)
    assert r.returncode == 1 and shards[1].name in r.stderr and "missing" in r.stderr, r.stderr


# ---- libFuzzer over the safetensors header parser ----

def test_fuzz_safetensors_header(tmp_path):
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    assert clang, "clang++ is needed for the libFuzzer target (scripts/install-deps installs clang)"
    exe = tmp_path / "safetensors_fuzz"
    srcs = [ROOT / "tests/fuzz/safetensors_fuzz.cpp", ROOT / "src/model/safetensors.cpp", ROOT / "src/core/mmap.cpp",
            ROOT / "src/core/check.cpp", ROOT / "src/core/text_file.cpp"]
    r = subprocess.run([clang, "-std=c++20", "-O1", "-g", "-fsanitize=fuzzer,address,undefined", "-I", ROOT / "src",
                        *srcs, "-o", exe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    corpus = tmp_path / "corpus"
    corpus.mkdir()

    def st(header, nbytes):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + bytes(nbytes)

    (corpus / "a").write_bytes(st({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                                   "__metadata__": {"format": "pt"}}, 8))
    (corpus / "b").write_bytes(st({"w": {"dtype": "U32", "shape": [1, 2], "data_offsets": [0, 8]},
                                   "s": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, 12))
    seed = random.SystemRandom().randrange(1 << 31)
    print(f"fuzz seed={seed}")
    secs = int(os.environ.get("TERN_FUZZ_SECONDS", "45"))
    r = subprocess.run([exe, f"-max_total_time={secs}", f"-seed={seed}", "-max_len=2048", "-timeout=10",
                        "-rss_limit_mb=2048", str(corpus)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=secs + 120)
    assert r.returncode == 0, r.stderr[-4000:]
