"""Tokenizer speed: tern vs Hugging Face tokenizers, one thread each, same corpus (tokenizer_corpus.make_corpus).

usage: .venv/bin/python tests/oracles/bench_tokenizer.py TERN_BIN TOKENIZER_JSON [--seed N] [--repeat R] [--kinds K,..]

HF is timed as encode() in a Python loop and as encode_batch() with RAYON_NUM_THREADS=1 (set before import);
tern as `tern tokenize --lines --threads 1 --repeat R --time`, which times encoding only (not loading or I/O).
The best of R runs is reported. Ids are compared too (they must agree). No assertion on speed.
"""
import argparse
import base64
import json
import os
import pathlib
import re
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tokenizer_corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tern")
    ap.add_argument("tokenizer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", default="", help="comma-separated generators (e.g. english,code); default: all")
    a = ap.parse_args()
    if a.kinds:
        names = a.kinds.split(",")
        tokenizer_corpus.GENERATORS = [(g, w) for g, w in tokenizer_corpus.GENERATORS if g.__name__[1:] in names]
        assert tokenizer_corpus.GENERATORS, f"no generator among {names}"
    corpus = tokenizer_corpus.make_corpus(a.seed)
    texts = [b.decode("utf-8", "replace") for b in corpus]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    hf = Tokenizer.from_file(a.tokenizer)
    loop = batch = 1e9
    for _ in range(a.repeat):
        t = time.perf_counter()
        ids = [hf.encode(x).ids for x in texts]
        loop = min(loop, time.perf_counter() - t)
        t = time.perf_counter()
        hf.encode_batch(texts)
        batch = min(batch, time.perf_counter() - t)
    inp = "".join(base64.b64encode(b).decode() + "\n" for b in corpus).encode()
    tern_s = 1e9
    for _ in range(a.repeat):
        r = subprocess.run([a.tern, "tokenize", "-m", a.tokenizer, "--lines", "--threads", "1", "--time"],
                           input=inp, capture_output=True, check=True)
        tern_s = min(tern_s, float(re.search(r": ([0-9.]+) s,", r.stderr.decode()).group(1)))
    got = [json.loads(line) for line in r.stdout.decode().split("\n")[:-1]]
    same = sum(g == e for g, e in zip(got, ids))
    print(f"corpus: {len(texts)} texts, {mb:.2f} MB (seed {a.seed}); ids agree on {same}/{len(texts)}")
    print(f"HF tokenizers encode() loop, 1 thread : {loop:.3f} s  {mb / loop:6.2f} MB/s")
    print(f"HF tokenizers encode_batch, 1 thread  : {batch:.3f} s  {mb / batch:6.2f} MB/s")
    print(f"tern, 1 thread                        : {tern_s:.3f} s  {mb / tern_s:6.2f} MB/s  "
          f"({min(loop, batch) / tern_s:.1f}x the faster HF)")


if __name__ == "__main__":
    main()
