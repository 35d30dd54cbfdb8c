"""The MTP draft head (issue 32): tern's CPU logits against tests/oracles/mtp_reference.py (PyTorch, written from
the published architecture, since transformers drops the mtp.* weights) on a fresh random model each run, fp32 and
4-bit; a folder without the head loads and says so once; tern extract-mtp and --draft-weights round trip; tern
quantize keeps the head; broken draft files fail with a message; generation with the head's drafts
(--speculative mtp) gives the tokens it gives without, and without the head mtp says so once."""
import json
import os
import pathlib
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from near_tie import check_or_near_tie

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORACLES = ROOT / "tests" / "oracles"


def run(cmd, check=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    if check:
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stderr[-3000:]}"
    return r


def make_model(out, seed, *args):
    run([sys.executable, ORACLES / "make_model.py", "--out", out, "--seed", seed, "--hf-format", "official", *args])
    return pathlib.Path(out)


def inspect_json(tern_bin, model, *extra):
    return json.loads(run([tern_bin, "inspect", "-m", model, "--json", *extra]).stdout)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One random model (fp32, official HF form) with the MTP head, and the same model without it."""
    seed = int(os.environ.get("TERN_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"seed={seed}")
    base = tmp_path_factory.mktemp("mtp")
    return {"seed": seed, "base": base,
            "mtp": make_model(base / "mtp", seed, "--dtype", "float32"),
            "nomtp": make_model(base / "nomtp", seed, "--dtype", "float32", "--no-mtp")}


def prompt(models, tern_bin, n=9, k=2):
    rng = random.Random(models["seed"])
    vocab = inspect_json(tern_bin, models["mtp"])["model"]["vocab_real"]
    return [rng.randrange(vocab) for _ in range(n)], [rng.randrange(vocab) for _ in range(k)], vocab


def tern_mtp_logits(tern_bin, model, tokens, drafts, out_dir, *extra, prefill=5):
    out_dir.mkdir(parents=True, exist_ok=True)
    main, mtp = out_dir / "main.npy", out_dir / "mtp.npy"
    run([tern_bin, "logits", "-m", model, "--tokens", ",".join(map(str, tokens)), "--out", main, "--prefill", prefill,
         "--mtp-out", mtp, "--mtp-draft", ",".join(map(str, drafts)), *extra])
    return np.load(mtp)


def reference_mtp_logits(model, tokens, drafts, out):
    run([sys.executable, ORACLES / "mtp_reference.py", "--model", model, "--tokens", ",".join(map(str, tokens)),
         "--draft", ",".join(map(str, drafts)), "--out", out])
    return np.load(out)


def assert_close(ours, ref, vocab, rel):
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    assert np.all(np.isneginf(ours[:, vocab:])), "padding ids must be -inf"
    a, b = ours[:, :vocab], ref[:, :vocab]
    err = np.abs(a - b).max()
    scale = max(1.0, np.abs(b).max())
    print(f"max |tern - reference| = {err:.3g} (logits up to {scale:.3g})")
    assert err <= rel * scale, f"MTP logits differ from the reference by {err} (> {rel} x {scale})"
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9


def assert_close_or_near_tie(ours, ref, vocab, rel, tern_bin, model, tokens, tmp):
    """assert_close, except that a difference a main-model near-tie explains is reported as a skip, not a failure."""
    check_or_near_tie(lambda: assert_close(ours, ref, vocab, rel), tern_bin, model, tokens, tmp)


def test_mtp_logits_match_reference_fp32(tern_bin, models, tmp_path):
    tokens, drafts, vocab = prompt(models, tern_bin)
    ours = tern_mtp_logits(tern_bin, models["mtp"], tokens, drafts, tmp_path / "tern", "--dtype", "stored")
    ref = reference_mtp_logits(models["mtp"], tokens, drafts, tmp_path / "ref.npy")
    assert ours.shape[0] == len(tokens) - 1 + len(drafts)
    assert_close_or_near_tie(ours, ref, vocab, 1e-4, tern_bin, models["mtp"], tokens, tmp_path)
    # One prefill or token by token: the same head, the same logits (up to the order of sums).
    again = tern_mtp_logits(tern_bin, models["mtp"], tokens, drafts, tmp_path / "tern1", "--dtype", "stored",
                            prefill=1)
    assert_close_or_near_tie(again, ref, vocab, 1e-4, tern_bin, models["mtp"], tokens, tmp_path)


def test_quantize_keeps_mtp_and_matches_reference(tern_bin, models, tmp_path):
    """tern quantize writes the head (MLX forms, 4-bit with an 8-bit router); its logits match the reference run on
    the same dequantised weights."""
    q = tmp_path / "q4"
    run([tern_bin, "quantize", "--in", models["mtp"], "--out", q, "--no-progress"])
    s = inspect_json(tern_bin, q)
    assert s["source"]["layout"] == "mlx" and s["source"]["mtp"] == str(q)
    assert s["model"]["weights"]["by_kind"]["mtp"]["formats"] == {"affine4": 11, "affine8": 2}
    tokens, drafts, vocab = prompt(models, tern_bin)
    ours = tern_mtp_logits(tern_bin, q, tokens, drafts, tmp_path / "tern", "--dtype", "stored")
    ref = reference_mtp_logits(q, tokens, drafts, tmp_path / "ref.npy")
    assert_close_or_near_tie(ours, ref, vocab, 1e-4, tern_bin, q, tokens, tmp_path)


def test_folder_without_mtp_loads_and_says_so_once(tern_bin, models):
    s = inspect_json(tern_bin, models["nomtp"])
    assert s["source"]["mtp"] is None and "no mtp.* tensors" in s["source"]["mtp_absent"]
    assert "mtp" not in s["model"]["weights"]["by_kind"]
    with_mtp = inspect_json(tern_bin, models["mtp"])
    assert with_mtp["source"]["mtp"] == str(models["mtp"]) and with_mtp["source"]["mtp_absent"] is None
    r = run([tern_bin, "generate", "-m", models["nomtp"], "--device", "cpu", "--tokens", "1,2,3", "-n", "2",
             "--temperature", "0", "--print-ids"])
    assert r.stderr.count("no MTP draft head") == 1, r.stderr
    r = run([tern_bin, "generate", "-m", models["mtp"], "--device", "cpu", "--tokens", "1,2,3", "-n", "2",
             "--temperature", "0", "--print-ids"])
    assert "no MTP draft head" not in r.stderr
    r = run([tern_bin, "logits", "-m", models["nomtp"], "--tokens", "1,2", "--out", models["base"] / "x.npy",
             "--mtp-out", models["base"] / "y.npy"], check=False)
    assert r.returncode == 1 and "no MTP draft head" in r.stderr and "extract-mtp" in r.stderr, r.stderr


def generate_ids(tern_bin, model, mode, tokens, n=24):
    r = run([tern_bin, "generate", "-m", model, "--device", "cpu", "--tokens", ",".join(map(str, tokens)), "-n", n,
             "--temperature", "0", "--ignore-eos", "--print-ids", "--speculative", mode])
    return r.stdout, r.stderr


def test_generate_with_mtp_drafts_gives_the_same_tokens(tern_bin, models):
    """--speculative mtp (and auto, which takes the head) on the model with the head: the tokens of --speculative off;
    on the model without it, mtp says so once and runs without drafts, and auto falls back to ngram silently."""
    tokens, _, _ = prompt(models, tern_bin, n=12)
    want, _ = generate_ids(tern_bin, models["mtp"], "off", tokens)
    assert want.strip()
    for mode in ("mtp", "auto"):
        got, err = generate_ids(tern_bin, models["mtp"], mode, tokens)
        assert got == want, mode
        assert "--speculative" not in err, err
    got, err = generate_ids(tern_bin, models["nomtp"], "mtp", tokens)
    assert got == generate_ids(tern_bin, models["nomtp"], "off", tokens)[0]
    assert err.count("--speculative mtp runs without drafts") == 1, err
    assert "no MTP draft head" in err.split("--speculative mtp")[0], err
    got, err = generate_ids(tern_bin, models["nomtp"], "auto", tokens)
    assert "--speculative" not in err, err


def read_header(path):
    data = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def test_extract_mtp_and_draft_weights_round_trip(tern_bin, models, tmp_path):
    f = tmp_path / "mtp.safetensors"
    run([tern_bin, "extract-mtp", "-m", models["mtp"], "-o", f])
    header, _ = read_header(f)
    names = sorted(k for k in header if k != "__metadata__")
    assert len(names) == 19 and all(n.startswith("mtp.") for n in names)
    assert header["__metadata__"]["format"] == "tern-mtp"
    # The folder without the head plus the file: the same weights and the same draft logits, bit for bit.
    s = inspect_json(tern_bin, models["nomtp"], "--draft-weights", f)
    assert s["source"]["mtp"] == str(f)
    assert s["model"] == inspect_json(tern_bin, models["mtp"])["model"]
    tokens, drafts, _ = prompt(models, tern_bin)
    a = tern_mtp_logits(tern_bin, models["mtp"], tokens, drafts, tmp_path / "a")
    b = tern_mtp_logits(tern_bin, models["nomtp"], tokens, drafts, tmp_path / "b", "--draft-weights", f)
    np.testing.assert_array_equal(a, b)
    # The model flags take it too (the head loads: no note).
    r = run([tern_bin, "generate", "-m", models["nomtp"], "--draft-weights", f, "--device", "cpu", "--tokens", "1,2",
             "-n", "1", "--temperature", "0", "--print-ids"])
    assert "no MTP draft head" not in r.stderr
    # From a quantised MLX folder: the file records the quantisation and loads into the same head.
    q = tmp_path / "q4"
    run([tern_bin, "quantize", "--in", models["mtp"], "--out", q, "--no-progress"])
    fq = tmp_path / "mtp-q4.safetensors"
    run([tern_bin, "extract-mtp", "-m", q, "-o", fq])
    assert "quantization" in read_header(fq)[0]["__metadata__"]
    sq = inspect_json(tern_bin, models["nomtp"], "--draft-weights", fq)
    assert sq["model"]["weights"]["by_kind"]["mtp"] == inspect_json(tern_bin, q)["model"]["weights"]["by_kind"]["mtp"]


def rewrite(src, dst, edit):
    header, data = read_header(src)
    edit(header)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    pathlib.Path(dst).write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_bad_draft_weights_fail_cleanly(tern_bin, models, tmp_path):
    f = tmp_path / "mtp.safetensors"
    run([tern_bin, "extract-mtp", "-m", models["mtp"], "-o", f])

    def wrong_shape(h):
        h["mtp.fc.weight"]["shape"] = list(reversed(h["mtp.fc.weight"]["shape"]))

    def missing(h):
        del h["mtp.norm.weight"]

    def stranger(h):
        h["model.language_model.norm.weight"] = h.pop("mtp.norm.weight")

    cases = {"wrong_shape": (wrong_shape, ["mtp.fc.weight", "expected"]),
             "missing": (missing, ["missing tensor", "mtp.norm.weight"]),
             "stranger": (stranger, ["unexpected tensor", "model.language_model.norm.weight"])}
    for name, (edit, fragments) in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        rewrite(f, bad, edit)
        r = run([tern_bin, "inspect", "-m", models["nomtp"], "--draft-weights", bad], check=False)
        assert r.returncode == 1, f"{name}: exit {r.returncode}\n{r.stderr}"
        for frag in fragments + ["--draft-weights"]:
            assert frag in r.stderr, f"{name}: '{frag}' not in:\n{r.stderr}"
    r = run([tern_bin, "inspect", "-m", models["nomtp"], "--draft-weights", tmp_path / "absent.safetensors"],
            check=False)
    assert r.returncode == 1 and "is not a file" in r.stderr
    r = run([tern_bin, "extract-mtp", "-m", models["nomtp"], "-o", tmp_path / "none.safetensors"], check=False)
    assert r.returncode == 1 and "no MTP draft head" in r.stderr, r.stderr
