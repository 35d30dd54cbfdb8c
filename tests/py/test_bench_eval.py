"""tern bench and tern eval end to end on the CPU.

bench: the demo model at tiny lengths; the JSON holds every length with consistent figures, the SVG parses.
eval:  a tiny random HF model (tests/oracles/make_model.py) teacher-forced in transformers (fp32, CPU) gives the
       reference logits (tests/oracles/reference_eval_logits.py); tern eval on the CPU must find KL ~ 0 and the same
       perplexity (1e-4 relative). With a perturbed reference, every metric tern reports must equal the one computed
       here in numpy from the reference (perplexity) and from the unperturbed reference as a stand-in for tern's
       logits (KL, top-1), within tolerances stated below.
"""
import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = sys.executable
N_TOKENS = 48


def run(cmd, check=True, timeout=600):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def test_bench_demo_cpu(tern_bin, tmp_path):
    js, svg = tmp_path / "bench.json", tmp_path / "bench.svg"
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16,32", "--repeats", "2", "--warmup", "1",
             "--decode-steps", "3", "--json", js, "--plot", svg, "--quiet"])
    assert "|     16 |" in r.stdout and "|     32 |" in r.stdout, r.stdout
    doc = json.loads(js.read_text())
    assert doc["backend"] == "cpu"
    assert [p["length"] for p in doc["points"]] == [16, 32]
    for p in doc["points"]:
        assert len(p["prefill_ms"]) == 2 and len(p["decode_ms_per_token"]) == 2
        assert p["prefill_ms_median"] == pytest.approx(float(np.median(p["prefill_ms"])), rel=1e-12)
        assert p["prefill_tok_s"] == pytest.approx(p["length"] / (p["prefill_ms_median"] * 1e-3), rel=1e-9)
        assert p["decode_tok_s"] == pytest.approx(1e3 / p["decode_ms_median"], rel=1e-9)
        assert p["decode_gb_s"] == pytest.approx(p["decode_bytes_per_token"] * p["decode_tok_s"] * 1e-9, rel=1e-9)
        assert p["prefill_tflop_s"] == pytest.approx(p["prefill_flops"] / (p["prefill_ms_median"] * 1e-3) * 1e-12,
                                                     rel=1e-9)
        assert p["memory_peak_bytes"] > 0
    root = ET.parse(svg).getroot()  # well-formed XML
    assert root.tag.endswith("svg")
    assert len([e for e in root.iter() if e.tag.endswith("polyline")]) == 2


def test_bench_rejects_bad_flags(tern_bin):
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16,abc"], check=False)
    assert r.returncode == 2 and "--lengths" in r.stderr, r.stderr  # usage errors exit 2
    r = run([tern_bin, "bench", "--demo", "--synthetic", "--lengths", "16"], check=False)
    assert r.returncode == 2 and "exactly one" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random fp32 HF model, N_TOKENS random ids and transformers' logits for them."""
    import random
    seed = random.SystemRandom().randrange(1 << 31)
    print(f"tiny model seed={seed}")
    d = tmp_path_factory.mktemp("eval")
    run([PY, ROOT / "tests/oracles/make_model.py", "--out", d / "model", "--seed", seed, "--preset", "tiny",
         "--layout", "hf", "--dtype", "float32"])
    run([PY, ROOT / "tests/oracles/reference_eval_logits.py", "--model", d / "model", "--tokens", d / "tokens.npy",
         "--out", d / "ref.npy", "--random-tokens", N_TOKENS, "--seed", seed])
    return d


def vocab_real(model_dir):
    t = json.loads((model_dir / "tokenizer.json").read_text())
    return max(list(t["model"]["vocab"].values()) + [a["id"] for a in t["added_tokens"]]) + 1


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def tern_eval(tern_bin, tiny, reference, out_json, extra=()):
    # --dtype stored: the fp32 weights as they are (auto would quantise an HF checkpoint to 4-bit).
    run([tern_bin, "eval", "-m", tiny / "model", "--dtype", "stored", "--device", "cpu", "--tokens-file",
         tiny / "tokens.npy",
         "--reference", reference, "--json", out_json, "--batch", "20", *extra])
    return json.loads(out_json.read_text())


def test_eval_matches_transformers(tern_bin, tiny, tmp_path):
    ids = np.load(tiny / "tokens.npy")
    ref = np.load(tiny / "ref.npy")
    vr = vocab_real(tiny / "model")
    s = tern_eval(tern_bin, tiny, tiny / "ref.npy", tmp_path / "eval.json",
                  extra=["--max-kl", "1e-6", "--max-ppl-rel", "1e-4"])
    assert s["positions"] == N_TOKENS and s["predictions"] == N_TOKENS - 1
    # tern's fp32 CPU path computes transformers' fp32 function: KL ~ 0, perplexity within 1e-4 relative.
    assert s["kl_mean"] < 1e-6, s
    assert abs(s["perplexity"] / s["reference_perplexity"] - 1) < 1e-4, s
    # The reference's own perplexity, computed here in numpy (float64 over the real vocabulary): 1e-9 relative.
    lq = log_softmax(ref[:, :vr])
    ppl_ref = np.exp(-lq[np.arange(N_TOKENS - 1), ids[1:]].mean())
    assert s["reference_perplexity"] == pytest.approx(ppl_ref, rel=1e-9)
    # Random weights give flat distributions: top-1 is reported, but ties at fp32 noise may flip a few.
    assert s["top1_agreement"] >= 0.9, s


