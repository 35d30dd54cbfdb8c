"""A random golden corpus for tokenizer tests and benchmarks: English, code, CJK, Arabic, Hebrew, Hindi and Thai
with combining marks, emoji and ZWJ sequences, whitespace runs, digits, added tokens inline, very long words,
decomposed (NFD) text, and invalid UTF-8. Every text is bytes; make_corpus(seed, n) is deterministic in seed."""
import random

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up other "
         "about out many then them these so some her would make like him into time has look two more write go see "
         "number no way could people my than first water been call who oil its now find long down day did get come "
         "made may part tokenizer inference engine Qwen GPU CUDA kernel über naïve café résumé São Paulo Zürich "
         "straße ÆØÅ Ελληνικά русский язык Україна").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "’s", "'x",
                "'", "''", "'ſ"]
PUNCT = list(".,;:!?-—–()[]{}<>\"'`~@#$%^&*_+=|\\/…«»“”‘’¿¡·•§¶©®™°±×÷")
CODE = [
    "def f(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "const x = await fetch(`/api/${id}`);\n", "#include <stdio.h>\nint main(void) { return 0; }\n",
    "SELECT * FROM users WHERE id = 42;\n", "    if x == None:\n        raise ValueError('bad')\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n", "<div class=\"a\">&nbsp;</div>\n",
    "x = [i**2 for i in range(10) if i % 2]\n", "\t\t\treturn;\r\n", "// TODO: fix\n/* block */\n",
    "{\"key\": [1, 2.5, -3e10, null, true]}\n", "$ ls -la | grep '^d' > out.txt 2>&1\n", "a != b && c <= d || !e\n",
]
SPECIALS_QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>",
                 "<|vision_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|repo_name|>",
                 "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>", "<|audio_start|>",
                 "<tts_pad>", "<|audio_pad|>", "<|im_", "<think", "<|", "|>", "<<|im_end|>>", "<think></think>"]
EMOJI = ["😀", "👍", "👍🏽", "❤️", "🇺🇸", "🇯🇵", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏾‍💻", "1️⃣", "#️⃣", "🧑‍🚀", "☺", "☺️",
         "🫠", "🐈‍⬛", "✈️", "👁️‍🗨️", "\u200d", "\ufe0f", "\U0001F3FB"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\t\n", "\u00a0", "\u3000", "\u2028", "\u2029",
      "\u0085", "\x0b", "\x0c", "\u2003", "\u202f", "\u200b", "\u180e", "\ufeff"]
DIGITS = ["0123456789", "3.14159", "1,000,000", "٣٤٥", "०१२", "１２３", "²³", "½", "Ⅻ", "12345678901234567890",
          "-42", "1e-9", "0x1F", "๓๔"]


def _rand_range(r, lo, hi, n):
    return "".join(chr(r.randint(lo, hi)) for _ in range(n))


def _english(r):
    out = []
    for _ in range(r.randint(1, 40)):
        w = r.choice(WORDS)
        if r.random() < 0.1: w = w.capitalize()
        if r.random() < 0.05: w = w.upper()
        out.append(w)
        if r.random() < 0.08: out[-1] += r.choice(CONTRACTIONS)
        if r.random() < 0.12: out[-1] += r.choice(PUNCT)
    return " ".join(out)


def _cjk(r):
    parts = []
    for _ in range(r.randint(1, 6)):
        k = r.random()
        if k < 0.4: parts.append(_rand_range(r, 0x4E00, 0x9FA5, r.randint(1, 30)))
        elif k < 0.55: parts.append(_rand_range(r, 0x3041, 0x3096, r.randint(1, 12)))
        elif k < 0.7: parts.append(_rand_range(r, 0x30A1, 0x30FA, r.randint(1, 12)))
        elif k < 0.85: parts.append(_rand_range(r, 0xAC00, 0xD7A3, r.randint(1, 12)))
        else: parts.append(r.choice("，。！？、：；「」『』（）《》〈〉…—ー"))
        if r.random() < 0.3: parts.append(r.choice([" ", "\n", "", "1", "abc", "。"]))
    return "".join(parts)


