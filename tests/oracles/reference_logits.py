#!/usr/bin/env python3
"""Reference logits of a Qwen3.6-MoE checkpoint from transformers' Qwen3_5MoeForCausalLM in fp32 on the CPU.

    .venv/bin/python tests/oracles/reference_logits.py --model DIR (--tokens 1,2,3 | --tokens-file F)
            --out FILE.npy [--dump-activations DIR]

Writes float32 logits of every position, [T, V], from one full-sequence forward (HF's chunked Gated DeltaNet).
Every layout tern reads is accepted:
  * HF, as saved by Qwen3_5MoeForCausalLM (model.layers.*, per-expert or fused experts), or in the official form
    (model.language_model.*, fused experts; mtp.* and model.visual.* are skipped);
  * MLX (language_model.*), quantised or not: affine weights are dequantised exactly as tern does
    (w = scale * q + bias in fp32, LSB-first packing), zero-centred norms get their +1 removed, conv1d is moved
    back to [C, 1, Ck], and switch_mlp gate/up are fused into experts.gate_up_proj. The reference then runs on
    those dequantised fp32 weights.
--dump-activations writes the intermediates tern names the same way (embed, attn_norm.i, attn_out.i, moe_norm.i,
moe_out.i, layer_out.i, final_norm), each [T, D] float32.
"""
import argparse
import json
import pathlib
import re
import sys

import numpy as np

ZERO_CENTRED = re.compile(r"(input_layernorm|post_attention_layernorm|q_norm|k_norm)\.weight$|^model\.norm\.weight$")


def read_tokens(args):
    if args.tokens:
        return [int(x) for x in re.split(r"[,\s]+", args.tokens.strip()) if x]
    path = pathlib.Path(args.tokens_file)
    if path.suffix == ".npy":
        return [int(x) for x in np.load(path).reshape(-1)]
    return [int(x) for x in re.split(r"[,\s]+", path.read_text().strip()) if x]


