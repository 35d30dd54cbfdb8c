#!/usr/bin/env python3
"""Reference logits for the CUDA whole-model test: transformers on the same dequantised weights tern reads.

    python3 tests/oracles/gpu_reference.py --out DIR [--seed N] [--layers 4] [--positions 256] [--device cuda]

Builds a random Qwen3.6 text model with the real widths (D 2048, 256 experts top-8, real heads) and reduced depth,
quantises it the MLX way (affine, group 64, 4-bit; the router and shared-expert gate 8-bit) and writes it as an
MLX-layout checkpoint DIR/model (config.json + model.safetensors). The transformers model is then given exactly the
dequantised values (s·q + b) and the stored norms, and runs teacher-forced in fp32 over random tokens:
DIR/tokens.bin (int32 [n]) and DIR/logits.bin (float32 [n, V]). test_cuda's CudaWholeModel.*Transformers
reads them when TERN_GPU_REF_DIR=DIR. Runs where transformers with qwen3_5_moe is installed (the GPU machine has
torch 2.11 + transformers 5.17; no mlx needed).

Two weight scales (--scales):
  trained (the default): the scales transformers initialises and trained checkpoints have: every matrix, the
           embeddings and the router std 0.02 (router logits of about one unit, so the 8th and 9th experts are often
           within 0.01 of each other: near-ties), norm multipliers 1 + N(0, 0.05). An oracle on which a fast path's
           rounding shows: every error in the residual stream moves some expert choice.
  easy:    the earlier scheme: router and embeddings N(0, 1) (router logits tens of units apart, no near-ties), norm
           multipliers 1 + N(0, 0.1).
Both draw the LM head with std --lm-head-std (default 0.1, five times the matrices'): logits of std ~4.5 give a mean
entropy of ~2-3 nats, like a trained model's next-token distributions (std 0.02 would make them nearly uniform).
"""
import argparse
import contextlib
import json
import math
import pathlib
import re
import struct
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_model import PRESETS, rope_sections  # noqa: E402

ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")
EIGHT_BIT = (".mlp.gate.weight", ".mlp.shared_expert_gate.weight")


def log(msg):
    print(f"[gpu_reference {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def bf16_round(t, torch):
    return t.to(torch.bfloat16).to(torch.float32)


def bf16_bytes(t, torch):
    return t.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().tobytes()


def dequantised(w, bits, torch, group=64):
    """quantise's dequantised values alone (the same arithmetic), made a slice of the first axis at a time so that a
    stacked expert tensor needs little memory beside itself."""
    if w.dim() < 3:
        return quantise(w, bits, torch, group, pack=False)[3]
    out = torch.empty_like(w)
    for e0 in range(0, w.shape[0], 16):
        out[e0:e0 + 16] = quantise(w[e0:e0 + 16], bits, torch, group, pack=False)[3]
    return out


def affine_groups(w, bits, torch, group=64):
    """quantise's arithmetic: w's groups of `group` along the last axis as codes q (fp32 integers in [0, 2^bits − 1],
    [..., C/group, group]), scales s and biases b (bf16-rounded, fp32, [..., C/group, 1]); s·q + b dequantises."""
    qmax = (1 << bits) - 1
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group).to(torch.float32)
    mn, mx = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
    s = bf16_round(torch.clamp((mx - mn) / qmax, min=1e-8), torch)
    b = bf16_round(mn, torch)
    return torch.clamp(torch.round((g - b) / s), 0, qmax), s, b