def _marks(r):
    kind = r.randrange(6)
    if kind == 0:  # Arabic with harakat
        base = lambda: _rand_range(r, 0x0621, 0x064A, 1) + (_rand_range(r, 0x064B, 0x0652, 1) if r.random() < 0.5 else "")
    elif kind == 1:  # Hebrew with niqqud
        base = lambda: _rand_range(r, 0x05D0, 0x05EA, 1) + (_rand_range(r, 0x05B0, 0x05BC, 1) if r.random() < 0.5 else "")
    elif kind == 2:  # Devanagari with matras, virama and nukta
        base = lambda: _rand_range(r, 0x0915, 0x0939, 1) + r.choice(["", "\u093e", "\u093f", "\u0940", "\u0941",
                                                                     "\u094d", "\u093c", "\u0902", "\u0947\u0902"])
    elif kind == 3:  # Thai with vowel and tone marks
        base = lambda: _rand_range(r, 0x0E01, 0x0E2E, 1) + r.choice(["", "\u0e31", "\u0e34", "\u0e35", "\u0e38",
                                                                     "\u0e48", "\u0e49", "\u0e47", "\u0e4c"])
    elif kind == 4:  # Latin with combining marks (NFC composes some)
        base = lambda: r.choice("aeiouAEIOUnNcCszZyw") + r.choice(["", "\u0301", "\u0300", "\u0308", "\u0303",
                                                                    "\u0327", "\u030c", "\u0301\u0308", "\u0323\u0302"])
    else:  # Hangul jamo (NFC composes into syllables)
        base = lambda: chr(r.randint(0x1100, 0x1112)) + chr(r.randint(0x1161, 0x1175)) + (
            chr(r.randint(0x11A8, 0x11C2)) if r.random() < 0.5 else "")
    words = ["".join(base() for _ in range(r.randint(1, 10))) for _ in range(r.randint(1, 12))]
    sep = r.choice([" ", " ", "\n", "، ", ". ", "।", " 12 "])
    text = sep.join(words)
    if r.random() < 0.2:  # a mark at the start of a word, or after a space or digit
        text = r.choice(["\u0301", " \u0301", "1\u0301", "\u064b", "\u0e48"]) + text
    return text


def _emoji(r):
    return "".join(r.choice(EMOJI + [" ", "a", "ok", "\n", "!", "1"]) for _ in range(r.randint(1, 20)))


def _whitespace(r):
    return "".join(r.choice(WS + ["a", "word", "1", ".", "x\n", "'s"]) for _ in range(r.randint(1, 30)))


def _digits(r):
    return "".join(r.choice(DIGITS + [" ", "a", ".", ",", " and "]) for _ in range(r.randint(1, 12)))


def _specials(r):
    parts = []
    for _ in range(r.randint(1, 10)):
        parts.append(r.choice(SPECIALS_QWEN) if r.random() < 0.4 else r.choice([_english, _cjk, _whitespace])(r)[:40])
    return "".join(parts)


def _long(r):
    kind = r.randrange(7)
    n = r.choice([200, 1000, 3000, 10000])
    if kind == 0: return "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if kind == 1: return r.choice("a!- \n\t0z") * n
    if kind == 2: return "".join(r.choice("0123456789") for _ in range(n))
    if kind == 3: return _rand_range(r, 0x4E00, 0x9FA5, n // 3)
    if kind == 4: return "ab" * (n // 2)
    if kind == 5: return "".join(r.choice(PUNCT) for _ in range(n))
    return "x" + "\u0301" * (n // 10)


def _random_cp(r):
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2100, 0x22FF), (0x3000, 0x30FF),
              (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x0, 0x1F)]
    out = []
    for _ in range(r.randint(1, 60)):
        lo, hi = r.choice(ranges)
        out.append(chr(r.randint(lo, hi)))
    return "".join(out)


def _code(r):
    return "".join(r.choice(CODE) for _ in range(r.randint(1, 5)))


def _invalid(r):
    """bytes that are not UTF-8"""
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff",
           b"\xfe", b"\xf0\x9f\x98", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xc2\x41", b"\xe1\x80\x41"]
    parts = []
    for _ in range(r.randint(1, 8)):
        if r.random() < 0.5: parts.append(r.choice(bad))
        elif r.random() < 0.5: parts.append(bytes(r.randrange(256) for _ in range(r.randint(1, 6))))
        else: parts.append(r.choice([_english, _cjk, _emoji, _marks])(r)[:30].encode())
    return b"".join(parts)


GENERATORS = [(_english, 20), (_code, 8), (_cjk, 10), (_marks, 12), (_emoji, 6), (_whitespace, 8), (_digits, 5),
              (_specials, 8), (_long, 2), (_random_cp, 8), (_invalid, 5)]


def make_corpus(seed: int, n: int = 12000) -> list[bytes]:
    r = random.Random(seed)
    gens = [g for g, w in GENERATORS for _ in range(w)]
    out = []
    for i in range(n):
        g = gens[i % len(gens)] if i < len(gens) else r.choice(gens)
        t = g(r)
        if isinstance(t, str):
            if r.random() < 0.1:  # glue two kinds together
                t += r.choice([_english, _cjk, _marks, _emoji])(r)
            t = t.encode("utf-8", "surrogatepass")
        out.append(t)
    return out
