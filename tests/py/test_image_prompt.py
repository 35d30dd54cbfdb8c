"""Images in the language model: tern's CPU backend against transformers' Qwen3_5MoeForConditionalGeneration (fp32,
CPU) on random vision-language checkpoints made with fresh seeds every run by tests/oracles/vlm_reference.py (the
tiny language model of make_model.py with a small vision encoder of the real structure), through
`tern logits --image-pixels --image-grids` (ModelRunner::forward_images).

A prompt of text and two images of different random sizes (each between <|vision_start|> and <|vision_end|>, text
between and after) is compared position by position over the whole prompt: mean KL(reference || tern) and
max|tern - ref| / max|ref|. The issue's bound for the GPU is a mean KL of 1e-3; on the CPU in fp32 tern lands near
1e-14, so the bound here is 1e-9, far below what a wrong position would give: the reference's own forward with the
plain positions 0 .. T-1 instead of the 3-axis M-RoPE ones (the oracle's control) must land at least 1000 times
further. Both one prefill of the whole prompt and a prefill that ends inside the first image (the rest decoded one
token at a time, each image token with its own row and position) are checked, and text-only ids on the same
checkpoint (no images) stay far from the image prompt's logits."""
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = sys.executable
MAX_MEAN_KL = 1e-9
MAX_REL_ERR = 1e-4


def random_grids(seed):
    """Two distinct (1, h, w) grids of whole 2 x 2 merge blocks."""
    rng = random.Random(seed)
    grids = set()
    while len(grids) < 2:
        grids.add((1, 2 * rng.randint(1, 6), 2 * rng.randint(1, 6)))
    return ";".join(",".join(map(str, g)) for g in sorted(grids))


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def mean_kl(ref, got, real):
    a, b = log_softmax(ref[:, real]), log_softmax(got[:, real])
    return float((np.exp(a) * (a - b)).sum(-1).mean())