def quantise(w, bits, torch, group=64, pack=True):
    """MLX affine quantisation along the last axis: returns (packed uint32 ndarray, scales, biases, dequantised);
    packed is None without pack.

    s = (max - min) / (2^bits - 1) and b = min per group, both rounded to bf16; q = round((w - b) / s) clamped.
    The reference uses s·q + b in fp32, exactly what tern's kernels compute from the stored values.
    """
    shape = w.shape
    q, s, b = affine_groups(w, bits, torch, group)
    deq = (s * q + b).reshape(shape)
    if not pack:
        return None, s.squeeze(-1), b.squeeze(-1), deq
    per = 32 // bits
    qi = q.to(torch.int64).reshape(*shape[:-1], shape[-1] // per, per)
    shifts = (torch.arange(per, device=w.device, dtype=torch.int64) * bits)
    packed = (qi << shifts).sum(dim=-1)  # < 2^32
    packed_np = packed.cpu().numpy().astype(np.uint32)
    return packed_np, s.squeeze(-1), b.squeeze(-1), deq


def expert_codes(w, bits, torch, group=64):
    """quantise's codes of a stacked expert tensor w [E, R, C], small: q as uint8 [E, R, C/64, 64], s and b in fp32
    [E, R, C/64, 1]; (s * q.float() + b).reshape(E, R, C) is quantise's dequantised value bit for bit. Made 16 experts
    at a time, as dequantised."""
    E, R, C = w.shape
    q = torch.empty(E, R, C // group, group, dtype=torch.uint8, device=w.device)
    s = torch.empty(E, R, C // group, 1, dtype=torch.float32, device=w.device)
    b = torch.empty_like(s)
    for e0 in range(0, E, 16):
        qe, s[e0:e0 + 16], b[e0:e0 + 16] = affine_groups(w[e0:e0 + 16], bits, torch, group)
        q[e0:e0 + 16] = qe.to(torch.uint8)
    return q, s, b


def mlx_matrices(mlx, shape):
    """The MLX names (less .weight, .scales, .biases) of the matrix parameter named `mlx` (HF's name with MLX's prefix)
    of shape `shape`, each with the rows (a slice of axis 1) it takes from it, None for all of them: the experts'
    fused gate_up_proj [E, 2F, D] is switch_mlp.gate_proj (rows 0..F-1) and switch_mlp.up_proj (F..2F-1), [E, F, D]
    each; experts.down_proj is switch_mlp.down_proj; any other matrix keeps its name."""
    if mlx.endswith("mlp.experts.gate_up_proj"):
        F = shape[1] // 2
        base = mlx[: -len("experts.gate_up_proj")] + "switch_mlp."
        return [(base + "gate_proj", slice(0, F)), (base + "up_proj", slice(F, 2 * F))]
    if mlx.endswith("mlp.experts.down_proj"):
        return [(mlx[: -len("experts.down_proj")] + "switch_mlp.down_proj", None)]
    return [(mlx[: -len(".weight")] if mlx.endswith(".weight") else mlx, None)]


def save_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, bytes). Writes the safetensors format directly."""
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, (_, _, data) in tensors.items():
            f.write(data)


def default_layer_types(layers):
    """The model's pattern: three Gated DeltaNet layers, then a gated-attention one."""
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]


def fp64_model_class():
    """transformers' Qwen3_5MoeForCausalLM run in fp64 throughout: its modeling file, with every cast to fp32 in it
    (the norms, the Gated DeltaNet's recurrence, the softmaxes, rotary embeddings) made a cast to fp64, loaded as a
    module of its own beside the original. The fp32 reference's own rounding is then measurable: the difference between
    the two runs on the same values is how far transformers in fp32 is from the exact result."""
    import importlib.util

    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as original

    # transformers takes these packages' kernels (fp32 / bf16 only) over its own PyTorch code where they import
    for package in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(package) is not None:
            raise SystemExit(f"gpu_reference.py --fp64: `{package}` is installed, and transformers would run its "
                             "kernels (not fp64) instead of its PyTorch code; run it where it is not")

    src = pathlib.Path(original.__file__).read_text()
    src = src.replace("torch.float32", "torch.float64").replace(".float()", ".double()")
    src = re.sub(r"torch\.float\b", "torch.float64", src)  # dtype=torch.float (not torch.float64: no boundary)
    name = original.__name__ + "_fp64"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = original.__package__
    module.__file__ = original.__file__
    sys.modules[name] = module
    module.fp64_source = src  # what ran (tests/py/test_gpu_reference_fp64.py reads it)
    exec(compile(src, original.__file__ + " (fp64)", "exec"), module.__dict__)  # noqa: S102 (transformers' own code)
    return module.Qwen3_5MoeForCausalLM


def build_model(args, seed, dev, mdir=None, layer_types=None, lean_experts=False, fp64=False):
    """The random model of args (preset, layers, scales, weights, lm_head_std) drawn from `seed`, as transformers'
    Qwen3_5MoeForCausalLM in fp32 on `dev` holding the values tern reads (dequantised where quantised). With fp64 (no
    mdir), the same values in fp64_model_class(): the model in fp64 throughout (every value drawn is exact in it).
    With mdir, the MLX-layout checkpoint is written there too (config.json + model.safetensors); without it only the
    model is made (less memory: nothing packed). layer_types: default_layer_types(args.layers) unless given.
    lean_experts (4-bit weights, no mdir): the routed experts are kept as their 4-bit codes instead, in each experts
    module's `codes` (name -> expert_codes' q, s, b), their fp32 parameters left empty (a quarter of the memory: 8
    layers fit a 24 GB machine), so only a forward that dequantises them (rounding_effect.py's) can run the model.
    The same draws either way: the same model."""
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    if lean_experts and (mdir is not None or args.weights != "q4"):
        raise ValueError("lean_experts holds 4-bit codes: q4 weights and no checkpoint (mdir None) only")
    if fp64 and (mdir is not None or lean_experts):
        raise ValueError("fp64: the model alone (no checkpoint, no lean experts)")
    dtype = torch.float64 if fp64 else torch.float32
    model_class = fp64_model_class() if fp64 else Qwen3_5MoeForCausalLM

    trained = args.scales == "trained"
    norm_std = 0.05 if trained else 0.1
    wide_std = 0.02 if trained else 1.0  # router and embeddings
    dims = dict(PRESETS[args.preset])
    L = args.layers
    layer_types = layer_types or default_layer_types(L)
    rotary = int(dims["head_dim"] * 0.25)
    rope = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_interleaved": True, "mrope_section": rope_sections(rotary // 2)}
    cfg = Qwen3_5MoeTextConfig(num_hidden_layers=L, layer_types=layer_types, max_position_embeddings=262144,
                               rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=rope,
                               bos_token_id=0, eos_token_id=0, pad_token_id=None, **dims)
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            no_init_weights = contextlib.nullcontext
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the parameters made in their dtype (fp64: no fp32 copy beside them)
    try:
        with dev, no_init_weights():
            model = model_class(cfg)
    finally:
        torch.set_default_dtype(default_dtype)  # the draws below stay fp32, the same values whatever the dtype
    if fp64:
        model.config._experts_implementation = "eager"  # grouped_mm has no fp64 form; the per-expert loop has
    model = model.to(device=dev, dtype=dtype).eval()
    log("model built")

    g = torch.Generator(device=dev).manual_seed(seed)
    ckpt = mdir is not None
    tensors = {}
    quant = {"group_size": 64, "bits": 4, "mode": "affine"}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            shape = tuple(p.shape)
            randn = lambda: torch.randn(shape, generator=g, device=dev)  # noqa: E731
            if name.endswith(ZERO_CENTRED) or name == "model.norm.weight":
                w = randn() * norm_std
            elif name.endswith("linear_attn.norm.weight"):
                w = 1.0 + randn() * norm_std
            elif name.endswith("A_log"):
                w = torch.empty(shape, device=dev).uniform_(1.0, 16.0, generator=g).log_()
            elif name.endswith("dt_bias"):
                w = randn() * 0.5
            elif name.endswith("conv1d.weight"):
                w = randn() * 0.3
            elif name.endswith("mlp.gate.weight"):
                w = randn() * wide_std
            elif name == "lm_head.weight":
                w = randn() * args.lm_head_std
            elif name.endswith("embed_tokens.weight"):
                w = randn() * wide_std
            else:
                w = randn().mul_(0.02)  # in place: the same values, one fewer copy of a layer's experts alive
            # HF model.X -> MLX language_model.model.X; lm_head.weight -> language_model.lm_head.weight
            mlx = "language_model." + name
            if name.endswith(ZERO_CENTRED) or name == "model.norm.weight":
                stored = bf16_round(1.0 + w, torch)          # MLX keeps the multiplier (1 + w)
                p.copy_(stored - 1.0)                        # exact in fp32: HF's (1 + w) == stored
                if ckpt:
                    tensors[mlx] = ("BF16", shape, bf16_bytes(stored, torch))
            elif name.endswith(("linear_attn.norm.weight", "A_log", "dt_bias")):
                stored = bf16_round(w, torch)
                p.copy_(stored)
                if ckpt:
                    tensors[mlx] = ("BF16", shape, bf16_bytes(stored, torch))
            elif name.endswith("conv1d.weight"):            # HF [C, 1, Ck] -> MLX [C, Ck, 1]
                stored = bf16_round(w, torch)
                p.copy_(stored)
                if ckpt:
                    tensors[mlx] = ("BF16", (shape[0], shape[2], 1), bf16_bytes(stored.permute(0, 2, 1), torch))
            elif args.weights == "bf16":
                stored = bf16_round(w, torch)
                p.copy_(stored)
                for base, rows in mlx_matrices(mlx, shape) if ckpt else []:
                    t = stored if rows is None else stored[:, rows, :].contiguous()
                    tensors[base + ".weight"] = ("BF16", tuple(t.shape), bf16_bytes(t, torch))
            else:
                bits = 8 if name.endswith(EIGHT_BIT) else 4
                if bits == 8:
                    quant[mlx[: -len(".weight")]] = {"group_size": 64, "bits": 8}
                if lean_experts and not ckpt and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    module = model.get_submodule(name.rsplit(".", 1)[0])
                    leaf = name.rsplit(".", 1)[1]
                    if not hasattr(module, "codes"):
                        module.codes = {}
                    module.codes[leaf] = expert_codes(w, bits, torch)
                    del w  # before the next draw: one layer's experts in fp32 at a time
                    # the old parameter, never written, took no memory on the CPU (on a GPU it did: lean saves
                    # nothing there); it is released when the loop ends
                    setattr(module, leaf, torch.nn.Parameter(torch.empty(0, device=dev), requires_grad=False))
                    continue
                if not ckpt:
                    p.copy_(dequantised(w, bits, torch))
                    continue
                packed, s, b, deq = quantise(w, bits, torch)
                p.copy_(deq)
                for base, rows in mlx_matrices(mlx, shape):
                    pk, sc, bi = (packed, s, b) if rows is None else (
                        np.ascontiguousarray(packed[:, rows, :]), s[:, rows], b[:, rows])
                    tensors[base + ".weight"] = ("U32", pk.shape, pk.tobytes())
                    tensors[base + ".scales"] = ("BF16", tuple(sc.shape), bf16_bytes(sc, torch))
                    tensors[base + ".biases"] = ("BF16", tuple(bi.shape), bf16_bytes(bi, torch))
    if not ckpt:
        log("weights drawn")
        return model
    log(f"{len(tensors)} tensors quantised")
    save_safetensors(mdir / "model.safetensors", tensors)
    config = {"model_type": "qwen3_5_moe_text", "architectures": ["Qwen3_5MoeForCausalLM"], "num_hidden_layers": L,
              "layer_types": layer_types, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "rope_parameters": rope, "partial_rotary_factor": 0.25,
              "rope_theta": 10000000.0, "attn_output_gate": True, "linear_conv_kernel_dim": 4,
              "norm_topk_prob": True, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu",
              **({"quantization": quant, "quantization_config": quant} if args.weights == "q4" else {}), **dims}
    (mdir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log(f"checkpoint written to {mdir}")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None, help="default: fresh, printed")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="fullwidth")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scales", choices=("trained", "easy"), default="trained")
    ap.add_argument("--lm-head-std", type=float, default=0.1)
    ap.add_argument("--weights", choices=("q4", "bf16"), default="q4",
                    help="q4: MLX 4-bit (8-bit router and shared-expert gate); bf16: every matrix in BF16 (the "
                         "unquantised path, as --dtype bf16 runs the original checkpoint)")
    ap.add_argument("--fp64", metavar="DIR",
                    help="also run the same model in fp64 throughout (fp64_model_class) and write DIR/tokens.bin, "
                         "DIR/logits.bin and DIR/model (a link to OUT/model): a reference without transformers' fp32 "
                         "rounding, for TERN_GPU_REF_DIR; the fp32 logits' distance from it is printed")
    args = ap.parse_args()

    import torch

    seed = args.seed if args.seed is not None else int.from_bytes(__import__("os").urandom(4), "little")
    log(f"seed {seed}, preset {args.preset}, {args.scales} scales, {args.weights} weights, {args.layers} layers, "
        f"{args.positions} positions, device {args.device}")
    out = pathlib.Path(args.out)
    mdir = out / "model"
    mdir.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    model = build_model(args, seed, dev, mdir)
    V = model.config.vocab_size
    tg = torch.Generator(device="cpu").manual_seed(seed + 1)
    tokens = torch.randint(0, V, (args.positions,), generator=tg, dtype=torch.int64)
    # Router margins: per layer, the gap between the 8th and 9th largest router logits of every token (a near-tie is
    # where a small error in the hidden state changes the chosen experts).
    gaps = {}

    def router_hook(idx, weight):
        def hook(_module, inputs, _output):
            h = inputs[0].reshape(-1, weight.shape[1]).float()
            top = (h @ weight.float().t()).topk(9, dim=-1).values
            gaps[idx] = (top[:, 7] - top[:, 8]).cpu()
        return hook

    handles = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight"):
            handles.append(gate.register_forward_hook(router_hook(i, gate.weight)))
    with torch.no_grad():
        logits = model(input_ids=tokens[None].to(dev), use_cache=False).logits[0].float().cpu().numpy()
    for h in handles:
        h.remove()
    handles = layer = gate = None  # the loop's references to the model's last layer: --fp64 frees the whole model
    if gaps:
        allg = torch.cat(list(gaps.values()))
        log(f"router: 8th-9th logit gap median {float(allg.median()):.4f}, below 0.01 in "
            f"{100.0 * float((allg < 0.01).float().mean()):.1f}% and below 0.001 in "
            f"{100.0 * float((allg < 0.001).float().mean()):.2f}% of (token, layer) pairs")
    tokens.numpy().astype(np.int32).tofile(out / "tokens.bin")
    logits.astype(np.float32).tofile(out / "logits.bin")
    probs = torch.from_numpy(logits).softmax(-1)
    ent = float(-(probs * probs.clamp_min(1e-30).log()).sum(-1).mean())
    log(f"reference logits [{logits.shape[0]}, {logits.shape[1]}] written; mean entropy {ent:.3f} nats "
        f"(uniform {math.log(V):.3f})")
    if args.fp64:
        del model, probs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        # made again from the seed (the same draws): converting the fp32 model would hold both on the device
        model = build_model(args, seed, dev, None, fp64=True)
        with torch.no_grad():
            exact = model(input_ids=tokens[None].to(dev), use_cache=False).logits[0].double().cpu().numpy()
        out64 = pathlib.Path(args.fp64)
        out64.mkdir(parents=True, exist_ok=True)
        link = out64 / "model"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(mdir.resolve(), target_is_directory=True)
        tokens.numpy().astype(np.int32).tofile(out64 / "tokens.bin")
        exact.astype(np.float32).tofile(out64 / "logits.bin")
        f = compare_logits(torch.from_numpy(exact), torch.from_numpy(logits), tokens, torch)
        log(f"fp64 reference written to {out64}; transformers in fp32 against it: mean KL {f['kl']:.3g} nats, "
            f"perplexity {f['ppl']:+.4f}%, top-1 {f['top1']:.2f}%, "
            f"max |dlogit| {f['max_abs']:.3g}; worst positions: " +
            ", ".join(f"{i} (KL {kl:.3g}, top-1 {'same' if same else 'differs'}, margin {m:.3g})"
                      for i, kl, same, m in f["worst"]))


