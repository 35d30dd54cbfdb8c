"""tests/oracles/gpu_reference.py's fp64 model (issue 29: a reference without transformers' own fp32 rounding, to tell
how far that rounding alone moves the trained-scale oracle) on a small model of the real head widths, fresh seed each
run: every parameter is the fp32 model's value exactly, every floating value any module makes is fp64, and its logits
sit at fp32's noise from the fp32 model's without being the same bits. Also the script's compare_logits (the figures
the CUDA whole-model tests print; rounding_effect.py's too) on logits whose answer is known."""
import math
import pathlib
import re
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "oracles"))
import gpu_reference  # noqa: E402


def test_fp64_model_holds_the_same_values_and_computes_in_fp64(seed):
    args = types.SimpleNamespace(preset="realdims", layers=4, scales="trained", weights="q4", lm_head_std=0.1)
    cpu = torch.device("cpu")
    m32 = gpu_reference.build_model(args, seed, cpu, None)
    m64 = gpu_reference.build_model(args, seed, cpu, None, fp64=True)
    assert type(m64).__module__.endswith("_fp64") and type(m32).__module__ != type(m64).__module__
    # no cast to fp32 left in the code that ran (the norms and the Gated DeltaNet cast to fp32 explicitly)
    src = sys.modules[type(m64).__module__].fp64_source
    assert "torch.float64" in src and not re.search(r"float32|\.float\(\)|torch\.float\b|torch\.half|bfloat16\(", src)
    p32, p64 = dict(m32.named_parameters()), dict(m64.named_parameters())
    assert p32.keys() == p64.keys()
    for name, p in p64.items():
        assert p.dtype == torch.float64, name
        assert torch.equal(p32[name].double(), p), name
    dtypes = {}

    def hook(module, _inputs, output):
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                dtypes.setdefault(t.dtype, type(module).__name__)

    handles = [m.register_forward_hook(hook) for m in m64.modules()]
    # 96 positions: the Gated DeltaNet's 64-token chunks, one whole and one part
    tokens = torch.randint(0, 1024, (1, 96), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        exact = m64(input_ids=tokens, use_cache=False).logits[0]
        for h in handles:
            h.remove()
        fp32 = m32(input_ids=tokens, use_cache=False).logits[0]
    assert exact.dtype == torch.float64
    assert set(dtypes) == {torch.float64}, f"a module made another dtype: {dtypes}"
    f = gpu_reference.compare_logits(exact, fp32, tokens[0], torch)
    assert f["kl"] < 1e-8, f
    assert f["max_abs"] > 0, "fp32 and fp64 gave the same bits: the fp64 model is not computing in fp64"


def test_compare_logits_on_known_answers():
    rng = np.random.default_rng(7)
    n, V = 70, 50
    ref_np = rng.normal(size=(n, V)) * 3
    tokens = torch.from_numpy(rng.integers(0, V, size=n))
    ref = torch.from_numpy(ref_np)
    same = gpu_reference.compare_logits(ref, ref.clone(), tokens, torch)
    assert same["kl"] == 0 and same["top1"] == 100 and same["ppl"] == 0 and same["max_abs"] == 0
    # a constant shift of a row changes nothing but |dlogit|
    shifted = gpu_reference.compare_logits(ref, ref + 2.5, tokens, torch)
    assert shifted["kl"] < 1e-12 and shifted["top1"] == 100 and abs(shifted["ppl"]) < 1e-9
    assert math.isclose(shifted["max_abs"], 2.5)
    # position 3's top token pushed below its second: one top-1 differs, the worst position, with its margin
    got_np = ref_np.copy()
    top = int(ref_np[3].argmax())
    second = np.partition(ref_np[3], -2)[-2]
    got_np[3, top] = second - 1.0
    f = gpu_reference.compare_logits(ref, torch.from_numpy(got_np), tokens, torch)
    assert math.isclose(f["top1"], 100 * (1 - 1 / (n - 1)))
    assert f["worst"][0][0] == 3 and not f["worst"][0][2]
    assert math.isclose(f["worst"][0][3], ref_np[3, top] - second)
    # the KL of that one row, by its definition, averaged over the n − 1 positions
    la = ref_np[3] - np.log(np.exp(ref_np[3]).sum())
    lb = got_np[3] - np.log(np.exp(got_np[3]).sum())
    assert math.isclose(f["kl"], float((np.exp(la) * (la - lb)).sum()) / (n - 1), rel_tol=1e-9)
    # perplexity's change over tokens 1 .. n − 1 from positions 0 .. n − 2, in %
    def nll(x):
        return -sum(float(x[i, tokens[i + 1]] - np.log(np.exp(x[i]).sum())) for i in range(n - 1)) / (n - 1)
    assert math.isclose(f["ppl"], 100 * (math.exp(nll(got_np) - nll(ref_np)) - 1), rel_tol=1e-9)
