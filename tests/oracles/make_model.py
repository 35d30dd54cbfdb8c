#!/usr/bin/env python3
"""Builds a random-weight Qwen3.6-MoE checkpoint of the real architecture at a reduced size.

    .venv/bin/python tests/oracles/make_model.py --out DIR --seed N [--preset tiny|realdims|fullwidth]
            [--layers 4] [--layout hf|mlx] [--bits 4|8|0] [--dtype float32|bfloat16]
            [--hf-format causal|official] [--max-shard-size SIZE] [--tokenizer DIR]

HF layout: transformers' Qwen3_5MoeForCausalLM.save_pretrained (--hf-format causal, the default: keys
model.layers.*, lm_head.*, per-expert mlp.experts.{e}.{gate,up,down}_proj.weight, a qwen3_5_moe_text config), or
that save rewritten into the official checkpoint's form (--hf-format official: keys model.language_model.*, fused
mlp.experts.gate_up_proj / down_proj, a qwen3_5_moe config holding text_config, the MTP draft head's 19 mtp.*
tensors (random, the real structure; --no-mtp leaves them out) and a few random model.visual.* tensors that a text
engine skips). MLX layout: the official-form HF folder (in a temp dir)
converted by mlx-lm's converter, quantised with --bits 4/8 (group 64, the model's own predicate: 8-bit router
and shared_expert_gate) or not with --bits 0.
Every parameter is random (matrices N(0, 0.02); zero-centred norms N(0, 0.1); the router N(0, 1) so top-k is
never a tie). A small byte-level BPE tokenizer (Qwen's split regex, ChatML special tokens) and a
generation_config.json are written too, unless --tokenizer DIR gives tokenizer files to copy.
The same seed gives the same weights. Prints the model dir.
"""
import argparse
import contextlib
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile

PRESETS = {
    # D, Hq, Hkv, dh, Hk, Hv, dk, dv, E, k, F, Fs, V
    "tiny": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                 linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                 shared_expert_intermediate_size=64, vocab_size=512),
    "realdims": dict(hidden_size=256, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                     linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                     linear_value_head_dim=128, num_experts=16, num_experts_per_tok=8, moe_intermediate_size=64,
                     shared_expert_intermediate_size=64, vocab_size=1024),
    "fullwidth": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                      linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                      linear_value_head_dim=128, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                      shared_expert_intermediate_size=512, vocab_size=248320),
}

# Special tokens of the tiny tokenizer, in Qwen's order (ids follow the BPE vocabulary).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# A compact ChatML template with thinking (written for these test models; real checkpoints carry their own).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] | trim) + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)

CORPUS = """The quick brown fox jumps over the lazy dog. A model reads text as tokens; tokens are pieces of words.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris is the capital.
def main(): return 0  # code has indentation, brackets [], braces {} and operators + - * / = < >.
Numbers like 12345 and 3.14159 are split digit by digit. Emails like user@example.com and URLs http://x.y/z.
Le cafe est chaud. Der Hund schlaeft. El nino come una manzana. Nous sommes le 29 novembre.
The mixture of experts routes every token to a few experts; the shared expert sees all of them.
Linear attention keeps a recurrent state; full attention keeps a cache of keys and values.
"""


def rope_sections(half):
    """mrope_section (T, H, W) for `half` rotary frequencies, in the proportions of the real [11, 11, 10]."""
    s = math.ceil(half * 11 / 32)
    return [half - 2 * s, s, s] if half - 2 * s > s else [s, s, half - 2 * s]


