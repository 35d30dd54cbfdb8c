"""tern bench and tern eval end to end on the CPU.

bench: the demo model at tiny lengths; the JSON holds every length with consistent figures, the SVG parses.
       --concurrency: a row per stream count, its figures consistent with the step times the JSON keeps.
       --speculative: every table's rows, figures consistent with each other, no output changed by the drafts; its
       --plot SVG parses and draws a curve per draft count and a marker per end-to-end row with the JSON's figures.
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


def test_bench_speculative_demo_cpu(tern_bin, tmp_path):
    """tern bench --speculative on the demo model: every table row there, the JSON's figures consistent with each
    other, and every end-to-end run's output the reference's. Acceptance 0 and 1 make the drafts' fate certain: all
    rejected, all accepted (k + 1 tokens a step, but for the last)."""
    js, svg = tmp_path / "spec.json", tmp_path / "spec.svg"
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--speculative", "--lengths", "16,48", "--draft-max", "4",
             "--draft-counts", "2,4", "--acceptance", "0,0.6,1", "--decode-steps", "20", "--repeats", "2",
             "--warmup", "0", "--json", js, "--plot", svg, "--quiet"])
    out = r.stdout
    assert ("| context | drafts | verify ms | rollback ms | x plain step | MTP draft ms | MTP ms / draft |"
            in out), out
    assert "| context | drafts | acceptance | accepted / drafted | tokens / step |" in out, out
    assert "COMPUTED from the costs above (not measured)" in out, out
    assert "mismatches against decoding without drafts: 0 of 28 runs" in out, out
    rows16 = [line for line in out.splitlines() if line.startswith("|      16 |")]
    assert len(rows16) == (1 + 5) + (1 + 2 * 3) + 2 * 3, out  # verify: plain, k = 0..4; end to end; published
    doc = json.loads(js.read_text())
    assert doc["backend"] == "cpu" and doc["mtp"] is True and doc["mismatches"] == 0 and doc["runs"] == 28
    assert doc["method"]["draft_counts"] == [2, 4] and doc["method"]["acceptance"] == [0, 0.6, 1]
    assert "--speculative" in doc["command"]
    assert [p["length"] for p in doc["points"]] == [16, 48]
    for p in doc["points"]:
        plain = p["plain_ms_median"]
        assert len(p["plain_ms"]) == 2 and plain == pytest.approx(float(np.median(p["plain_ms"])), rel=1e-12)
        assert [v["drafts"] for v in p["verify"]] == [0, 1, 2, 3, 4]
        for v in p["verify"]:
            assert len(v["ms"]) == 2 and v["ratio"] == pytest.approx(v["ms_median"] / plain, rel=1e-9)
            # The rollback's own time, timed inside each verify's: a part of it.
            assert len(v["rollback_ms"]) == 2 and all(0 <= b <= m for b, m in zip(v["rollback_ms"], v["ms"]))
            assert v["rollback_ms_median"] == pytest.approx(float(np.median(v["rollback_ms"])), rel=1e-12)
            assert (v["drafts"] > 0) == ("mtp_draft_ms_median" in v)
            if v["drafts"] > 0:
                assert v["mtp_draft_ms_median"] > 0
        rows = p["end_to_end"]
        assert [(e["drafts"], e["acceptance"]) for e in rows] == [(0, None), (2, 0), (2, 0.6), (2, 1), (4, 0),
                                                                   (4, 0.6), (4, 1)]
        for e in rows:
            assert e["runs"] == 2 and e["mismatches"] == 0 and e["first_mismatch"] is None
            assert e["generated"] == 2 * 19 and len(e["tok_s"]) == 2
            assert e["speedup"] == pytest.approx(e["tok_s_median"] / rows[0]["tok_s_median"], rel=1e-9)
            if e["drafts"] == 0:
                assert e["drafted"] == 0 and e["decode_steps"] == e["generated"]
                continue
            k, a = e["drafts"], e["acceptance"]
            verify = p["verify"][k]["ms_median"]
            tokens_per_step = (k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)
            assert e["computed_speedup"] == pytest.approx(tokens_per_step * plain / verify, rel=1e-9)
            assert e["drafted"] > 0
            if a == 0:  # every draft wrong: each step verifies and keeps only its own token
                assert e["accepted"] == 0 and e["decode_steps"] == e["generated"]
            if a == 1:  # every draft right: k + 1 tokens a step (the last step takes what is left)
                assert e["accepted"] == e["drafted"]
                assert e["decode_steps"] == 2 * -(-19 // (k + 1))
        pub = p["published_computed"]
        assert [(c["drafts"], c["acceptance"]) for c in pub] == [(3, 0.73), (3, 0.8), (3, 0.87), (4, 0.73), (4, 0.8),
                                                                  (4, 0.87)]
        for c in pub:
            k, a = c["drafts"], c["acceptance"]
            v = p["verify"][k]
            assert c["draft_cost_included"] is True
            assert c["tokens_per_step"] == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-12)
            assert c["cost_ratio"] == pytest.approx((v["ms_median"] + v["mtp_draft_ms_median"]) / plain, rel=1e-9)
            assert c["computed_speedup"] == pytest.approx(c["tokens_per_step"] / c["cost_ratio"], rel=1e-9)

    # The plot: a verify line per length; the first length's computed curves per k = 1..4 (verify alone, and with
    # the MTP head's draft cost) and a marker per end-to-end row with drafts, its tooltip the JSON's figures.
    text = svg.read_text()
    assert "nan" not in text.lower() and "inf" not in text.lower(), text
    root = ET.fromstring(text)  # well-formed XML
    assert root.tag.endswith("svg")
    lines = [e for e in root.iter() if e.tag.endswith("polyline")]
    assert sorted(e.get("class") for e in lines) == ["computed"] * 4 + ["computed-mtp"] * 4 + ["verify"] * 2
    markers = [e for e in root.iter() if e.tag.endswith("circle") and e.get("class") == "measured"]
    first = doc["points"][0]
    rows = [e for e in first["end_to_end"] if e["drafts"] > 0]
    assert len(markers) == len(rows) == 6
    tips = [next(c for c in m if c.tag.endswith("title")).text for m in markers]
    for e, tip in zip(rows, tips):
        assert tip.startswith(f"k = {e['drafts']} at forced acceptance {e['acceptance']:.2f}: "
                              f"measured {e['speedup']:.2f}x ({e['tok_s_median']:.1f} tok/s), "
                              f"computed {e['computed_speedup']:.2f}x;"), (tip, e)
    plain = first["plain_ms_median"]
    for e in lines:
        if e.get("class") != "computed":
            continue
        tip = next(c for c in e if c.tag.endswith("title")).text
        k = int(tip.split(",")[0].removeprefix("k = "))
        verify = first["verify"][k]["ms_median"]
        assert tip.endswith(f": {plain / verify:.2f}x at p = 0, {(k + 1) * plain / verify:.2f}x at p = 1"), tip


def test_bench_speculative_rejects_bad_flags(tern_bin):
    base = [tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16"]
    for extra, fragment in ((["--speculative", "--acceptance", "0.5,1.5"], "--acceptance"),
                            (["--speculative", "--acceptance", "x"], "--acceptance"),
                            (["--speculative", "--draft-counts", "9"], "--draft-counts"),
                            (["--speculative", "--draft-max", "2", "--draft-counts", "3"], "--draft-counts"),
                            (["--acceptance", "0.5"], "--speculative"),
                            (["--speculative", "--prefix-reuse"], "--speculative"),
                            (["--speculative", "--concurrency", "1,2"], "--speculative"),
                            (["--speculative", "--lengths", "32K"], "--lengths")):
        r = run(base + extra, check=False)
        assert r.returncode == 2 and fragment in r.stderr, (extra, r.stderr)


def test_bench_rejects_bad_flags(tern_bin):
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16,abc"], check=False)
    assert r.returncode == 2 and "--lengths" in r.stderr, r.stderr  # usage errors exit 2
    r = run([tern_bin, "bench", "--demo", "--synthetic", "--lengths", "16"], check=False)
    assert r.returncode == 2 and "exactly one" in r.stderr, r.stderr


def test_bench_concurrency_demo_cpu(tern_bin, tmp_path):
    js = tmp_path / "bench.json"
    r = run([tern_bin, "bench", "--demo", "--device", "cpu", "--concurrency", "1,2", "--lengths", "64",
             "--decode-steps", "4", "--repeats", "2", "--warmup", "1", "--json", js, "--quiet"])
    out = r.stdout
    assert "| context | streams | aggregate tok/s | per-stream tok/s | ITL p50 ms | ITL p99 ms | memory GB |" in out, out
    assert "prefill tok/s" not in out, out  # the concurrency rows replace the table by length
    rows = [line for line in out.splitlines() if line.startswith("|      64 |")]
    assert len(rows) == 2, out
    doc = json.loads(js.read_text())
    assert doc["backend"] == "cpu"
    assert doc["decode_path"].startswith("forward_batch"), doc["decode_path"]
    assert doc["method"]["concurrency"] == [1, 2] and doc["method"]["decode_steps"] == 4
    assert "--concurrency 1,2" in doc["command"]
    assert doc["points"] == []
    assert [(c["length"], c["streams"]) for c in doc["concurrency"]] == [(64, 1), (64, 2)]
    for c, row in zip(doc["concurrency"], rows):
        n = c["streams"]
        assert c["decode_steps"] == 4 and c["decode_context"] == 64 + 2
        assert len(c["decode_ms"]) == 2 and len(c["step_ms"]) == 2 * 4
        steps = np.array(c["step_ms"]).reshape(2, 4)
        assert (steps > 0).all()
        assert c["decode_ms"] == pytest.approx(steps.sum(axis=1).tolist(), rel=1e-9)  # a run: the sum of its steps
        assert c["decode_ms_median"] == pytest.approx(float(np.median(c["decode_ms"])), rel=1e-12)
        assert c["per_stream_tok_s"] == pytest.approx(4 / (c["decode_ms_median"] * 1e-3), rel=1e-9)
        assert c["aggregate_tok_s"] == pytest.approx(n * c["per_stream_tok_s"], rel=1e-9)
        assert c["itl_p50_ms"] == pytest.approx(float(np.percentile(c["step_ms"], 50)), rel=1e-9)
        assert c["itl_p99_ms"] == pytest.approx(float(np.percentile(c["step_ms"], 99)), rel=1e-9)
        assert c["memory_peak_bytes"] > 0
        # The table's row shows the same figures.
        cells = [x.strip() for x in row.strip("|").split("|")]
        assert cells[:2] == ["64", str(n)], row
        assert float(cells[2]) == pytest.approx(c["aggregate_tok_s"], abs=0.051), row
        assert float(cells[3]) == pytest.approx(c["per_stream_tok_s"], abs=0.051), row
        assert float(cells[4]) == pytest.approx(c["itl_p50_ms"], abs=5e-4), row
        assert float(cells[5]) == pytest.approx(c["itl_p99_ms"], abs=5e-4), row
        assert float(cells[6]) == pytest.approx(c["memory_peak_bytes"] * 1e-9, abs=5e-3), row


def test_bench_concurrency_rejects_bad_flags(tern_bin, tmp_path):
    base = [tern_bin, "bench", "--demo", "--device", "cpu", "--lengths", "16"]
    for bad, says in [(["--concurrency", "0"], "between 1 and 256"), (["--concurrency", "1,257"], "between 1 and 256"),
                      (["--concurrency", "1,x"], "--concurrency"), (["--concurrency", ""], "--concurrency"),
                      (["--concurrency", "2", "--decode-steps", "0"], "--decode-steps"),
                      (["--concurrency", "2", "--plot", tmp_path / "p.svg"], "--plot"),
                      (["--concurrency", "2", "--prefix-reuse"], "--prefix-reuse")]:
        r = run([*base, *bad], check=False)
        assert r.returncode == 2 and says in r.stderr, (bad, r.stderr)  # usage errors exit 2


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


def eval_cmd(tern_bin, tiny, reference):
    # --dtype stored: the fp32 weights as they are (auto would quantise an HF checkpoint to 4-bit).
    return [tern_bin, "eval", "-m", tiny / "model", "--dtype", "stored", "--device", "cpu", "--tokens-file",
            tiny / "tokens.npy", "--reference", reference]


def tern_eval(tern_bin, tiny, reference, out_json, extra=()):
    run([*eval_cmd(tern_bin, tiny, reference), "--json", out_json, "--batch", "20", *extra])
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
    r = run([*eval_cmd(tern_bin, tiny, tmp_path / "pert.npy"), "--max-kl", "1e-6"], check=False)
    assert r.returncode == 1 and "--max-kl" in r.stderr, r.stderr


def test_eval_report_tells_near_tie_flips_from_real_error(tern_bin, tiny, tmp_path):
    """The reference is transformers' logits with three planted flips: at one position its runner-up is raised to
    lead by 0.05 nats (a near-tie at the default --tie-margin 0.1); at another its last token to lead by 2 nats; at a
    third its two last tokens to lead by 3 and 2.98 nats (its top two are 0.02 apart, but tern's top-1 is 3 nats
    below: real error). The report must list the three with their tokens and margins, count them apart, and find no
    other difference beyond the tie margin (elsewhere tern and the reference differ by fp32 noise only)."""
    ref = np.load(tiny / "ref.npy")
    vr = vocab_real(tiny / "model")
    r64 = ref[:, :vr].astype(np.float64)
    srt = np.sort(r64, axis=-1)
    own_margin = srt[:, -1] - srt[:, -2]
    # The three most decided positions: there tern's top-1 is the reference's, far beyond fp32 noise.
    tie_pos, far_pos, deep_pos = (int(i) for i in np.argsort(-own_margin)[:3])
    assert own_margin[deep_pos] > 1e-3, own_margin
    top = r64.argmax(-1)
    order = np.argsort(r64, axis=-1)
    pert = ref.copy()
    # (position, the reference's new top-1, its runner-up, their margin, the gap to tern's top-1)
    planted = [(tie_pos, int(order[tie_pos, -2]), top[tie_pos], 0.05, 0.05),
               (far_pos, int(order[far_pos, 0]), top[far_pos], 2.0, 2.0),
               (deep_pos, int(order[deep_pos, 0]), int(order[deep_pos, 1]), 0.02, 3.0)]
    for i, tok, runner_up, margin, gap in planted:
        pert[i, runner_up] = ref[i, top[i]] + np.float32(gap - margin)
        pert[i, tok] = ref[i, top[i]] + np.float32(gap)
    np.save(tmp_path / "flip.npy", pert)
    out = run([*eval_cmd(tern_bin, tiny, tmp_path / "flip.npy"), "--report", tmp_path / "report.json"]).stdout
    assert "near-ties (the reference's top-1 leads tern's by < 0.1 nats)" in out and "KL quantiles" in out, out
    rep = json.loads((tmp_path / "report.json").read_text())
    s, pos = rep["summary"], rep["positions"]
    assert list(rep) == ["summary", "positions"]
    assert len(pos) == N_TOKENS and [p["position"] for p in pos] == list(range(N_TOKENS))
    p64 = pert[:, :vr].astype(np.float64)
    for i, tok, runner_up, margin, gap in planted:
        p = pos[i]
        assert p["reference_top1"] == tok and p["tern_top1"] == top[i], p
        # The reference's margin and gap come from its own float32 values (exact); tern's margin from its logits.
        assert p["reference_margin"] == pytest.approx(p64[i, tok] - p64[i, runner_up], rel=1e-9)
        assert p["reference_margin"] == pytest.approx(margin, abs=1e-5)
        assert p["reference_gap"] == pytest.approx(p64[i, tok] - p64[i, top[i]], rel=1e-9, abs=1e-12)
        assert p["reference_gap"] == pytest.approx(gap, abs=1e-5)
        assert p["tern_margin"] == pytest.approx(own_margin[i], abs=1e-4)
    assert pos[tie_pos]["top1"] == "near-tie", pos[tie_pos]
    # Nothing else beyond the tie margin; any other flip is an fp32-noise tie of the reference itself.
    differ = [p["position"] for p in pos if p["top1"] != "same"]
    assert [p["position"] for p in pos if p["top1"] == "differs"] == sorted([far_pos, deep_pos]), differ
    assert all(pos[i]["reference_gap"] < 1e-3 for i in differ if i not in (tie_pos, far_pos, deep_pos)), differ
    assert s["top1_difference_positions"] == differ
    assert s["top1_differences"] == len(differ) and s["beyond_tie_margin"] == 2
    assert s["near_ties"] == len(differ) - 2 and s["tie_margin"] == 0.1
    assert s["top1_agreement"] == pytest.approx(1 - len(differ) / N_TOKENS, rel=1e-12)
    # Per-position KL against numpy's, with the unperturbed reference standing in for tern's logits.
    lp, lq = log_softmax(r64), log_softmax(p64)
    kl = (np.exp(lq) * (lq - lp)).sum(axis=-1)
    got = np.array([p["kl"] for p in pos])
    assert got == pytest.approx(kl, rel=1e-3, abs=1e-5)
    assert s["kl_mean"] == pytest.approx(got.mean(), rel=1e-9)
    for key, q in (("kl_p50", 0.5), ("kl_p90", 0.9), ("kl_p99", 0.99)):
        assert s[key] == pytest.approx(np.quantile(got, q), rel=1e-9, abs=1e-15), key
    worst = int(np.ceil(N_TOKENS / 100))
    assert s["worst_1pct_positions"] == worst
    assert s["worst_1pct_kl_share"] == pytest.approx(np.sort(got)[::-1][:worst].sum() / got.sum(), rel=1e-9)

    # The text form: a tie margin of 2.5 makes the 2-nat flip a near-tie, not the 3-nat one.
    run([*eval_cmd(tern_bin, tiny, tmp_path / "flip.npy"), "--report", tmp_path / "report.tsv", "--tie-margin", "2.5"])
    lines = (tmp_path / "report.tsv").read_text().splitlines()
    assert any(ln.startswith("# top-1 differ") and "by < 2.5 nats" in ln for ln in lines), lines[:12]
    tables = [ln.split("\t") for ln in lines if ln and not ln.startswith("#")]
    header = tables[0]
    rows = [dict(zip(header, t)) for t in tables if t != header]
    assert len(rows) == len(differ) + N_TOKENS
    flips = {int(r["position"]): r for r in rows[:len(differ)]}
    assert sorted(flips) == differ
    assert flips[far_pos]["top1"] == "near-tie" and flips[deep_pos]["top1"] == "differs"
    assert int(flips[far_pos]["reference_top1"]) == planted[1][1]
    assert float(flips[far_pos]["kl"]) == pytest.approx(pos[far_pos]["kl"], rel=1e-5)
    assert rows[len(differ) + far_pos] == flips[far_pos]  # the same row in the table of every position


def test_eval_report_rejects_bad_input(tern_bin, tiny, tmp_path):
    cmd = eval_cmd(tern_bin, tiny, tiny / "ref.npy")
    r = run([*cmd, "--report", tmp_path / "missing" / "r.json"], check=False)
    assert r.returncode == 1 and "cannot write the report" in r.stderr, r.stderr
    r = run([*cmd, "--report", tmp_path / "r.tsv", "--tie-margin=-1"], check=False)
    assert r.returncode == 1 and "--tie-margin" in r.stderr, r.stderr
    r = run([*cmd, "--tie-margin", "0.2"], check=False)
    assert r.returncode == 1 and "--tie-margin goes with --report" in r.stderr, r.stderr
    ref = np.load(tiny / "ref.npy")
    ref[5, 3] = np.nan
    np.save(tmp_path / "nan.npy", ref)
    r = run([*eval_cmd(tern_bin, tiny, tmp_path / "nan.npy"), "--report", tmp_path / "r.tsv"], check=False)
    assert r.returncode == 1 and "reference logits at position 5" in r.stderr and "not finite" in r.stderr, r.stderr
    assert not (tmp_path / "r.tsv").exists()
    r = run([tern_bin, "eval", "-m", tiny / "model", "--device", "cpu", "--tokens-file", tiny / "tokens.npy",
             "--report", tmp_path / "r.tsv"], check=False)
    assert r.returncode == 1 and "--report needs --reference" in r.stderr, r.stderr
    help_text = run([tern_bin, "eval", "--help"]).stdout
    assert "--tie-margin" in help_text and "0.1" in help_text, help_text


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