@pytest.fixture(scope="module")
def vlm(tmp_path_factory, fresh_seed):
    seed = fresh_seed("vision-language checkpoint")
    out = tmp_path_factory.mktemp("vlm") / "model"
    r = subprocess.run([PY, str(ROOT / "tests/oracles/vlm_reference.py"), "--out", str(out), "--seed", str(seed),
                        "--grids", random_grids(seed)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def tern_logits(tern_bin, model, out, *extra, check=True):
    r = subprocess.run([tern_bin, "logits", "-m", str(model), "--tokens-file", str(model / "tokens.npy"),
                        "--out", str(out), *extra], capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def with_images(model):
    return ["--image-pixels", str(model / "pixel_values.npy"), "--image-grids", str(model / "grid_thw.npy")]


def check(vlm, got, what):
    ref, plain = np.load(vlm / "expected.npy"), np.load(vlm / "plain_positions.npy")
    assert got.shape == ref.shape, (got.shape, ref.shape)
    real = np.isfinite(got[0])  # padded ids are -inf in tern
    kl = mean_kl(ref, got, real)
    rel = float(np.abs(got[:, real] - ref[:, real]).max() / np.abs(ref[:, real]).max())
    control = mean_kl(plain, got, real)
    grids = np.load(vlm / "grid_thw.npy").tolist()
    print(f"{what}: grids {grids}: mean KL {kl:.3g}, rel err {rel:.3g}; plain-position control: mean KL {control:.3g}")
    assert kl <= MAX_MEAN_KL and rel <= MAX_REL_ERR, f"{what}: mean KL {kl:.3g}, rel err {rel:.3g}"
    assert control > 1000 * max(kl, 1e-15), f"{what}: the control is as close as the reference ({control:.3g})"


def test_two_images_one_prefill(tern_bin, vlm, tmp_path):
    tern_logits(tern_bin, vlm, tmp_path / "tern.npy", *with_images(vlm))
    check(vlm, np.load(tmp_path / "tern.npy"), "one prefill")


def test_prefill_ending_inside_an_image_then_decode(tern_bin, vlm, tmp_path):
    tokens = np.load(vlm / "tokens.npy")
    first_image = int(np.argmax(tokens == tokens.max()))  # <|image_pad|> is V-2, the largest id after <|video_pad|>
    cut = first_image + 1  # one image token in the prefill, the rest of the image decoded one token at a time
    tern_logits(tern_bin, vlm, tmp_path / "tern.npy", *with_images(vlm), "--prefill", str(cut))
    check(vlm, np.load(tmp_path / "tern.npy"), f"prefill {cut} + decode")


def test_images_change_the_logits(tern_bin, vlm, tmp_path):
    """The same ids without the images (their <|image_pad|> embeddings as text) land far from the reference."""
    tern_logits(tern_bin, vlm, tmp_path / "text.npy")
    got, ref = np.load(tmp_path / "text.npy"), np.load(vlm / "expected.npy")
    real = np.isfinite(got[0])
    assert mean_kl(ref, got, real) > 1e-4


def test_runs_that_do_not_match_the_images_are_refused(tern_bin, vlm, tmp_path):
    grids = np.load(vlm / "grid_thw.npy")
    np.save(tmp_path / "one.npy", grids[:1])
    rows = int(np.prod(grids[0]))
    np.save(tmp_path / "px.npy", np.load(vlm / "pixel_values.npy")[:rows])
    r = tern_logits(tern_bin, vlm, tmp_path / "x.npy", "--image-pixels", str(tmp_path / "px.npy"),
                    "--image-grids", str(tmp_path / "one.npy"), check=False)
    assert r.returncode == 1 and "more runs of <|image_pad|>" in r.stderr, r.stderr[-2000:]
    swapped = grids[::-1].copy()
    np.save(tmp_path / "swapped.npy", swapped)
    if (swapped[0] != grids[0]).any() and np.prod(swapped[0]) != np.prod(grids[0]):
        r = tern_logits(tern_bin, vlm, tmp_path / "x.npy", "--image-pixels", str(vlm / "pixel_values.npy"),
                        "--image-grids", str(tmp_path / "swapped.npy"), check=False)
        assert r.returncode == 1 and "its grid makes" in r.stderr, r.stderr[-2000:]


# ---- The GPU runner (TERN_GPU_VLM=1 on a machine with an NVIDIA GPU; skipped elsewhere, as in CI) ----------------
# The language model at Qwen3.6's widths (4 layers: three Gated DeltaNet and one attention layer), every weight
# rounded to bf16 (as the checkpoint stores them) and run by `tern logits --device cuda --dtype bf16`: the vision
# encoder on the GPU's bf16 tensor-core kernels, the image rows and 3-axis positions through the CUDA runner's
# prefill and decode plans. The bound: mean KL <= 1e-3 against transformers in fp32 on the same values.
GPU_MAX_MEAN_KL = 1e-3

gpu = pytest.mark.skipif(os.environ.get("TERN_GPU_VLM") != "1", reason="TERN_GPU_VLM=1 runs it (needs a CUDA GPU)")


@pytest.fixture(scope="module")
def vlm_fullwidth(tmp_path_factory, fresh_seed):
    """TERN_GPU_VLM_MODEL: a folder vlm_reference.py --preset fullwidth --bf16 already made (made here otherwise)."""
    if os.environ.get("TERN_GPU_VLM_MODEL"):
        return pathlib.Path(os.environ["TERN_GPU_VLM_MODEL"])
    seed = fresh_seed("full-width vision-language checkpoint")
    out = tmp_path_factory.mktemp("vlm-gpu") / "model"
    r = subprocess.run([PY, str(ROOT / "tests/oracles/vlm_reference.py"), "--out", str(out), "--seed", str(seed),
                        "--grids", random_grids(seed), "--preset", "fullwidth", "--bf16"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def check_gpu(vlm, got, what):
    ref, plain = np.load(vlm / "expected.npy"), np.load(vlm / "plain_positions.npy")
    assert got.shape == ref.shape, (got.shape, ref.shape)
    real = np.isfinite(got[0])
    kl, control = mean_kl(ref, got, real), mean_kl(plain, got, real)
    grids = np.load(vlm / "grid_thw.npy").tolist()
    print(f"[cuda vs transformers, images] {what}: grids {grids}: mean KL {kl:.3g}; plain-position control: "
          f"mean KL {control:.3g}")
    assert kl <= GPU_MAX_MEAN_KL, f"{what}: mean KL {kl:.3g}"
    # The GPU's own error (bf16 weights and activations: 4.1e-4, H200, 2026-12-04) sits within 4.4x of what wrong
    # positions cost this 4-layer model (its one attention layer: the control at 1.8e-3), so the control asks for
    # logits clearly nearer the M-RoPE reference than the plain-position one: a run that ignored the 3-axis positions
    # would land near the control's reference instead.
    assert control > 2 * kl, f"{what}: the control ({control:.3g}) is not clearly further than the reference ({kl:.3g})"


@gpu
@pytest.mark.parametrize("prefill", [0, 1])
def test_gpu_two_images(tern_bin, vlm_fullwidth, tmp_path, prefill):
    """One prefill of the whole prompt, and a prefill that ends inside the first image (the rest one token a step)."""
    extra = ["--device", "cuda", "--dtype", "bf16", *with_images(vlm_fullwidth)]
    what = "one prefill"
    if prefill:
        tokens = np.load(vlm_fullwidth / "tokens.npy")
        cut = int(np.argmax(tokens == tokens.max())) + 1
        extra += ["--prefill", str(cut)]
        what = f"prefill {cut} + decode"
    tern_logits(tern_bin, vlm_fullwidth, tmp_path / "tern.npy", *extra)
    check_gpu(vlm_fullwidth, np.load(tmp_path / "tern.npy"), what)
