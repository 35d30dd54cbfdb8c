#!/usr/bin/env python3
"""How far one of the CUDA path's roundings alone moves the trained-scale oracle (issue 29): the model that
gpu_reference.py draws, run by transformers in fp32 exactly and with that rounding emulated, the two compared as
test_cuda compares tern's logits with the reference (mean KL, median KL, perplexity, top-1, the worst positions).
Runs on the CPU; no tern binary and no GPU involved.

    .venv/bin/python tests/oracles/rounding_effect.py --seeds 1,2 [--layers 3] [--positions 640]
        [--emulate fp32,kv16,kvb19,attn16,down16] [--device cpu] [--lean]

The reference is transformers' own forward (its eager attention; its experts as it runs them; with --lean, the
experts held as their 4-bit codes so that 8 layers fit 24 GB, this script's exact experts forward, the fp32 control's
arithmetic, whose mean KL against transformers' is 2e-11 at 3 and 4 layers). Emulations (what
tern's CUDA kernels do), each run with this script's attention and experts forward (the same arithmetic):
  fp32    none: this script's attention and experts without a rounding (a control: it must sit at fp32's noise);
  kv16    K (after its norm and RoPE) and V rounded to fp16, as the default KV cache (--kv-dtype f16) stores them
          (src/cuda/kernels/attention); k16, v16: K alone, V alone;
  kvbN    K and V rounded to N significant bits (N = 2..24; fp16 keeps 11, fp32 24), their range unbounded: how many
          bits a wider cache would need (fp16 + an 8-bit residual per value keeps 19);
  kvi16   K and V as 16-bit integers with a scale per (token, head) row, max|x|/32767: fp16's bytes, a fixed-point
          rounding of at most a 65534th of the row's largest value;
  qp16    Q and the unnormalised probabilities exp(s - max) rounded to fp16's 11 significant bits, K and V exact (the
          range unbounded: fp16 itself also loses bits below 2^-14, which attn16 keeps); qpbN: to N significant bits;
          q16, p16: Q alone, the probabilities alone (11 significant bits, range unbounded);
  i16     the i16 KV cache's attention (--kv-dtype i16): kvi16, and Q and the probabilities at 22 significant bits
          (fp16 hi + lo; range unbounded); i16q11, i16p11: Q alone, the probabilities alone at 11 significant bits
          (one fp16 term, not a pair); i16v11: V's integers rounded to 11 significant bits (its fp16 hi alone);
          i16pv11: the probabilities and V so (P·V one fp16 product). (The kernels round each weight times its key's
          V scale, p·s_v, not p: the same bits, another place for each rounding.)
  attn16  kv16, and Q and the unnormalised probabilities exp(s - max) rounded to fp16, as the attention's
          tensor-core products take them (the scores, the softmax sums and the output in fp32);
  down16  the MoE down products' input (routed and shared experts) quantised to 16 bits per group of 64 columns,
          v = rint(x·32639/m), m = max|x| of the group (src/cuda/kernels/qmv/dp4a_tile.cuh), as the expert kernels
          take it with TERN_MOE_DP4A_BITS=16; attention exact;
  gateup16  the MoE gate_up products' input (routed and shared) so quantised, as the one-token decode's expert
          kernels (moe_dp4a) take it with TERN_MOE_DP4A_BITS=16; moe16: gateup16 and down16; moe24: both at 24 bits
          (v = rint(x·8355711/m), dp4a_tile.cuh's wide form: what the expert kernels take by default);
  lin16   every product's input as the prefill's warpgroup kernels take it, bf16 hi + lo (hi = bf16(x), lo =
          bf16(x − hi): 16 significant bits): the attention's and the GDN's projections, the shared expert, the
          experts' gate_up and down, the LM head; the routers (the MoE's and the shared expert's gate) exact, as
          tern's fp32 router; attention exact;
  lin16e, lin16m, lin16g, lin16t, lin16ab  lin16 at some products alone: the MoE blocks' (the routed and shared
          experts), the mixers' (the attention's and the GDN's projections), the GDN's, the gated attention's; every
          product but the GDN's two gates (in_proj_a, in_proj_b); lin16qkv, lin16z, lin16out: the GDN's in_proj_qkv,
          in_proj_z, out_proj alone; lin16xqkv: every product but in_proj_qkv;
  lin22, lin22e, ... lin22xqkv  the same sites' inputs as fp16 hi + lo of x/σ, σ a power of two per token with
          max|x/σ| in [2^14, 2^15) (22 significant bits; f16_pair): the warpgroup kernel's fp16 split;
  pre22   the prefill plan with the i16 cache since the forty-eighth session: every product's input as fp16 hi + lo
          (lin22) but the down products' (routed and shared experts), which take bf16 hi + lo (lin16), and the shared
          expert's gate on x at 16 bits per group of 64, as pre16's (CUDA prefill sites 15,
          src/cuda/runner/cuda_runner.cu);
  pre22g  the prefill plan with the i16 cache and TERN_PREFILL_PAIR_SITES=1: the GDN's input projections (in_proj_qkv,
          z, b, a) on fp16 hi + lo, every other product as pre16 takes it;
  pre16   lin16, and the shared expert's gate (its 8-bit sigmoid gate) on x at 16 bits per group of 64, as the prefill
          plan took it until the forty-fifth session (the first of the router's two 16-bit terms only);
Two joined by "+" run together: an attention's rounding and a products' (i16+lin16: the prefill plan with the i16
cache; i16+moe24: the one-token decode's experts with it).
Layers: --layers 3 (the default) is GDN, gated attention, GDN (the attention's rounding then passes through a GDN
layer and two routers, and the model fits a 24 GB machine: each layer's 256 experts take 3.2 GB in fp32); --layers 4
or more takes the model's own pattern, gated attention every fourth layer.
"""
import argparse
import gc
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_reference import build_model, compare_logits, default_layer_types  # noqa: E402
from make_model import PRESETS  # noqa: E402


