"""The language model's M-RoPE positions (src/model/mrope) and interleaved angles (src/cpu/ops_rope mrope_angles)
against transformers: Qwen3_5MoeModel.get_rope_index and Qwen3_5MoeTextRotaryEmbedding's frequency recomposition,
on random prompts made afresh each run (text runs, images of random grids between <|vision_start|> and
<|vision_end|>, videos whose frames are separated by timestamp text, as the chat template lays them out), through
tests/tools/mrope_probe.cpp (tern_mrope_probe). Positions and delta must be equal; the angles bit for bit.
Text-only prompts keep the plain positions 0 .. n-1 on every axis, and a run of image tokens that does not match
its grid is refused with a message (exit 1)."""
import json
import random
import subprocess
import types

import numpy as np
import pytest
import torch
from transformers import Qwen3_5MoeConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeModel, Qwen3_5MoeTextRotaryEmbedding

IMAGE, VIDEO, START, END = 248056, 248057, 248053, 248054


@pytest.fixture(scope="module")
def probe(tern_tool):
    return tern_tool("tern_mrope_probe")


def random_prompt(rng, images, videos):
    """Token ids and grids: text runs around images and videos in a random order."""
    tokens, image_grids, video_grids = [], [], []
    text = lambda: [rng.randrange(0, 248000) for _ in range(rng.randint(1, 12))]
    items = ["image"] * images + ["video"] * videos
    rng.shuffle(items)
    tokens += text()
    for item in items:
        if item == "image":
            g = [1, 2 * rng.randint(1, 12), 2 * rng.randint(1, 12)]
            image_grids.append(g)
            tokens += [START] + [IMAGE] * (g[1] * g[2] // 4) + [END]
        else:
            g = [rng.randint(1, 3), 2 * rng.randint(1, 6), 2 * rng.randint(1, 6)]
            video_grids.append(g)
            for _ in range(g[0]):  # "<0.5 seconds>" before each frame
                tokens += text() + [START] + [VIDEO] * (g[1] * g[2] // 4) + [END]
        tokens += text()
    return tokens, image_grids, video_grids


def reference(tokens, image_grids, video_grids, section, rot, theta):
    cfg = Qwen3_5MoeConfig()
    fake = types.SimpleNamespace(config=cfg, get_vision_position_ids=lambda *a, **k:
                                 Qwen3_5MoeModel.get_vision_position_ids(None, *a, **k))
    ids = torch.tensor([tokens])
    kinds = (ids == IMAGE).int() + 2 * (ids == VIDEO).int()
    pos, delta = Qwen3_5MoeModel.get_rope_index(
        fake, ids, mm_token_type_ids=kinds,
        image_grid_thw=torch.tensor(image_grids) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids) if video_grids else None)
    text_cfg = cfg.text_config
    text_cfg.head_dim = rot  # partial_rotary_factor 1 below: rot rotary dims
    text_cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 1.0,
                                "mrope_section": section, "mrope_interleaved": True}
    rotary = Qwen3_5MoeTextRotaryEmbedding(text_cfg)
    freqs = pos[..., None].float() * rotary.inv_freq
    angles = rotary.recomposition_frequencies(freqs)[0, :, : rot // 2]
    return pos[:, 0].numpy(), int(delta[0, 0]), angles.numpy()


def run_probe(probe, tmp, tokens, image_grids, video_grids, section, rot, theta, check=True):
    spec = {"tokens": tokens, "images": image_grids, "videos": video_grids, "image_token_id": IMAGE,
            "video_token_id": VIDEO, "merge": 2, "section": section, "rot": rot, "theta": theta}
    (tmp / "in.json").write_text(json.dumps(spec))
    r = subprocess.run([str(probe), str(tmp / "in.json"), str(tmp)], capture_output=True, text=True, timeout=60)
    if not check:
        return r
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(tmp / "positions.npy"), json.loads(r.stdout)["delta"], np.load(tmp / "angles.npy")


@pytest.mark.parametrize("section,rot,theta", [([11, 11, 10], 64, 1e7), ([3, 3, 2], 16, 1e4)])
def test_positions_and_angles_match_transformers(probe, tmp_path, section, rot, theta, fresh_seed):
    seed = fresh_seed(f"M-RoPE {section}")
    rng = random.Random(seed)
    for case in range(12):
        images, videos = rng.randint(0, 3), rng.randint(0, 2) if case % 3 == 0 else 0
        tokens, image_grids, video_grids = random_prompt(rng, images, videos)
        ref_pos, ref_delta, ref_angles = reference(tokens, image_grids, video_grids, section, rot, theta)
        pos, delta, angles = run_probe(probe, tmp_path, tokens, image_grids, video_grids, section, rot, theta)
        where = f"case {case}: images {image_grids}, videos {video_grids}"
        np.testing.assert_array_equal(pos, ref_pos, err_msg=where)
        assert delta == ref_delta, where
        np.testing.assert_array_equal(angles, ref_angles, err_msg=where)


def test_text_only_positions_are_plain(probe, tmp_path):
    tokens = list(range(100, 137))
    pos, delta, angles = run_probe(probe, tmp_path, tokens, [], [], [11, 11, 10], 64, 1e7)
    assert delta == 0
    for axis in range(3):
        np.testing.assert_array_equal(pos[axis], np.arange(len(tokens)))


def test_mismatched_runs_are_refused(probe, tmp_path):
    tokens = [1, START] + [IMAGE] * 5 + [END, 2]
    r = run_probe(probe, tmp_path, tokens, [[1, 4, 4]], [], [11, 11, 10], 64, 1e7, check=False)
    assert r.returncode == 1 and "has 5 tokens at position 2 but its grid (1, 4, 4) makes 4" in r.stderr, r.stderr
    r = run_probe(probe, tmp_path, [1, START, IMAGE, END], [], [], [11, 11, 10], 64, 1e7, check=False)
    assert r.returncode == 1 and "more runs of image tokens than the 0 image grid(s)" in r.stderr, r.stderr
    r = run_probe(probe, tmp_path, [1, 2], [[1, 2, 2]], [], [11, 11, 10], 64, 1e7, check=False)
    assert r.returncode == 1 and "1 image grid(s) given but the prompt has 0" in r.stderr, r.stderr
