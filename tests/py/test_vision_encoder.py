"""The CPU vision encoder (src/cpu/vision_encoder) against transformers' Qwen3_5MoeVisionModel (fp32, CPU) on
random-weight encoders of the real structure made with fresh seeds every run by tests/oracles/vision_reference.py,
run through tests/tools/vision_probe.cpp (tern_vision_probe).

Measure: max|tern - ref| / max|ref| over the image-token embeddings (pooler_output) of all images of one call
<= 1e-4: two images of random, different sizes in one call (HF layout, fp32), the mlx-vlm layout (vision_tower.*,
channels-last Conv3d) with bf16 weights, video-like grids of several frames (one attention segment per frame),
and Qwen3.6's real widths (1152 x 16 heads, MLP 4304, 48 x 48 positions, output 2048) with two blocks. The
encoder joined to a whole checkpoint loads through model_load; a config without vision tensors loads as text
only; malformed vision tensors are refused with a message naming the tensor (exit 1, never a signal)."""
import json
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = sys.executable
TOL = 1e-4


@pytest.fixture(scope="module")
def probe(tern_tool):
    return tern_tool("tern_vision_probe")


def random_grids(seed, images=2, frames=1, largest=24):
    """Distinct (t, h, w) grids of even sides (whole 2 x 2 merge blocks), smaller and larger than the table."""
    rng = random.Random(seed)
    grids = set()
    while len(grids) < images:
        grids.add((frames, 2 * rng.randint(1, largest // 2), 2 * rng.randint(1, largest // 2)))
    return ";".join(",".join(map(str, g)) for g in sorted(grids))


def make_encoder(out, seed, *args):
    r = subprocess.run([PY, str(ROOT / "tests/oracles/vision_reference.py"), "--out", str(out), "--seed", str(seed),
                        *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return pathlib.Path(out)


def run_probe(probe, model, data, out, *flags, check=True):
    r = subprocess.run([str(probe), *flags, str(model), str(data / "pixel_values.npy"), str(data / "grid_thw.npy"),
                        str(out)], capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def check_against_reference(probe, d, model=None, *flags):
    out = d / "tern.npy"
    run_probe(probe, model or d, d, out, *flags)
    got, ref = np.load(out), np.load(d / "expected.npy")
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    grids = np.load(d / "grid_thw.npy").tolist()
    print(f"{d.name}: grids {grids}: rel err {err:.3g}")
    assert err <= TOL, f"{d.name}: grids {grids}: rel err {err:.3g} > {TOL}"


def test_two_images_hf_fp32(probe, tmp_path, fresh_seed):
    seed = fresh_seed("two images, HF layout, fp32")
    d = make_encoder(tmp_path / "hf", seed, "--grids", random_grids(seed), "--layers", 3)
    check_against_reference(probe, d)


def test_mlx_layout_bf16(probe, tmp_path, fresh_seed):
    seed = fresh_seed("mlx-vlm layout, bf16 weights")
    d = make_encoder(tmp_path / "mlx", seed, "--grids", random_grids(seed, images=3), "--layout", "mlx",
                     "--dtype", "bfloat16")
    check_against_reference(probe, d)


def test_frames_attend_within_themselves(probe, tmp_path, fresh_seed):
    seed = fresh_seed("several frames")
    grids = random_grids(seed, images=1, frames=3) + ";" + random_grids(seed + 1, images=1)
    d = make_encoder(tmp_path / "frames", seed, "--grids", grids)
    check_against_reference(probe, d)


def test_real_widths(probe, tmp_path, fresh_seed):
    seed = fresh_seed("Qwen3.6's vision widths, two blocks")
    d = make_encoder(tmp_path / "real", seed, "--preset", "real", "--layers", 2, "--dtype", "bfloat16",
                     "--grids", random_grids(seed, largest=16))
    check_against_reference(probe, d)


def rewrite(src, dst, edit):
    """Copies an encoder folder with its tensors edited: edit(dict of numpy arrays) -> dict."""
    from safetensors.numpy import load_file, save_file
    dst.mkdir()
    for name in ["config.json", "pixel_values.npy", "grid_thw.npy", "expected.npy"]:
        (dst / name).write_bytes((src / name).read_bytes())
    save_file(edit(load_file(str(src / "model.safetensors"))), str(dst / "model.safetensors"))
    return dst


def test_malformed_vision_tensors_are_refused(probe, tmp_path, fresh_seed):
    seed = fresh_seed("malformed vision tensors")
    d = make_encoder(tmp_path / "ok", seed, "--layers", 2)
    cases = {
        "missing": (lambda t: {k: v for k, v in t.items() if k != "model.visual.blocks.1.attn.qkv.weight"},
                    "missing tensor 'model.visual.blocks.1.attn.qkv.weight'"),
        "shape": (lambda t: {**t, "model.visual.merger.linear_fc2.bias": np.zeros(7, np.float32)},
                  "tensor 'model.visual.merger.linear_fc2.bias': expected"),
        "extra": (lambda t: {**t, "model.visual.blocks.9.norm1.weight": np.zeros(64, np.float32)},
                  "unexpected tensor 'model.visual.blocks.9.norm1.weight'"),
        "dtype": (lambda t: {**t, "model.visual.pos_embed.weight": t["model.visual.pos_embed.weight"].astype(np.int32)},
                  "tensor 'model.visual.pos_embed.weight': expected BF16|F16|F32"),
    }
    for name, (edit, message) in cases.items():
        bad = rewrite(d, tmp_path / name, edit)
        r = run_probe(probe, bad, bad, bad / "tern.npy", check=False)
        assert r.returncode == 1, f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert message in r.stderr, f"{name}: {r.stderr[-2000:]}"
    # pixel_values that do not match the grids
    np.save(tmp_path / "ok" / "grid_thw.npy", np.array([[1, 4, 4]], dtype=np.int32))
    r = run_probe(probe, d, d, d / "tern.npy", check=False)
    assert r.returncode == 1 and "rows but the grids hold 16 patches" in r.stderr, r.stderr[-2000:]


def inspect_vision(tern_bin, model):
    r = subprocess.run([tern_bin, "inspect", "-m", str(model), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["source"]


def test_whole_checkpoint_with_and_without_vision(probe, tern_bin, tmp_path, fresh_seed):
    """make_model.py's official-form checkpoint joined to an encoder of its width loads through model_load; the
    same folder without vision tensors (a text-only conversion that kept vision_config) loads as text only."""
    from safetensors.torch import load_file, save_file
    seed = fresh_seed("whole checkpoint")
    text = tmp_path / "text"
    r = subprocess.run([PY, str(ROOT / "tests/oracles/make_model.py"), "--out", str(text), "--seed", str(seed),
                        "--hf-format", "official", "--dtype", "float32"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    width = json.loads((text / "config.json").read_text())["text_config"]["hidden_size"]
    enc = make_encoder(tmp_path / "enc", seed, "--out-hidden", width, "--grids", random_grids(seed))
    tensors = {}
    for f in sorted(text.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
        f.unlink()
    (text / "model.safetensors.index.json").unlink(missing_ok=True)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("model.visual.")}  # make_model's stand-ins
    config = json.loads((text / "config.json").read_text())
    config["vision_config"] = json.loads((enc / "config.json").read_text())["vision_config"]
    (text / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(text / "model.safetensors"))
    r = run_probe(probe, text, enc, enc / "text_only.npy", "--model", check=False)
    assert r.returncode == 1 and "no vision encoder" in r.stderr, r.stderr[-2000:]
    assert inspect_vision(tern_bin, text)["vision"]["loaded"] is False
    vision = load_file(str(enc / "model.safetensors"))
    tensors.update(vision)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(text / "model.safetensors"))
    check_against_reference(probe, enc, text, "--model")
    source = inspect_vision(tern_bin, text)
    assert source["vision"]["loaded"] is True and source["vision"]["tensors"] == len(vision)
    assert "model.visual." not in source["skipped"]