def compare_logits(ref, got, tokens, torch):
    """compare_logits of tests/cuda/runner/fidelity_util.h: teacher-forced over positions 0..n-2 (in fp64, 32
    positions at a time: a 248,320-word vocabulary makes each position's row 2 MB). ref and got are logits [n, V]
    (torch), tokens the n tokens: mean and median KL(ref ‖ got), perplexity's change in %, top-1 agreement in %, the
    worst 1% of positions' share of the KL, the largest |logit difference| and the 5 worst positions as (position, KL,
    same top-1, the reference's top-2 margin there). rounding_effect.py's comparisons too."""
    parts = {"kl": [], "nll_ref": [], "nll": [], "margin": [], "same": [], "max_abs": []}
    n = ref.shape[0] - 1
    for i0 in range(0, n, 32):
        i1 = min(n, i0 + 32)
        a, b = ref[i0:i1].double(), got[i0:i1].double()
        la, lb = a.log_softmax(-1), b.log_softmax(-1)
        parts["kl"].append((la.exp() * (la - lb)).sum(-1))
        nxt = tokens[i0 + 1:i1 + 1, None]
        parts["nll_ref"].append(-la.gather(1, nxt).squeeze(1))
        parts["nll"].append(-lb.gather(1, nxt).squeeze(1))
        top2 = a.topk(2, dim=-1).values
        parts["margin"].append(top2[:, 0] - top2[:, 1])
        parts["same"].append(a.argmax(-1) == b.argmax(-1))
        parts["max_abs"].append((a - b).abs().amax(-1))
    kl, nll_ref, nll, margin, same, max_abs = (torch.cat(parts[k])
                                               for k in ("kl", "nll_ref", "nll", "margin", "same", "max_abs"))
    worst = kl.argsort(descending=True)[:5].tolist()
    one_percent = max(1, kl.numel() // 100)
    return {
        "kl": float(kl.mean()), "median_kl": float(kl.median()),
        "ppl": 100.0 * (math.exp(float(nll.mean()) - float(nll_ref.mean())) - 1.0),
        "top1": 100.0 * float(same.double().mean()),
        "worst_share": float(kl.sort(descending=True).values[:one_percent].sum() / kl.sum()) if kl.sum() > 0 else 0.0,
        "max_abs": float(max_abs.max()),
        "worst": [(i, float(kl[i]), bool(same[i]), float(margin[i])) for i in worst],
    }

if __name__ == "__main__":
    main()
