#!/usr/bin/env python3
"""Builds a random-weight vision encoder of Qwen3.6-35B-A3B's structure (transformers' Qwen3_5MoeVisionModel) and
its reference output on random pixel_values.

    .venv/bin/python tests/oracles/vision_reference.py --out DIR --seed N [--preset small|real] [--layers L]
            [--layout hf|mlx] [--dtype float32|bfloat16] [--grids "1,8,12;1,6,4"] [--out-hidden D]

Writes DIR/config.json (model_type qwen3_5_moe: a text_config whose hidden_size is the encoder's output width, and
the vision_config), DIR/model.safetensors (the encoder's tensors only: model.visual.* as in the official HF
checkpoint, or vision_tower.* with the Conv3d weight channels-last [Dv, Tp, P, P, C] as mlx-vlm's sanitize stores
it), DIR/pixel_values.npy (float32 [N, C*Tp*P*P], uniform in [-1, 1]), DIR/grid_thw.npy (int32 [images, 3]) and
DIR/expected.npy (float32 pooler_output [N / 4, out_hidden_size]: the language model's image-token embeddings).
Every parameter is random: matrices N(0, 0.05), biases N(0, 0.05), LayerNorm weights 1 + N(0, 0.1) and biases
N(0, 0.1), the position table N(0, 0.5). With --dtype bfloat16 the weights are rounded to bf16, stored so, and the
reference runs in fp32 on the rounded values. The same seed gives the same files.
"""
import argparse
import json
import pathlib

import numpy as np
import torch
from safetensors.torch import save_file
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeVisionConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeVisionModel

PRESETS = {
    # A few layers at small widths, the real structure (patches 2 x 16 x 16 of 3 channels, merge 2 x 2).
    "small": dict(hidden_size=64, intermediate_size=96, num_heads=4, out_hidden_size=48,
                  num_position_embeddings=64),
    # Qwen3.6-35B-A3B's widths (config.json's vision_config).
    "real": dict(hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048,
                 num_position_embeddings=2304),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--layout", choices=["hf", "mlx"], default="hf")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--grids", default="1,8,12;1,6,4", help="t,h,w per image, ';' between images")
    ap.add_argument("--out-hidden", type=int, default=None, help="out_hidden_size (the LM width) instead of the "
                    "preset's, e.g. to join the encoder to a make_model.py checkpoint")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    vision = dict(depth=args.layers, hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, deepstack_visual_indexes=[],
                  **PRESETS[args.preset])
    if args.out_hidden:
        vision["out_hidden_size"] = args.out_hidden
    config = Qwen3_5MoeVisionConfig(**vision)
    config._attn_implementation = "eager"
    model = Qwen3_5MoeVisionModel(config).eval().float()
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("pos_embed.weight"):
                p.copy_(noise * 0.5)
            elif ("norm" in name) and name.endswith(".weight"):
                p.copy_(1 + noise * 0.1)
            elif "norm" in name:
                p.copy_(noise * 0.1)
            else:
                p.copy_(noise * 0.05)
            if args.dtype == "bfloat16":
                p.copy_(p.to(torch.bfloat16).float())

    grids = [[int(v) for v in grid.split(",")] for grid in args.grids.split(";")]
    grid_thw = torch.tensor(grids, dtype=torch.long)
    patches = int(sum(t * h * w for t, h, w in grids))
    patch_dim = 3 * 2 * 16 * 16
    pixels = rng.uniform(-1, 1, size=(patches, patch_dim)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(pixels), grid_thw=grid_thw).pooler_output

    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    prefix = "model.visual." if args.layout == "hf" else "vision_tower."
    tensors = {}
    for name, p in model.state_dict().items():
        t = p.detach().to(dtype)
        if args.layout == "mlx" and name == "patch_embed.proj.weight":
            t = t.permute(0, 2, 3, 4, 1)  # [Dv, C, Tp, P, P] -> [Dv, Tp, P, P, C]
        tensors[prefix + name] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    text = {"model_type": "qwen3_5_moe_text", "hidden_size": vision["out_hidden_size"], "num_hidden_layers": 4}
    top = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": text, "vision_config": dict(vision, model_type="qwen3_5_moe_vision"),
           "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
           "vision_end_token_id": 248054}
    (out / "config.json").write_text(json.dumps(top, indent=2) + "\n")
    np.save(out / "pixel_values.npy", pixels)
    np.save(out / "grid_thw.npy", np.array(grids, dtype=np.int32))
    np.save(out / "expected.npy", expected.float().numpy())
    print(out)


if __name__ == "__main__":
    main()