def test_eval_metrics_move_with_a_perturbed_reference(tern_bin, tiny, tmp_path):
    ids = np.load(tiny / "tokens.npy")
    ref = np.load(tiny / "ref.npy")
    vr = vocab_real(tiny / "model")
    rng = np.random.default_rng(int(ids.sum()))
    noise_scale = 2.0 * float(ref[:, :vr].std())  # stated perturbation: N(0, (2 x logit std)^2) per logit
    pert = (ref + rng.normal(0.0, noise_scale, size=ref.shape)).astype(np.float32)
    np.save(tmp_path / "pert.npy", pert)
    s = tern_eval(tern_bin, tiny, tmp_path / "pert.npy", tmp_path / "eval.json")
    # Expected values, with the unperturbed reference standing in for tern's logits (they agree to KL < 1e-6).
    lp, lq = log_softmax(ref[:, :vr]), log_softmax(pert[:, :vr])
    kl = (np.exp(lq) * (lq - lp)).sum(axis=-1)
    top1 = (ref[:, :vr].argmax(-1) == pert[:, :vr].argmax(-1)).mean()
    ppl_pert = np.exp(-lq[np.arange(N_TOKENS - 1), ids[1:]].mean())
    assert kl.mean() > 1e-3  # the perturbation is visible
    assert s["kl_mean"] == pytest.approx(kl.mean(), rel=1e-3)
    assert s["kl_max"] == pytest.approx(kl.max(), rel=1e-3)
    assert s["top1_agreement"] == pytest.approx(top1, abs=2.0 / N_TOKENS)
    assert s["top1_agreement"] < 1.0
    assert s["reference_perplexity"] == pytest.approx(ppl_pert, rel=1e-9)  # exact data: float64 sums
    # A bound that the metrics exceed makes tern eval fail with status 1 and say why.
    r = run([tern_bin, "eval", "-m", tiny / "model", "--dtype", "stored", "--device", "cpu", "--tokens-file",
             tiny / "tokens.npy", "--reference", tmp_path / "pert.npy", "--max-kl", "1e-6"], check=False)
    assert r.returncode == 1 and "--max-kl" in r.stderr, r.stderr


def test_eval_rejects_mismatched_reference(tern_bin, tiny, tmp_path):
    ref = np.load(tiny / "ref.npy")
    np.save(tmp_path / "short.npy", ref[:-1])
    r = run([tern_bin, "eval", "-m", tiny / "model", "--device", "cpu", "--tokens-file", tiny / "tokens.npy",
             "--reference", tmp_path / "short.npy"], check=False)
    assert r.returncode == 1 and "rows" in r.stderr, r.stderr


def test_eval_text_gives_the_perplexity_of_its_tokens(tern_bin, tiny, tmp_path):
    from tokenizers import Tokenizer
    text = "The quick brown fox jumps over the lazy dog. Hello, world! Paris is the capital of France.\n" * 2
    (tmp_path / "t.txt").write_text(text)
    ids = Tokenizer.from_file(str(tiny / "model" / "tokenizer.json")).encode(text).ids
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    run([tern_bin, "eval", "-m", tiny / "model", "--device", "cpu", "--text", tmp_path / "t.txt", "--json", a])
    run([tern_bin, "eval", "-m", tiny / "model", "--device", "cpu", "--tokens-file", tmp_path / "ids.txt",
         "--json", b])
    sa, sb = json.loads(a.read_text()), json.loads(b.read_text())
    assert sa["positions"] == len(ids) and sa["predictions"] == len(ids) - 1
    assert sa["perplexity"] == pytest.approx(sb["perplexity"], rel=1e-12)
    assert np.isfinite(sa["perplexity"]) and "kl_mean" not in sa


def test_bench_json_schema_needs_device_sampling_and_a_valid_schema(tern_bin, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16", "--repeats", "1", "--warmup", "0",
             "--decode-steps", "4", "--json-schema", schema], check=False)
    assert r.returncode == 1 and "samples on its device" in r.stderr, r.stderr  # the CPU runner samples on the host
    schema.write_text('{"type": "object", "not": {}}')
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16", "--json-schema", schema], check=False)
    assert r.returncode == 2 and '"not"' in r.stderr, r.stderr