def build_tokenizer(vocab_size, out_dir):
    """Trains a byte-level BPE on CORPUS whose ids (BPE + added) stay below vocab_size. Returns the id map."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    n_added = len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    bpe_size = min(vocab_size - n_added - 16, 256 + 2000)  # leave a few padding rows
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(ADDED_TOKENS)
    tok.save(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    assert max(ids.values()) < vocab_size, "tokenizer larger than the vocabulary"
    added_decoder = {}
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        added_decoder[str(ids[t])] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": t in SPECIAL_TOKENS}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added_decoder,
           "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
           "errors": "replace", "model_max_length": 262144, "split_special_tokens": False,
           "tokenizer_class": "Qwen2Tokenizer", "chat_template": CHAT_TEMPLATE}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return ids


def copy_tokenizer(src, out_dir):
    src = pathlib.Path(src)
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "vocab.json", "merges.txt"]:
        if (src / name).exists():
            shutil.copy(src / name, out_dir / name)
    tok = json.loads((out_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    return ids


def randomise(model, seed, torch):
    """Fills every parameter from one generator, in name order (so the same seed gives the same weights)."""
    g = torch.Generator().manual_seed(seed)
    zero_centred = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
                    ".k_norm.weight")
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        if name.endswith(zero_centred) or name == "model.norm.weight":
            w = torch.randn(shape, generator=g) * 0.1
        elif name.endswith("linear_attn.norm.weight"):
            w = 1.0 + torch.randn(shape, generator=g) * 0.1
        elif name.endswith("A_log"):
            w = torch.empty(shape).uniform_(1.0, 16.0, generator=g).log_()
        elif name.endswith("dt_bias"):
            w = torch.randn(shape, generator=g) * 0.5
        elif name.endswith("conv1d.weight"):
            w = torch.randn(shape, generator=g) * 0.3
        elif name.endswith("mlp.gate.weight"):
            w = torch.randn(shape, generator=g)  # the router: clearly random (model.md §6.10)
        else:
            w = torch.randn(shape, generator=g) * 0.02
        with torch.no_grad():
            p.copy_(w.to(p.dtype))


def make_hf(args, out_dir):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    dims = dict(PRESETS[args.preset])
    L = args.layers
    vocab = dims["vocab_size"]
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.tokenizer:
        ids = copy_tokenizer(args.tokenizer, out_dir)
    else:
        ids = build_tokenizer(vocab, out_dir)
    eot, im_end = ids.get("<|endoftext|>"), ids.get("<|im_end|>")

    rotary = int(dims["head_dim"] * 0.25)
    cfg = Qwen3_5MoeTextConfig(
        num_hidden_layers=L,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_interleaved": True, "mrope_section": rope_sections(rotary // 2)},
        bos_token_id=eot, eos_token_id=eot, pad_token_id=None, **dims)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover
        no_init_weights = contextlib.nullcontext
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with no_init_weights():
            model = Qwen3_5MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    randomise(model, args.seed, torch)
    model = model.to(torch_dtype)
    model.config.dtype = args.dtype
    kw = {}
    if args.max_shard_size:
        kw["max_shard_size"] = args.max_shard_size
    model.save_pretrained(str(out_dir), **kw)
    gen = {"bos_token_id": eot, "do_sample": True, "eos_token_id": [im_end, eot], "pad_token_id": eot,
           "temperature": 1.0, "top_k": 20, "top_p": 0.95}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def write_shards(tensors, out_dir, max_shard_bytes):
    """Writes tensors as model.safetensors, or as shards plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    names = list(tensors)
    groups, cur, cur_bytes = [], [], 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and max_shard_bytes and cur_bytes + b > max_shard_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(n)
        cur_bytes += b
    groups.append(cur)
    if len(groups) == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, g in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in g}, str(out_dir / fname), metadata={"format": "pt"})
        for n in g:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def parse_size(text):
    if not text:
        return 0
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    t = text.strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def mtp_tensors(cfg, g, torch):
    """The MTP draft head as the official checkpoint stores it (docs/model.md §3.3), random as randomise() draws."""
    D, Hq, Hkv, dh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, F, Fs = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    p = "mtp.layers.0."
    norms = ["mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
             p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    shapes = {n: (D,) for n in norms}
    shapes.update({
        "mtp.fc.weight": (D, 2 * D), p + "self_attn.q_proj.weight": (Hq * 2 * dh, D),
        p + "self_attn.k_proj.weight": (Hkv * dh, D), p + "self_attn.v_proj.weight": (Hkv * dh, D),
        p + "self_attn.o_proj.weight": (D, Hq * dh), p + "self_attn.q_norm.weight": (dh,),
        p + "self_attn.k_norm.weight": (dh,), p + "mlp.gate.weight": (E, D),
        p + "mlp.experts.gate_up_proj": (E, 2 * F, D), p + "mlp.experts.down_proj": (E, D, F),
        p + "mlp.shared_expert.gate_proj.weight": (Fs, D), p + "mlp.shared_expert.up_proj.weight": (Fs, D),
        p + "mlp.shared_expert.down_proj.weight": (D, Fs), p + "mlp.shared_expert_gate.weight": (1, D)})
    out = {}
    for n in sorted(shapes):
        w = torch.randn(shapes[n], generator=g)
        if not (n.endswith("norm.weight") or n.endswith("mlp.gate.weight")):
            w = w * 0.02
        elif n.endswith("norm.weight"):
            w = w * 0.1  # zero-centred
        out[n] = w
    return out


def to_official(args, hf_dir):
    """Rewrites a CausalLM save into the official checkpoint's form (see the module docstring)."""
    import torch
    from safetensors.torch import load_file

    files = sorted(hf_dir.glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(str(f)))
        f.unlink()
    idx = hf_dir / "model.safetensors.index.json"
    if idx.exists():
        idx.unlink()
    cfg = json.loads((hf_dir / "config.json").read_text())
    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    out = {}
    for i in range(L):
        p = f"model.layers.{i}.mlp.experts"
        if f"{p}.0.gate_proj.weight" in state:
            gate = [state.pop(f"{p}.{e}.gate_proj.weight") for e in range(E)]
            up = [state.pop(f"{p}.{e}.up_proj.weight") for e in range(E)]
            down = [state.pop(f"{p}.{e}.down_proj.weight") for e in range(E)]
            state[f"{p}.gate_up_proj"] = torch.stack([torch.cat([g, u], 0) for g, u in zip(gate, up)])
            state[f"{p}.down_proj"] = torch.stack(down)
    for name in sorted(state):
        new = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        out[new] = state[name]
    # A few tensors of the vision tower a text engine skips (random values; the names follow the real checkpoint).
    g = torch.Generator().manual_seed(args.seed + 1)
    dt = next(iter(out.values())).dtype
    D = cfg["hidden_size"]
    extra = {"model.visual.patch_embed.proj.weight": (16, 3, 2, 4, 4), "model.visual.merger.norm.bias": (16,)}
    for n, shape in extra.items():
        out[n] = (torch.randn(shape, generator=g) * 0.02).to(dt)
    if not args.no_mtp:
        out.update({n: t.to(dt) for n, t in mtp_tensors(cfg, g, torch).items()})
    write_shards(out, hf_dir, parse_size(args.max_shard_size))
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "dtype")}
    text["dtype"] = args.dtype
    top = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": text, "tie_word_embeddings": False, "image_token_id": 248056, "video_token_id": 248057,
           "vision_start_token_id": 248053, "vision_end_token_id": 248054, "transformers_version": "4.57.1"}
    (hf_dir / "config.json").write_text(json.dumps(top, indent=2, sort_keys=True) + "\n")