def text_config(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    quant = cfg.get("quantization") or cfg.get("quantization_config") or {}
    tc = dict(cfg.get("text_config", cfg))
    tc.pop("quantization", None)
    tc.pop("quantization_config", None)
    return tc, quant


def load_hf_tensors(model_dir):
    import torch
    from safetensors import safe_open
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                out[k] = st.get_tensor(k).to(torch.float32)
    return out


def dequantize(w, scales, biases, group_size):
    """MLX affine dequantisation in fp32: w uint32 [..., cols*bits/32], scales/biases fp32 [..., cols/group]."""
    groups = scales.shape[-1]
    cols = groups * group_size
    bits = w.shape[-1] * 32 // cols
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    q = (w[..., None] >> shifts) & np.uint32((1 << bits) - 1)         # [..., words, per] LSB first
    q = q.reshape(*w.shape[:-1], cols).astype(np.float32)
    s = np.repeat(scales.astype(np.float32), group_size, axis=-1)
    b = np.repeat(biases.astype(np.float32), group_size, axis=-1)
    return (s * q + b).astype(np.float32)                               # fp32 multiply, then fp32 add


def load_mlx_tensors(model_dir, quant):
    import mlx.core as mx
    import torch
    raw = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            raw[k] = np.array(v) if v.dtype == mx.uint32 else np.array(v.astype(mx.float32))
    gs_default = int(quant.get("group_size", 64))
    out = {}
    for k, v in raw.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else k
        if base + ".scales" in raw:
            module = base
            spec = quant.get(module) or quant.get(module.replace("language_model.", "", 1)) or {}
            gs = int(spec.get("group_size", gs_default)) if isinstance(spec, dict) else gs_default
            v = dequantize(v, raw[base + ".scales"], raw[base + ".biases"], gs)
        out[k] = torch.from_numpy(np.ascontiguousarray(v))
    return out


def to_causal_state(tensors, layout):
    """Renames a checkpoint's tensors into Qwen3_5MoeForCausalLM's state dict."""
    import torch
    state, experts = {}, {}
    for k, v in tensors.items():
        if layout == "mlx":
            if not k.startswith("language_model."):
                continue  # vision tower
            k = k[len("language_model."):]
        if k.startswith("mtp.") or k.startswith("model.visual.") or k.startswith("vision_tower."):
            continue
        k = k.replace("model.language_model.", "model.", 1)
        if layout == "mlx":
            if ZERO_CENTRED.search(k):
                v = v - 1.0  # MLX stores 1 + w; HF adds the 1 back in fp32 (exact for these bf16 values)
            if k.endswith("linear_attn.conv1d.weight") and v.dim() == 3 and v.shape[-1] == 1:
                v = v.permute(0, 2, 1).contiguous()  # [C, Ck, 1] -> [C, 1, Ck]
            m = re.match(r"(.*\.mlp)\.switch_mlp\.(gate|up|down)_proj\.weight$", k)
            if m:
                experts.setdefault(m.group(1), {})[m.group(2)] = v
                continue
        m = re.match(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:  # per-expert HF form
            experts.setdefault(m.group(1), {}).setdefault(m.group(3) + "_list", {})[int(m.group(2))] = v
            continue
        state[k] = v
    for prefix, parts in experts.items():
        if "gate" in parts:
            gate, up, down = parts["gate"], parts["up"], parts["down"]
        else:
            n = len(parts["gate_list"])
            gate = torch.stack([parts["gate_list"][e] for e in range(n)])
            up = torch.stack([parts["up_list"][e] for e in range(n)])
            down = torch.stack([parts["down_list"][e] for e in range(n)])
        state[prefix + ".experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        state[prefix + ".experts.down_proj"] = down.contiguous()
    return state


def build_model(model_dir):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    tc, quant = text_config(model_dir)
    names = []
    for f in sorted(model_dir.glob("*.safetensors")):
        from safetensors import safe_open
        with safe_open(str(f), framework="np") as st:
            names += list(st.keys())
    layout = "mlx" if any(n.startswith("language_model.") for n in names) else "hf"
    tensors = load_mlx_tensors(model_dir, quant) if layout == "mlx" else load_hf_tensors(model_dir)
    for k in ("model_type", "architectures", "dtype", "torch_dtype", "transformers_version"):
        tc.pop(k, None)
    config = Qwen3_5MoeTextConfig(**tc)
    config._attn_implementation = "eager"
    with torch.device("cpu"):
        model = Qwen3_5MoeForCausalLM(config).to(torch.float32)
    state = to_causal_state(tensors, layout)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"reference_logits: state dict mismatch; missing {missing[:8]}, unexpected {unexpected[:8]}")
    model.eval()
    return model, layout


def add_dump_hooks(model, store):
    def hook(name):
        def fn(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            store[name] = out.detach().to("cpu").float().numpy()[0]
        return fn
    m = model.model
    m.embed_tokens.register_forward_hook(hook("embed"))
    for i, layer in enumerate(m.layers):
        layer.input_layernorm.register_forward_hook(hook(f"attn_norm.{i}"))
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        mixer.register_forward_hook(hook(f"attn_out.{i}"))
        layer.post_attention_layernorm.register_forward_hook(hook(f"moe_norm.{i}"))
        layer.mlp.register_forward_hook(hook(f"moe_out.{i}"))
        layer.register_forward_hook(hook(f"layer_out.{i}"))
    m.norm.register_forward_hook(hook("final_norm"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--tokens-file")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump-activations")
    args = ap.parse_args()
    if bool(args.tokens) == bool(args.tokens_file):
        sys.exit("give exactly one of --tokens and --tokens-file")
    import torch
    torch.manual_seed(0)
    model, _ = build_model(pathlib.Path(args.model))
    ids = torch.tensor([read_tokens(args)], dtype=torch.long)
    store = {}
    if args.dump_activations:
        add_dump_hooks(model, store)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
    np.save(args.out, np.ascontiguousarray(logits, dtype=np.float32))
    if args.dump_activations:
        d = pathlib.Path(args.dump_activations)
        d.mkdir(parents=True, exist_ok=True)
        for k, v in store.items():
            np.save(d / f"{k}.npy", np.ascontiguousarray(v, dtype=np.float32))


if __name__ == "__main__":
    main()
