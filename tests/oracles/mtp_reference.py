#!/usr/bin/env python3
"""Reference logits of the MTP draft head of a Qwen3.6-MoE checkpoint, in fp32 PyTorch on the CPU.

    .venv/bin/python tests/oracles/mtp_reference.py --model DIR --tokens 1,2,3 [--draft 7,8] --out FILE.npy

transformers drops the mtp.* weights, so the head is assembled here from the published architecture (vLLM's
qwen3_5_mtp.py, docs/model.md §2.8), with transformers' own decoder layer and zero-centred RMSNorm as the parts:

    u_t   = [ RMSNorm1p(embed(x_{t+1}); mtp.pre_fc_norm_embedding) ; RMSNorm1p(h_t; mtp.pre_fc_norm_hidden) ]
    y_t   = mtp.fc(u_t)                                  (embedding first, then the hidden)
    y     = full-attention decoder layer mtp.layers.0 over y_0, y_1, ... at positions t (causal, its own sequence)
    out_t = RMSNorm1p(y_t; mtp.norm),  logits_t = lm_head(out_t)          (a prediction of token t+2)

where h_t is the main model's hidden at position t after its final norm (the input of its LM head). For the tokens
x_0..x_{T-1} the rows t = 0..T-2 pair h_t with x_{t+1}; then --draft d_1..d_k continues as a draft chain:
(h_{T-1}, d_1) at position T-1, and (out of the previous row, d_j) at position T-2+j. Writes float32 [T-1+k, V].
The main model is reference_logits.py's (every layout it reads; MLX weights dequantised as tern does).
"""
import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import reference_logits  # noqa: E402


def mtp_tensors(model_dir, layout, quant):
    """The checkpoint's mtp.* tensors as fp32 in HF form (fused experts, zero-centred norms)."""
    import re

    import torch
    tensors = (reference_logits.load_mlx_tensors(model_dir, quant) if layout == "mlx"
               else reference_logits.load_hf_tensors(model_dir))
    out, experts = {}, {}
    for k, v in tensors.items():
        if not k.startswith("mtp."):
            continue
        if layout == "mlx":
            if re.search(r"norm(_embedding|_hidden)?\.weight$", k):
                v = v - 1.0  # MLX stores 1 + w
            m = re.match(r"(.*\.mlp)\.switch_mlp\.(gate|up|down)_proj\.weight$", k)
            if m:
                experts.setdefault(m.group(1), {})[m.group(2)] = v
                continue
        m = re.match(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(m.group(3) + "_list", {})[int(m.group(2))] = v
            continue
        out[k] = v
    for prefix, parts in experts.items():
        if "gate" in parts:
            gate, up, down = parts["gate"], parts["up"], parts["down"]
        else:
            n = len(parts["gate_list"])
            gate, up, down = (torch.stack([parts[p + "_list"][e] for e in range(n)]) for p in ("gate", "up", "down"))
        out[prefix + ".experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[prefix + ".experts.down_proj"] = down.contiguous()
    if not out:
        sys.exit(f"mtp_reference: {model_dir} holds no mtp.* tensors")
    return out


class MtpHead:
    """The MTP head of the published architecture, built from transformers' parts."""

    def __init__(self, main_config, tensors):
        import copy

        import torch
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf
        cfg = copy.deepcopy(main_config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = ["full_attention"]
        cfg._attn_implementation = "eager"
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_fc_norm_embedding = hf.Qwen3_5MoeRMSNorm(D, eps)
        self.pre_fc_norm_hidden = hf.Qwen3_5MoeRMSNorm(D, eps)
        self.fc = torch.nn.Linear(2 * D, D, bias=False)
        self.layer = hf.Qwen3_5MoeDecoderLayer(cfg, 0)
        self.norm = hf.Qwen3_5MoeRMSNorm(D, eps)
        self.rotary = hf.Qwen3_5MoeTextRotaryEmbedding(cfg)
        modules = {"pre_fc_norm_embedding": self.pre_fc_norm_embedding, "pre_fc_norm_hidden": self.pre_fc_norm_hidden,
                   "fc": self.fc, "layers.0": self.layer, "norm": self.norm}
        for prefix, mod in modules.items():
            mod.to(torch.float32)
            state = {k[len("mtp." + prefix) + 1:]: v for k, v in tensors.items() if k.startswith("mtp." + prefix + ".")}
            missing, unexpected = mod.load_state_dict(state, strict=False)
            if missing or unexpected:
                sys.exit(f"mtp_reference: mtp.{prefix}: missing {missing[:8]}, unexpected {unexpected[:8]}")
            mod.eval()

    def __call__(self, embeds, hidden):
        """embeds, hidden [1, n, D] for positions 0..n-1 -> the head's output hidden [1, n, D] (after mtp.norm)."""
        import torch
        n = embeds.shape[1]
        u = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        y = self.fc(u)
        pos = torch.arange(n).view(1, 1, -1).expand(3, 1, -1)
        cos_sin = self.rotary(y, pos)
        mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
        y = self.layer(y, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos[0])
        return self.norm(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--draft", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    torch.manual_seed(0)
    model_dir = pathlib.Path(args.model)
    model, layout = reference_logits.build_model(model_dir)
    _, quant = reference_logits.text_config(model_dir)
    head = MtpHead(model.config, mtp_tensors(model_dir, layout, quant))
    tokens = [int(x) for x in args.tokens.split(",") if x]
    drafts = [int(x) for x in args.draft.split(",") if x]
    T = len(tokens)
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([tokens]), use_cache=False).last_hidden_state  # [1, T, D] after norm
        embed = model.model.embed_tokens
        hidden = [h[:, t] for t in range(T)]          # h_t of each pair
        nexts = tokens[1:] + drafts[:1]               # x_{t+1}; the first draft pairs with h_{T-1}
        outs = None
        for j in range(max(1, len(drafts))):
            n = len(nexts)
            e = embed(torch.tensor([nexts]))
            outs = head(e, torch.stack(hidden[:n], dim=1))
            if j + 1 < len(drafts):                   # the chain: the last output is the next row's h
                hidden = hidden[:n] + [outs[:, n - 1]]
                nexts = nexts + [drafts[j + 1]]
        logits = model.lm_head(outs)[0].float().numpy()
    np.save(args.out, np.ascontiguousarray(logits, dtype=np.float32))


if __name__ == "__main__":
    main()
