"""tests/oracles/rounding_effect.py (issue 29: how far one of the CUDA path's roundings alone moves the trained-scale
oracle) on a small model of the real head widths, fresh seed each run: its control (the script's own attention and
experts without a rounding) sits at fp32's noise against transformers; each emulated rounding moves the logits beyond
it (every product's input as bf16 hi + lo too; as fp16 hi + lo, less); K and V rounded to 11 significant bits give what fp16 gives, to 24
what no rounding gives; and the model without a checkpoint (the script's) holds the values the checkpoint path
gives."""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORACLES = ROOT / "tests" / "oracles"
LAYERS = re.compile(r"^seed \d+ ([\w+]+): residual error by layer \(median/worst position\): (.*)$")
LINE = re.compile(r"^seed (\d+) ([\w+]+): mean KL (\S+) \(median (\S+)\), perplexity (\S+)%, top-1 (\S+)%")


def test_control_at_fp32_noise_and_each_rounding_above_it(seed):
    # lin16 before kvb24: its hooks must be gone for the runs after it (kvb24 gives fp32's logits exactly)
    kinds = ("fp32,kv16,k16,v16,kvb11,lin16,kvb24,kvi16,qp16,q16,p16,qpb14,i16,attn16,down16,gateup16,moe16,moe24,"
             "i16+lin16,pre16,lin16e,lin16m,lin16g,lin16t,lin16ab,lin16qkv,lin16z,lin16out,lin16xqkv,lin22,i16+lin22g,"
             "pre22,pre22g,i16q11,i16p11,i16v11,i16pv11")
    r = subprocess.run([sys.executable, ORACLES / "rounding_effect.py", "--seeds", str(seed), "--preset", "realdims",
                        "--positions", "64", "--emulate", kinds],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    kl = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            assert int(m.group(1)) == seed
            kl[m.group(2)] = float(m.group(3))
    assert set(kl) == set(kinds.split(",")), r.stdout
    # every emulation's residual error by layer (median / worst position), one figure pair per layer; the control's
    # at fp32's noise
    by_layer = {m.group(1): m.group(2).split() for m in map(LAYERS.match, r.stdout.splitlines()) if m}
    assert set(by_layer) == set(kl), r.stdout
    assert all(len(v) == 3 for v in by_layer.values()), by_layer  # --layers 3, the default
    assert max(float(x) for pair in by_layer["fp32"] for x in pair.split("/")) < 1e-5, by_layer["fp32"]
    assert float(by_layer["lin16"][0].split("/")[0]) > 1e-7, by_layer["lin16"]
    assert kl["fp32"] < 1e-9, f"seed {seed}: the control is not at fp32's noise: {kl}"
    # fp16's 2^-11 rounding of K and V is far above fp32's noise; the 16-bit down inputs' ~1.5e-5 of a group's max
    # above it too
    for k in ("kv16", "k16", "v16", "qp16", "q16", "p16", "attn16"):
        assert kl[k] > 100 * kl["fp32"], f"seed {seed}: {k}: {kl}"
    # 16-bit rows and 14 significant bits round less than fp16 (how much less is the tool's finding), but round
    for k in ("kvi16", "qpb14", "i16"):
        assert kl[k] > kl["fp32"], f"seed {seed}: {k}: {kl}"
    # the i16 cache's attention rounds less than fp16's (its rows as kvi16's, q and the weights at 22 bits)
    assert kl["i16"] < kl["attn16"], f"seed {seed}: {kl}"
    # one of its pairs a single fp16 term (Q, the probabilities, V's hi alone; the probabilities and V) rounds more
    for k in ("i16q11", "i16p11", "i16v11", "i16pv11"):
        assert kl[k] > kl["i16"], f"seed {seed}: {k}: {kl}"
    # (and i16pv11 takes both of its roundings: not the same logits as either alone)
    assert kl["i16pv11"] not in (kl["i16p11"], kl["i16v11"]), f"seed {seed}: {kl}"
    for k in ("down16", "gateup16", "moe16"):
        assert kl[k] > kl["fp32"], f"seed {seed}: {k}: {kl}"
    # every product's input as bf16 hi + lo (the prefill's 16 significant bits)
    assert kl["lin16"] > 30 * kl["fp32"], f"seed {seed}: lin16: {kl}"
    # every product's input as fp16 hi + lo with a power-of-two scale per token (22 significant bits): less than bf16
    # hi + lo's 16, from the first layer on
    assert kl["lin22"] < kl["lin16"], f"seed {seed}: lin22: {kl}"
    first = {k: float(by_layer[k][0].split("/")[0]) for k in ("lin16", "lin22")}
    assert first["lin22"] < first["lin16"], f"seed {seed}: the first layer's median error: {first}"
    # the prefill's products as they are: lin16's, and the shared expert's gate on 16-bit x besides
    assert kl["pre16"] > 30 * kl["fp32"], f"seed {seed}: pre16: {kl}"
    # the prefill's products with the i16 cache: fp16 hi + lo but for the down inputs (bf16 hi + lo there), which
    # round less than pre16's bf16 hi + lo everywhere, but round
    assert kl["fp32"] < kl["pre22"] < kl["pre16"], f"seed {seed}: pre22: {kl}"
    # and with the GDN's input projections alone on fp16 hi + lo (TERN_PREFILL_PAIR_SITES=1): rounds, but less than
    # pre16 in the first layer (a GDN layer, whose in_proj is its first product)
    assert kl["pre22g"] > kl["fp32"], f"seed {seed}: pre22g: {kl}"
    first = {k: float(by_layer[k][0].split("/")[0]) for k in ("pre16", "pre22g", "pre22")}
    assert first["pre22"] < first["pre22g"] < first["pre16"], f"seed {seed}: the first layer's median error: {first}"
    # lin16 at some products alone: each rounds (its hooks reach its products)
    for k in ("lin16e", "lin16m", "lin16g", "lin16t", "lin16ab", "lin16qkv", "lin16z", "lin16out", "lin16xqkv"):
        assert kl[k] > kl["fp32"], f"seed {seed}: {k}: {kl}"
    # and only their products: layer 0 is a GDN layer, so the attention's projections alone leave its output the
    # control's to the bit (the routed experts exact too), where every kind with a product in it moves it
    assert by_layer["lin16t"][0] == by_layer["fp32"][0], by_layer
    for k in ("lin16e", "lin16g", "lin16qkv", "lin16z", "lin16out", "lin16xqkv"):
        assert by_layer[k][0] != by_layer["fp32"][0], f"{k}: {by_layer}"
    # two roundings joined run together: the pair moves the logits more than either part alone
    assert kl["i16+lin16"] > max(kl["i16"], kl["lin16"]), f"seed {seed}: {kl}"
    # the experts' inputs at 24 bits round 256 times finer than at 16
    assert kl["moe24"] < kl["moe16"], f"seed {seed}: {kl}"
    # 11 significant bits are fp16's (but for its subnormals and range); 24 are fp32's own: no rounding at all
    assert abs(kl["kvb11"] / kl["kv16"] - 1) < 0.05, f"seed {seed}: {kl}"
    assert kl["kvb24"] == kl["fp32"], f"seed {seed}: {kl}"


def test_model_without_checkpoint_holds_the_checkpoint_paths_values(tmp_path, seed):
    import torch

    sys.path.insert(0, str(ORACLES))
    from gpu_reference import build_model

    args = argparse.Namespace(preset="realdims", layers=4, scales="trained", weights="q4", lm_head_std=0.1)
    with_ckpt = build_model(args, seed, torch.device("cpu"), tmp_path)
    without = build_model(args, seed, torch.device("cpu"), None)
    assert (tmp_path / "model.safetensors").exists()
    a, b = dict(with_ckpt.named_parameters()), dict(without.named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"seed {seed}: {name} differs"


def test_dequantised_in_slices_matches_the_whole_tensor(seed):
    """The model without a checkpoint dequantises a stacked expert tensor 16 experts at a time (a last slice part
    full here): the values quantise() gives for the whole tensor, at 4 and 8 bits, and for a matrix."""
    import torch

    sys.path.insert(0, str(ORACLES))
    from gpu_reference import dequantised, quantise

    g = torch.Generator().manual_seed(seed)
    for shape in ((40, 24, 128), (33, 8, 64), (48, 192)):
        w = torch.randn(shape, generator=g) * 0.02
        for bits in (4, 8):
            assert torch.equal(dequantised(w, bits, torch), quantise(w, bits, torch)[3]), f"seed {seed}: {shape}"


def test_lean_experts_hold_the_same_model(seed):
    """build_model's lean_experts (rounding_effect.py --lean, 8 layers in 24 GB): every parameter but the routed
    experts' is the full model's, and each expert's codes dequantise (s·q + b, as the script's forward does) to the
    full model's values bit for bit: the same draws, the same model."""
    import torch

    sys.path.insert(0, str(ORACLES))
    from gpu_reference import build_model

    args = argparse.Namespace(preset="realdims", layers=4, scales="trained", weights="q4", lm_head_std=0.1)
    full = build_model(args, seed, torch.device("cpu"), None)
    lean = build_model(args, seed, torch.device("cpu"), None, lean_experts=True)
    a, b = dict(full.named_parameters()), dict(lean.named_parameters())
    assert a.keys() == b.keys()
    experts = 0
    for name in a:
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            assert b[name].numel() == 0, f"seed {seed}: {name} holds its fp32 values"
            q, s, sb = lean.get_submodule(name.rsplit(".", 1)[0]).codes[name.rsplit(".", 1)[1]]
            assert q.dtype == torch.uint8 and int(q.max()) <= 15
            deq = (s * q.to(torch.float32) + sb).reshape(q.shape[0], q.shape[1], -1)
            assert torch.equal(deq, a[name]), f"seed {seed}: {name}'s codes"
            experts += 1
        else:
            assert torch.equal(a[name], b[name]), f"seed {seed}: {name} differs"
    assert experts == 2 * 4


def test_lean_run_matches_the_full_one(seed):
    """rounding_effect.py --lean (the experts as 4-bit codes, the reference's experts this script's exact forward)
    gives the full model's findings: the control at fp32's noise, and each emulation's KL the full run's (the two
    references differ by fp32's noise alone)."""
    kinds = "fp32,i16+lin16,moe16"
    runs = []
    for lean in ([], ["--lean"]):
        r = subprocess.run([sys.executable, ORACLES / "rounding_effect.py", "--seeds", str(seed), "--preset",
                            "realdims", "--positions", "64", "--emulate", kinds, *lean],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append({m.group(2): float(m.group(3)) for m in map(LINE.match, r.stdout.splitlines()) if m})
    full, lean = runs
    assert set(full) == set(lean) == set(kinds.split(",")), runs
    assert lean["fp32"] < 1e-9, f"seed {seed}: {lean}"
    for k in ("i16+lin16", "moe16"):
        assert lean[k] > 100 * lean["fp32"], f"seed {seed}: {k}: {lean}"
        assert abs(lean[k] / full[k] - 1) < 0.05, f"seed {seed}: {k}: full {full[k]}, lean {lean[k]}"