def log(msg):
    print(f"[rounding_effect {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def layer_types_for(layers):
    if layers == 3:
        return ["linear_attention", "full_attention", "linear_attention"]
    return default_layer_types(layers)


def significant_bits(kind, prefix="kvb"):
    """N of an emulation kvbN (or prefix + N), else None."""
    rest = kind[len(prefix):]
    return int(rest) if kind.startswith(prefix) and rest.isdigit() else None


def row_int16(t, torch, bits=None):
    """t with each row (the last axis: one token's head) as 16-bit integers times max|row|/32767; with bits, the
    integers then rounded to that many significant bits (11: the i16 kernels' fp16 hi of v/2 alone; |v| < 2048
    stays exact)."""
    s = t.abs().amax(dim=-1, keepdim=True) / 32767.0
    v = torch.round(t / torch.where(s > 0, s, torch.ones_like(s)))
    if bits is not None:
        v = rounded_to_bits(v, bits, torch)
    return torch.where(s > 0, v * s, torch.zeros_like(t))


def rounded_to_bits(t, bits, torch):
    """t with each value rounded to nearest (ties to even) at `bits` significant bits, exponent unbounded."""
    m, e = torch.frexp(t)  # t = m·2^e, 0.5 <= |m| < 1
    return torch.ldexp(torch.round(m * 2.0 ** bits) / 2.0 ** bits, e)


# i16 and its variants with one of the attention's pairs a single fp16 term (the prefill kernel's cheaper forms)
I16_KINDS = ("i16", "i16q11", "i16p11", "i16v11", "i16pv11")


def emulated_attention(torch, kind):
    """An attention function for transformers' AttentionInterface: eager attention in fp32 with kind's roundings."""
    f16 = lambda t: t.to(torch.float16).to(torch.float32)  # noqa: E731
    bits, qp_bits = significant_bits(kind), 11 if kind == "qp16" else significant_bits(kind, "qpb")
    if kind in I16_KINDS:
        qp_bits = 22
    q_bits = 11 if kind in ("q16", "i16q11") else qp_bits
    p_bits = 11 if kind in ("p16", "i16p11", "i16pv11") else qp_bits
    v_bits = 11 if kind in ("i16v11", "i16pv11") else None

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        # query [b, Hq, n, d], key / value [b, Hkv, n, d]
        if bits is not None:
            key, value = rounded_to_bits(key, bits, torch), rounded_to_bits(value, bits, torch)
        if kind == "kvi16" or kind in I16_KINDS:
            key, value = row_int16(key, torch), row_int16(value, torch, v_bits)
        if q_bits is not None:
            query = rounded_to_bits(query, q_bits, torch)
        if kind in ("kv16", "attn16", "k16"):
            key = f16(key)
        if kind in ("kv16", "attn16", "v16"):
            value = f16(value)
        if kind == "attn16":
            query = f16(query)
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        n, m = scores.shape[-2], scores.shape[-1]
        causal = torch.ones(n, m, dtype=torch.bool, device=scores.device).tril(m - n)
        scores = scores.masked_fill(~causal, float("-inf"))
        top = scores.amax(dim=-1, keepdim=True)
        p = torch.exp(scores - top)
        total = p.sum(dim=-1, keepdim=True)
        if kind == "attn16":
            p = f16(p)
        if p_bits is not None:
            p = rounded_to_bits(p, p_bits, torch)
        out = torch.matmul(p, value) / total
        return out.transpose(1, 2).contiguous(), None

    return attention


def quantised_groups(x, torch, qmax=32639.0):
    """x with each group of 64 along the last axis as the 16-bit integer products take it: v·m/32639 (qmax 8355711:
    the 24-bit wide form)."""
    g = x.reshape(*x.shape[:-1], x.shape[-1] // 64, 64)
    m = g.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(m >= 2.0 ** -100, qmax / m, torch.zeros_like(m))
    v = torch.clamp(torch.round(g * inv), -qmax, qmax)
    return (v * (m / qmax)).reshape(x.shape)


def bf16_pair(x, torch):
    """x as bf16 hi + lo (hi = bf16(x), lo = bf16(x − hi)): 16 significant bits, the prefill products' input."""
    hi = x.to(torch.bfloat16).to(torch.float32)
    return hi + (x - hi).to(torch.bfloat16).to(torch.float32)


def f16_pair(x, torch):
    """x as fp16 hi + lo of x/σ per row (the last axis), σ a power of two with max|x/σ| in [2^14, 2^15) (hi = fp16(x/σ),
    lo = fp16(x/σ − hi), subnormals kept): 22 significant bits, and below 2^-17 of the row's largest value an absolute
    error of at most 2^-25·σ."""
    m = x.abs().amax(dim=-1, keepdim=True)
    _, e = torch.frexp(m)  # m < 2^e
    sigma = torch.ldexp(torch.ones_like(m), (e - 15).to(torch.int32))
    y = x / sigma
    hi = y.to(torch.float16).to(torch.float32)
    return (hi + (y - hi).to(torch.float16).to(torch.float32)) * sigma


def experts_forward(experts, torch, down16, gateup16=False, qmax=32639.0, pair=None, down_pair=None):
    """A forward for transformers' fused Qwen3_5MoeExperts, each down product's input quantised (quantised_groups, at
    qmax) with down16, each gate_up product's with gateup16, both taken by pair (bf16_pair or f16_pair) where given
    (the down products' by down_pair where that is given), else exact (the fp32 control)."""
    down_pair = down_pair or pair
    silu = torch.nn.functional.silu
    codes = getattr(experts, "codes", None)  # build_model's lean_experts: dequantised here, one expert at a time

    def weight(name, e):
        if codes is None:
            return getattr(experts, name)[e]
        q, s, b = (t[e] for t in codes[name])
        return (s * q.to(torch.float32) + b).reshape(q.shape[0], -1)

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in top_k_index.unique().tolist():
            if e >= experts.num_experts:
                continue
            token, slot = torch.where(top_k_index == e)
            x = quantised_groups(hidden_states[token], torch, qmax) if gateup16 else hidden_states[token]
            x = pair(x, torch) if pair else x
            gate, up = torch.nn.functional.linear(x, weight("gate_up_proj", e)).chunk(2, dim=-1)
            h = silu(gate) * up
            h = quantised_groups(h, torch, qmax) if down16 else h
            h = down_pair(h, torch) if down_pair else h
            y = torch.nn.functional.linear(h, weight("down_proj", e)) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    return forward


def lin16_sites(kind):
    """The SITES name whose products' inputs a products' rounding takes as pairs (pre16: lin16's; lin22X: lin16X's),
    else None."""
    if kind is not None and kind.startswith("lin22"):
        kind = "lin16" + kind[len("lin22"):]
    return "lin16" if kind in ("pre16", "pre22", "pre22g") else kind if kind in SITES else None


def pair_of(kind):
    """The pair a products' rounding takes its sites' inputs as: f16_pair for the lin22 names, else bf16_pair."""
    return f16_pair if kind is not None and (kind.startswith("lin22") or kind == "pre22") else bf16_pair


def down_pair_of(kind):
    """The pair a products' rounding takes the down products' inputs as: bf16_pair for pre22, else pair_of's."""
    return bf16_pair if kind == "pre22" else pair_of(kind)


def rounds_routed_experts(kind):
    """Whether a products' rounding takes the routed experts' inputs as bf16 pairs (its sites include the MoE
    block's)."""
    sites = lin16_sites(kind)
    return sites is not None and SITES[sites]("model.layers.0.mlp.experts")


def emulate_experts(model, kind, torch):
    """Gives every MoE block of the model this script's experts forward (kind fp32: exact; down16: the down inputs
    quantised, the shared expert's too; gateup16, moe16, moe24 likewise; lin16 and the SITES that include the MoE
    block, pre16: the routed experts' inputs as bf16 pairs, the shared expert's by emulate_linear_inputs) or, with kind
    None, transformers' own back."""
    for layer in model.model.layers:
        mlp = layer.mlp
        if not hasattr(mlp.experts, "_transformers_forward"):
            mlp.experts._transformers_forward = mlp.experts.forward
        for m in (mlp.shared_expert, mlp.shared_expert.down_proj):
            hook = getattr(m, "_hook16", None)
            if hook is not None:
                hook.remove()
                m._hook16 = None
        if kind is None:
            mlp.experts.forward = mlp.experts._transformers_forward
            continue
        down16, gateup16 = kind in ("down16", "moe16", "moe24"), kind in ("gateup16", "moe16", "moe24")
        qmax = 8355711.0 if kind == "moe24" else 32639.0
        routed = rounds_routed_experts(kind)
        mlp.experts.forward = experts_forward(mlp.experts, torch, down16, gateup16, qmax,
                                              pair=pair_of(kind) if routed else None,
                                              down_pair=down_pair_of(kind) if routed else None)
        for on, m in ((down16, mlp.shared_expert.down_proj), (gateup16, mlp.shared_expert)):
            if on:
                m._hook16 = m.register_forward_pre_hook(
                    lambda _m, inputs, q=qmax: (quantised_groups(inputs[0], torch, q),))


# lin16's sites by emulation: which products' inputs (nn.Linear modules by name) it rounds
SITES = {
    "lin16": lambda name: True,
    "lin16e": lambda name: ".mlp." in name,                                   # the MoE block's (the shared expert's)
    "lin16m": lambda name: ".linear_attn." in name or ".self_attn." in name,  # the mixers' projections
    "lin16g": lambda name: ".linear_attn." in name,                           # the GDN's
    "lin16t": lambda name: ".self_attn." in name,                             # the gated attention's
    "lin16ab": lambda name: not name.endswith(("in_proj_a", "in_proj_b")),    # all but the GDN's two gates
    "lin16qkv": lambda name: name.endswith("linear_attn.in_proj_qkv"),        # the GDN's q, k, v projection
    "lin16z": lambda name: name.endswith("linear_attn.in_proj_z"),            # the GDN's output gate's
    "lin16out": lambda name: name.endswith("linear_attn.out_proj"),           # the GDN's output projection
    "lin16xqkv": lambda name: not name.endswith("linear_attn.in_proj_qkv"),   # all but in_proj_qkv (24 bits there)
}


def emulate_linear_inputs(model, sites, torch, gate16=False, pair=bf16_pair, down_pair=None, f16_at=None):
    """With sites (a SITES name), the input of each nn.Linear that SITES[sites] takes (by module name) as pair(x) (the
    down projections' as down_pair(x) where that is given; those f16_at(name) takes as f16_pair(x)),
    never the routers' (mlp.gate, shared_expert_gate: fp32 in tern); with gate16 too, shared_expert_gate's at 16 bits
    per group (quantised_groups); with None, the hooks removed. (The routed experts' products are
    experts_forward's.)"""
    for h in getattr(model, "_pair16_hooks", []):
        h.remove()
    model._pair16_hooks = []
    if sites is None:
        return
    for name, m in model.named_modules():
        if not SITES[sites](name):
            continue
        if isinstance(m, torch.nn.Linear) and not name.endswith(("mlp.gate", "shared_expert_gate")):
            p = down_pair if down_pair is not None and name.endswith("down_proj") else pair
            if f16_at is not None and f16_at(name):
                p = f16_pair
            model._pair16_hooks.append(m.register_forward_pre_hook(lambda _m, inputs, p=p: (p(inputs[0], torch),)))
        elif gate16 and name.endswith("shared_expert_gate"):
            model._pair16_hooks.append(
                m.register_forward_pre_hook(lambda _m, inputs: (quantised_groups(inputs[0], torch),)))


# the same sites with x as fp16 hi + lo and a power-of-two scale per token (f16_pair): lin22, lin22e, ...
SITES22 = ["lin22" + name[len("lin16"):] for name in SITES]
# roundings of the products' inputs
MOE_KINDS = {"down16", "gateup16", "moe16", "moe24", "pre16", "pre22", "pre22g", *SITES, *SITES22}
# pre22g's fp16 hi + lo site: the GDN's input projections (CUDA prefill site 1, in_proj_all: qkv, z, b, a)
GDN_IN = lambda name: ".linear_attn.in_proj_" in name  # noqa: E731


def attention_and_products(kind):
    """An emulation's two parts: its attention's rounding ("fp32": none) and its products' (a MOE_KINDS name, or None:
    none). kind is one name, or an attention's and a products' rounding joined by "+" (i16+lin16)."""
    parts = kind.split("+")
    att = next((p for p in parts if p not in MOE_KINDS), "fp32")
    return att, next((p for p in parts if p in MOE_KINDS), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", required=True, help="comma-separated")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--positions", type=int, default=640)
    ap.add_argument("--emulate", default="fp32,kv16,attn16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="fullwidth",
                    help="make_model.py's PRESETS (realdims: a quick run)")
    ap.add_argument("--lean", action="store_true",
                    help="the experts held as 4-bit codes (a quarter of the memory: 8 layers in 24 GB) and the "
                         "reference's experts run by this script's exact forward, not transformers'")
    args = ap.parse_args()
    kinds = [k for k in args.emulate.split(",") if k]
    named = ("fp32", "kv16", "k16", "v16", "kvi16", "qp16", "q16", "p16", *I16_KINDS, "attn16", "down16", "gateup16",
             "moe16", "moe24", "pre16", "pre22", "pre22g", *SITES, *SITES22)
    for k in kinds:
        parts = k.split("+")
        for part in parts:
            bits = significant_bits(part) or significant_bits(part, "qpb")
            if part not in named and not (bits and 2 <= bits <= 24):
                sys.exit(f"rounding_effect: {k}: unknown emulation '{part}' ({', '.join(named)}, kvbN or qpbN with N "
                         "2..24)")
        if len(parts) > 2 or (len(parts) == 2 and sum(p in MOE_KINDS for p in parts) != 1):
            sys.exit(f"rounding_effect: {k}: a combination is one attention rounding + one products' rounding (one "
                     f"of {', '.join(sorted(MOE_KINDS))})")
    if args.layers != 3 and args.layers < 4:
        sys.exit("rounding_effect: --layers 3, or 4 and more (a gated-attention layer is needed)")

    import torch
    from transformers import AttentionInterface

    torch.set_grad_enabled(False)
    # each emulation's attention rounding (fp32: exact) and products' rounding (None: exact)
    split = {k: attention_and_products(k) for k in kinds}
    for att in {"fp32", *(a for a, _ in split.values())}:
        AttentionInterface.register("tern_" + att, emulated_attention(torch, att))
    # build_model's arguments, as gpu_reference.py's defaults for the fidelity check
    margs = argparse.Namespace(preset=args.preset, layers=args.layers, scales="trained", weights="q4",
                               lm_head_std=0.1)
    dev = torch.device(args.device)
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        log(f"seed {seed}: {args.layers} layers {layer_types_for(args.layers)}, {args.positions} positions")
        model = build_model(margs, seed, dev, None, layer_types_for(args.layers), lean_experts=args.lean)
        V = model.config.vocab_size
        tg = torch.Generator(device="cpu").manual_seed(seed + 1)
        tokens = torch.randint(0, V, (args.positions,), generator=tg, dtype=torch.int64)
        runs, residuals = {}, {}
        # each layer's output (the residual stream) per run, for the error by layer
        captured = []
        hooks = [layer.register_forward_hook(
            lambda _m, _inputs, out: captured.append((out[0] if isinstance(out, tuple) else out)[0].detach().cpu()))
            for layer in model.model.layers]
        for impl in ["eager"] + ["tern_" + k for k in kinds]:
            # the attention: transformers' eager, or this script's (exact for fp32 and the experts' roundings); the
            # experts: transformers' for the reference (this script's exact one with --lean), this script's for every
            # emulation
            kind = None if impl == "eager" else impl[len("tern_"):]
            att, products = (None, None) if kind is None else split[kind]
            model.set_attn_implementation("eager" if att is None else "tern_" + att)
            if kind is not None:
                experts = products or "fp32"
            else:  # (--lean: transformers' experts cannot read the codes; the reference takes this script's exact one)
                experts = "fp32" if args.lean else None
            emulate_experts(model, experts, torch)
            emulate_linear_inputs(model, lin16_sites(products), torch,
                                  gate16=products in ("pre16", "pre22", "pre22g"), pair=pair_of(products),
                                  down_pair=down_pair_of(products), f16_at=GDN_IN if products == "pre22g" else None)
            t0 = time.time()
            captured.clear()
            runs[impl] = model(input_ids=tokens[None].to(dev), use_cache=False).logits[0].float().cpu()
            residuals[impl] = list(captured)
            log(f"  {impl}: {time.time() - t0:.1f} s")
        for h in hooks:
            h.remove()
        # the comparisons' and the next seed's memory (the emulated forwards hold their modules: a cycle)
        emulate_experts(model, None, torch)
        emulate_linear_inputs(model, None, torch)
        del model
        gc.collect()
        for k in kinds:
            f = compare_logits(runs["eager"], runs["tern_" + k], tokens, torch)
            worst = " ".join(f"{i} (KL {kl:.3g}, top-1 {'same' if s else 'differs'}, margin {m:.3g})"
                             for i, kl, s, m in f["worst"])
            print(f"seed {seed} {k}: mean KL {f['kl']:.3g} (median {f['median_kl']:.3g}), perplexity "
                  f"{f['ppl']:+.4f}%, top-1 {f['top1']:.2f}%, worst 1% of positions {100 * f['worst_share']:.0f}% of "
                  f"the KL; worst: {worst}", flush=True)
            # the residual's relative error after each layer: median position / worst position (a flipped expert
            # choice moves a few positions, not the median)
            errs = []
            for want, got in zip(residuals["eager"], residuals["tern_" + k]):
                rel = (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)
                errs.append(f"{float(rel.median()):.2g}/{float(rel.max()):.2g}")
            print(f"seed {seed} {k}: residual error by layer (median/worst position): {' '.join(errs)}", flush=True)
        del runs, residuals


if __name__ == "__main__":
    main()
