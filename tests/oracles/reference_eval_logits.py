#!/usr/bin/env python3
"""Reference logits for `tern eval`: a model run teacher-forced over a token file, every position's logits saved.

    .venv/bin/python tests/oracles/reference_eval_logits.py --model DIR --tokens TOKENS --out LOGITS.npy
            [--engine transformers|mlx] [--dtype float32|bfloat16] [--device cpu|cuda]
            [--random-tokens N --seed S]      (draw N ids, write them to TOKENS as int32 .npy, then run)

transformers (default): an HF-layout folder (BF16 or fp32 safetensors) through AutoModelForCausalLM, in --dtype
(float32 for the CPU fidelity check; bfloat16 fits the full model on one H200). mlx: an MLX-layout folder (4-bit or
not) through mlx-lm, so the reference reads the same quantised bytes tern does. TOKENS is a .npy of int32 ids or a
text file of integers. LOGITS.npy is float32 [N, V] over the model's padded vocabulary (tern eval masks ids past the
tokenizer's). Then:

    tern eval -m DIR --tokens-file TOKENS --reference LOGITS.npy
"""
import argparse
import json
import pathlib
import sys

import numpy as np


def read_tokens(path):
    p = pathlib.Path(path)
    if p.suffix == ".npy":
        ids = np.load(p).reshape(-1)
    else:
        text = p.read_text().replace(",", " ").replace("[", " ").replace("]", " ")
        ids = np.array([int(t) for t in text.split()], dtype=np.int64)
    if ids.size == 0:
        sys.exit(f"{path}: no token ids")
    return ids.astype(np.int32)


def vocab_real(model_dir):
    """Ids the tokenizer defines (max id + 1), else config's vocab_size."""
    d = pathlib.Path(model_dir)
    tok = d / "tokenizer.json"
    if tok.exists():
        t = json.loads(tok.read_text())
        ids = list(t.get("model", {}).get("vocab", {}).values()) + [a["id"] for a in t.get("added_tokens", [])]
        if ids:
            return max(ids) + 1
    cfg = json.loads((d / "config.json").read_text())
    return int(cfg.get("text_config", cfg)["vocab_size"])


def run_transformers(args, ids):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    with torch.no_grad():
        x = torch.tensor(ids, dtype=torch.long, device=args.device)[None, :]
        logits = model(input_ids=x, use_cache=False).logits[0]
    return logits.float().cpu().numpy()


def run_mlx(args, ids):
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(args.model)
    logits = model(mx.array(ids.astype(np.int32))[None, :])[0]
    return np.array(logits.astype(mx.float32))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument("--tokens", required=True, help="token file to read (or to write with --random-tokens)")
    ap.add_argument("--out", required=True, help="LOGITS.npy to write, float32 [N, V]")
    ap.add_argument("--engine", choices=["transformers", "mlx"], default="transformers")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default="cpu", help="torch device (transformers only)")
    ap.add_argument("--random-tokens", type=int, default=0, help="draw this many ids and write them to --tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    if args.random_tokens > 0:
        rng = np.random.default_rng(args.seed)
        ids = rng.integers(0, vocab_real(args.model), size=args.random_tokens, dtype=np.int64).astype(np.int32)
        np.save(args.tokens, ids)
    else:
        ids = read_tokens(args.tokens)
    logits = run_transformers(args, ids) if args.engine == "transformers" else run_mlx(args, ids)
    assert logits.ndim == 2 and logits.shape[0] == ids.size, logits.shape
    np.save(args.out, np.ascontiguousarray(logits, dtype=np.float32))
    print(f"{args.out}: logits [{logits.shape[0]}, {logits.shape[1]}] from {args.engine} ({args.dtype})")


if __name__ == "__main__":
    main()