def make_mlx(args, out_dir):
    from mlx_lm import convert

    with tempfile.TemporaryDirectory(prefix="tern-hf-") as tmp:
        hf_dir = pathlib.Path(tmp) / "hf"
        make_hf(args, hf_dir)
        to_official(args, hf_dir)
        if out_dir.exists() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        with contextlib.redirect_stdout(sys.stderr):
            kw = dict(dtype=args.dtype)
            if args.bits:
                kw.update(quantize=True, q_group_size=64, q_bits=args.bits)
            convert(str(hf_dir), str(out_dir), **kw)
        for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]:
            if (hf_dir / name).exists() and not (out_dir / name).exists():
                shutil.copy(hf_dir / name, out_dir / name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--layout", choices=["hf", "mlx"], default="hf")
    ap.add_argument("--bits", type=int, choices=[0, 4, 8], default=4, help="MLX layout only; 0: not quantised")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--hf-format", choices=["causal", "official"], default="causal")
    ap.add_argument("--no-mtp", action="store_true", help="--hf-format official without the mtp.* draft head")
    ap.add_argument("--max-shard-size", default=None, help="e.g. 200KB: forces several shards (HF layout)")
    ap.add_argument("--tokenizer", default=None, help="copy tokenizer files from this dir instead of the tiny one")
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    out_dir = pathlib.Path(args.out).resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        ap.error(f"{out_dir} exists and is not empty")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.layout == "hf":
        make_hf(args, out_dir)
        if args.hf_format == "official":
            to_official(args, out_dir)
    else:
        make_mlx(args, out_dir)
    print(out_dir)


if __name__ == "__main__":
    main()
