#!/usr/bin/env python3
"""Builds a random-weight Qwen3.6 vision-language checkpoint (the language model of make_model.py with a small vision
encoder of the real structure) and transformers' logits of a prompt holding images.

    .venv/bin/python tests/oracles/vlm_reference.py --out DIR --seed N [--grids "1,8,12;1,6,4"] [--layers 4]
            [--text 5] [--preset tiny|realdims|fullwidth] [--bf16]

--preset fullwidth gives the language model Qwen3.6's widths (the GPU runner's kernels take those); --bf16 rounds
every weight, the vision tower's included, to bf16 before the reference runs (still in fp32 on those values), as
Qwen3.6's checkpoint stores them: the GPU then computes on exactly the reference's weights.

DIR becomes a whole checkpoint in the official form (config.json: model_type qwen3_5_moe with text_config and
vision_config; model.safetensors: model.language_model.*, lm_head.*, model.visual.*, fp32) with make_model.py's tiny
tokenizer, whose last rows are free: <|vision_start|>, <|vision_end|>, <|image_pad|> and <|video_pad|> take ids
V-4 .. V-1 there. Beside it:
  tokens.npy       int32 [T]: random text ids, then per image <|vision_start|>, one <|image_pad|> per merged 2 x 2
                   block (t·h·w / 4), <|vision_end|> and more random text (a chat's layout)
  pixel_values.npy float32 [patches, 1536] uniform in [-1, 1] (the images' patches, one image after another)
  grid_thw.npy     int32 [images, 3]
  expected.npy     float32 [T, V]: Qwen3_5MoeForConditionalGeneration's logits of the whole prompt (fp32, CPU, one
                   forward with input_ids, pixel_values, image_grid_thw and mm_token_type_ids)
  plain_positions.npy  the same forward with the plain positions 0 .. T-1 on every axis instead of M-RoPE's: a
                   control that shows how far a model that ignored the images' 3-axis positions would land
Vision weights are random as in vision_reference.py (matrices and biases N(0, 0.05), LayerNorms 1 + N(0, 0.1) and
N(0, 0.1), the position table N(0, 0.5)). The same seed gives the same files.
"""
import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5MoeConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

ROOT = pathlib.Path(__file__).resolve().parents[2]
VISION = dict(depth=2, hidden_size=64, intermediate_size=96, num_heads=4, num_position_embeddings=64,
              hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
              spatial_merge_size=2, deepstack_visual_indexes=[])


def make_text_model(out, seed, layers, preset, bf16):
    r = subprocess.run([sys.executable, str(ROOT / "tests/oracles/make_model.py"), "--out", str(out), "--seed",
                        str(seed), "--layers", str(layers), "--hf-format", "official", "--no-mtp", "--dtype",
                        "bfloat16" if bf16 else "float32", "--preset", preset], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)


def randomise_vision(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.model.visual.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("pos_embed.weight"):
                p.copy_(noise * 0.5)
            elif "norm" in name and name.endswith(".weight"):
                p.copy_(1 + noise * 0.1)
            elif "norm" in name:
                p.copy_(noise * 0.1)
            else:
                p.copy_(noise * 0.05)


def prompt(rng, grids, ids, text_len):
    """Random text around the images' runs, as a chat lays them out."""
    tokens = [int(x) for x in rng.integers(0, 256, size=text_len)]
    for t, h, w in grids:
        tokens += [ids["start"]] + [ids["image"]] * (t * h * w // 4) + [ids["end"]]
        tokens += [int(x) for x in rng.integers(0, 256, size=text_len)]
    return tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--grids", default="1,8,12;1,6,4", help="t,h,w per image (even h, w), ';' between images")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--text", type=int, default=5, help="random text tokens before, between and after the images")
    ap.add_argument("--preset", default="tiny", help="make_model.py's widths of the language model")
    ap.add_argument("--bf16", action="store_true", help="every weight rounded to bf16 (the reference still in fp32)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    make_text_model(out, args.seed, args.layers, args.preset, args.bf16)

    config = json.loads((out / "config.json").read_text())
    vocab = config["text_config"]["vocab_size"]
    ids = {"start": vocab - 4, "end": vocab - 3, "image": vocab - 2, "video": vocab - 1}
    config["vision_config"] = dict(VISION, out_hidden_size=config["text_config"]["hidden_size"],
                                   model_type="qwen3_5_moe_vision")
    config.update(image_token_id=ids["image"], video_token_id=ids["video"], vision_start_token_id=ids["start"],
                  vision_end_token_id=ids["end"])
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    hf_config = Qwen3_5MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                   "transformers_version")})
    hf_config.vision_config._attn_implementation = "eager"
    hf_config.text_config._attn_implementation = "eager"
    hf_config._attn_implementation = "eager"
    model = Qwen3_5MoeForConditionalGeneration(hf_config).eval().float()
    state = load_file(str(out / "model.safetensors"))
    state = {k: v for k, v in state.items() if not k.startswith("model.visual.")}  # make_model's stand-ins
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith("model.visual.") for k in missing), [k for k in missing if "visual" not in k]
    randomise_vision(model, args.seed + 7)
    if args.bf16:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    dtype = torch.bfloat16 if args.bf16 else torch.float32  # --bf16: the values are bf16's, stored so (half the bytes)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    grids = [[int(v) for v in g.split(",")] for g in args.grids.split(";")]
    rng = np.random.default_rng(args.seed)
    tokens = prompt(rng, grids, ids, args.text)
    patches = sum(t * h * w for t, h, w in grids)
    pixels = rng.uniform(-1, 1, size=(patches, 3 * 2 * 16 * 16)).astype(np.float32)
    input_ids = torch.tensor([tokens])
    with torch.no_grad():
        inputs = dict(input_ids=input_ids, pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids),
                      mm_token_type_ids=(input_ids == ids["image"]).int(), use_cache=False)
        logits = model(**inputs).logits[0]
        plain = torch.arange(len(tokens)).view(1, 1, -1).expand(3, 1, -1)
        plain_logits = model(**inputs, position_ids=plain).logits[0]
    np.save(out / "tokens.npy", np.array(tokens, dtype=np.int32))
    np.save(out / "pixel_values.npy", pixels)
    np.save(out / "grid_thw.npy", np.array(grids, dtype=np.int32))
    np.save(out / "expected.npy", logits.float().numpy())
    np.save(out / "plain_positions.npy", plain_logits.float().numpy())
    print(out)


if __name__ == "__main__":
    main()
