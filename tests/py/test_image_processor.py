"""src/vision against the reference: Pillow's decoders, ImageOps.exif_transpose and transformers'
Qwen2VLImageProcessorPil (the processor of Qwen3-VL / Qwen3.5 / Qwen3.6, its PIL path) with Qwen3.6-35B-A3B's
preprocessor_config.json. A corpus of images made afresh each run (random content and sizes, every PNG colour type
and bit depth, interlaced or not, with tRNS; JPEG gray/RGB/CMYK, baseline and progressive, each chroma subsampling;
WebP lossy and lossless, with alpha, animated; GIF with offsets, local palettes, transparency and interlace; APNG;
EXIF and XMP orientations 1-8) goes through tern_image_probe, and the decoded RGB, the resized RGB, grid_thw, the token
count and pixel_values must equal the reference's exactly (tolerance 0: every step is integer arithmetic or the
same float32 operations). Truncated files are refused without a crash, and the decoder survives libFuzzer."""
import io
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps
from transformers.image_transforms import convert_to_rgb
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Qwen/Qwen3.6-35B-A3B's preprocessor_config.json (the same for Qwen3-VL and Qwen3.5).
QWEN36_CONFIG = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                 "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5]}
# Smaller bounds so that shrinking (the filter stretched by the scale) is exercised on small files too.
SMALL_CONFIG = dict(QWEN36_CONFIG, size={"longest_edge": 40000, "shortest_edge": 4096})


@pytest.fixture(scope="module")
def probe():
    path = pathlib.Path(os.environ.get("TERN_BIN", ROOT / "build" / "tern")).parent / "tern_image_probe"
    if not path.exists():
        pytest.fail(f"{path} not found; build it (scripts/build)")
    return path


# ---- image writers the reference can read (Pillow's own, and minimal PNG/GIF writers for what Pillow cannot
# ---- write: every PNG bit depth, Adam7, tRNS keys; GIF frames off the screen's origin, local palettes, interlace)

def png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)


def png_encode(samples, color_type, depth, interlace=False, plte=None, trns=None, exif=None, texts=()):
    """samples: [h, w, channels] integers below 2**depth."""
    h, w, _ = samples.shape

    def rows(img):
        out = []
        for row in img:
            v = row.reshape(-1)
            if depth == 16:
                b = v.astype(">u2").tobytes()
            elif depth == 8:
                b = v.astype(np.uint8).tobytes()
            else:
                bits = np.unpackbits(v.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
                b = np.packbits(bits.reshape(-1)).tobytes()
            out.append(b"\0" + b)
        return b"".join(out)

    if interlace:
        raw = b""
        for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                               (0, 1, 1, 2)]:
            sub = samples[y0::dy, x0::dx]
            if sub.size:
                raw += rows(sub)
    else:
        raw = rows(samples)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0,
                                                                  1 if interlace else 0))
    if exif is not None:
        out += png_chunk(b"eXIf", exif)
    for key, text in texts:
        out += png_chunk(b"tEXt", key + b"\0" + text)
    if plte is not None:
        out += png_chunk(b"PLTE", bytes(np.asarray(plte, np.uint8).reshape(-1)))
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b"")


def gif_encode(screen, frame, left=0, top=0, global_palette=None, local_palette=None, transparent=None,
               interlace=False):
    """One frame of indices (uint8 [h, w]) as LZW with a clear code every 254 literals (9-bit codes only)."""
    def palette_bytes(p):
        n = len(p)
        assert n & (n - 1) == 0 and 2 <= n <= 256
        return bytes(np.asarray(p, np.uint8).reshape(-1)), n.bit_length() - 2

    out = b"GIF89a" + struct.pack("<HH", *screen)
    if global_palette is not None:
        data, bits = palette_bytes(global_palette)
        out += bytes([0x80 | 0x70 | bits, 0, 0]) + data
    else:
        out += bytes([0, 0, 0])
    if transparent is not None:
        out += b"!\xf9\x04" + bytes([1, 0, 0, transparent]) + b"\0"
    h, w = frame.shape
    flags = 0x40 if interlace else 0
    local = b""
    if local_palette is not None:
        local, bits = palette_bytes(local_palette)
        flags |= 0x80 | bits
    out += b"," + struct.pack("<HHHH", left, top, w, h) + bytes([flags]) + local
    order = list(range(h))
    if interlace:
        order = [y for start, step in [(0, 8), (4, 8), (2, 4), (1, 2)] for y in range(start, h, step)]
    pixels = frame[order].reshape(-1)
    codes = []
    for i, p in enumerate(pixels):
        if i % 254 == 0:
            codes.append(256)
        codes.append(int(p))
    codes.append(257)
    bits = 0
    nbits = 0
    data = bytearray()
    for c in codes:
        bits |= c << nbits
        nbits += 9
        while nbits >= 8:
            data.append(bits & 0xff)
            bits >>= 8
            nbits -= 8
    if nbits:
        data.append(bits & 0xff)
    out += b"\x08"
    for i in range(0, len(data), 255):
        chunk = data[i:i + 255]
        out += bytes([len(chunk)]) + chunk
    return out + b"\0;"


def exif_block(orientation, big_endian=False):
    e = Image.Exif()
    e[0x0112] = orientation
    data = e.tobytes()  # "Exif\0\0" + TIFF, little-endian
    if big_endian:  # the same one entry in Motorola order
        data = b"Exif\0\0MM\0*" + struct.pack(">IH", 8, 1) + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + \
            b"\0\0\0\0"
    return data


def xmp_packet(orientation):
    return (b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
            b'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description xmlns:tiff='
            b'"http://ns.adobe.com/tiff/1.0/" tiff:Orientation="%d"/></rdf:RDF></x:xmpmeta>' % orientation)


# ---- random content: smooth gradients, hard-edged blocks and noise (the resize's clamping gets exercised)

def picture(rng, h, w, channels=3):
    y = np.linspace(0, 1, h)[:, None, None]
    x = np.linspace(0, 1, w)[None, :, None]
    phase = rng.uniform(0, 6, (1, 1, channels))
    img = 127.5 + 127.5 * np.sin(3 * x + 5 * y * x + phase)
    for _ in range(rng.integers(1, 5)):
        y0, x0 = rng.integers(0, h), rng.integers(0, w)
        img[y0:y0 + rng.integers(1, h + 1), x0:x0 + rng.integers(1, w + 1)] = rng.choice([0, 255], channels)
    img += rng.normal(0, rng.choice([2, 20, 60]), img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def pil_bytes(im, fmt, **kw):
    b = io.BytesIO()
    try:
        im.save(b, fmt, **kw)
    except OSError:  # Pillow 13 cannot write some noisy progressive JPEGs at high quality ("Suspension not allowed")
        if not kw.get("progressive"):
            raise
        b = io.BytesIO()
        im.save(b, fmt, **dict(kw, quality=50))
    return b.getvalue()


SIZES = [(1, 1), (2, 3), (3, 1), (7, 5), (16, 16), (31, 33), (64, 48), (100, 61), (1, 150), (150, 1), (2, 390),
         (390, 2), (4, 800), (1, 201), (255, 257), (333, 517), (480, 640), (50, 1000), (1000, 12)]


def make_corpus(rng, out_dir, sizes=None):
    """The files' paths: every variant once or more, at random sizes."""
    sizes = sizes or SIZES
    files = []

    def add(name, data):
        path = out_dir / f"{len(files):03d}_{name}"
        path.write_bytes(data)
        files.append(path)

    def size():
        return sizes[rng.integers(len(sizes))]

    # PNG through the minimal writer: every colour type and bit depth, tRNS, Adam7.
    for depth in (1, 2, 4, 8, 16):
        for interlace in (False, True):
            h, w = size()
            g = rng.integers(0, 1 << depth, (h, w, 1))
            key = int(g[rng.integers(h), rng.integers(w), 0]) if rng.random() < 0.7 else None
            trns = None if key is None else struct.pack(">H", key)
            add(f"gray{depth}{'_i' if interlace else ''}.png", png_encode(g, 0, depth, interlace, trns=trns))
            if depth <= 4:  # a key that Pillow compares unscaled
                add(f"gray{depth}_key.png", png_encode(g, 0, depth, trns=struct.pack(">H", int(rng.integers(0, 256)))))
            if depth == 16:  # small samples too (Pillow clips 16-bit gray at 255)
                add("gray16_small.png", png_encode(rng.integers(0, 600, (h, w, 1)), 0, 16, trns=trns))
    for depth in (8, 16):
        for interlace in (False, True):
            h, w = size()
            rgb = rng.integers(0, 1 << depth, (h, w, 3)) if depth == 16 else picture(rng, h, w)
            key = struct.pack(">HHH", *rgb[rng.integers(h), rng.integers(w)])
            add(f"rgb{depth}{'_i' if interlace else ''}.png", png_encode(rgb, 2, depth, interlace,
                                                                         trns=key if rng.random() < 0.6 else None))
            if depth == 16:  # a key whose low bytes match the high bytes Pillow keeps (it compares those)
                hi = (rgb >> 8)[rng.integers(h), rng.integers(w)] + 256 * rng.integers(0, 256, 3)
                add("rgb16_lowkey.png", png_encode(rgb, 2, 16, trns=struct.pack(">HHH", *hi)))
            a = rng.integers(0, 1 << depth, (h, w, 1))
            a[rng.random((h, w)) < 0.3] = (1 << depth) - 1
            add(f"ga{depth}{'_i' if interlace else ''}.png", png_encode(np.concatenate([rgb[..., :1], a], 2), 4,
                                                                        depth, interlace))
            add(f"rgba{depth}{'_i' if interlace else ''}.png", png_encode(np.concatenate([rgb, a], 2), 6, depth,
                                                                          interlace))
    for depth in (1, 2, 4, 8):
        for interlace in (False, True):
            h, w = size()
            n = int(rng.integers(1, (1 << depth) + 1))  # palette entries; indices past them are black
            idx = rng.integers(0, 1 << depth, (h, w, 1))
            plte = rng.integers(0, 256, (n, 3))
            trns = bytes(rng.integers(0, 256, int(rng.integers(0, n + 1)), dtype=np.uint8)) if rng.random() < 0.7 \
                else None
            add(f"pal{depth}{'_i' if interlace else ''}.png", png_encode(idx, 3, depth, interlace, plte=plte,
                                                                         trns=trns))
    # PNG from Pillow's writer, and orientations in eXIf and in a Raw profile.
    for mode in ("RGB", "RGBA", "L", "LA", "P", "1", "I;16"):
        h, w = size()
        im = Image.fromarray(picture(rng, h, w))
        im = {"RGBA": lambda: Image.fromarray(np.concatenate([picture(rng, h, w), picture(rng, h, w, 1)], 2)),
              "LA": lambda: Image.frombytes("LA", (w, h), np.concatenate([picture(rng, h, w, 1),
                                                                          picture(rng, h, w, 1)], 2).tobytes()),
              "P": lambda: im.quantize(int(rng.integers(2, 256))),
              "I;16": lambda: Image.fromarray(rng.integers(0, 70000, (h, w)).clip(0, 65535).astype(np.uint16))}.get(
                  mode, lambda: im.convert(mode))()
        kw = {"transparency": int(rng.integers(0, 2))} if mode == "P" and rng.random() < 0.5 else {}
        add(f"pil_{mode.replace(';', '')}.png", pil_bytes(im, "PNG", **kw))
    h, w = size()
    frames = [Image.fromarray(picture(rng, h, w)) for _ in range(3)]
    for default_image in (False, True):  # APNG: Pillow and libpng both show the IDAT image
        add(f"apng{int(default_image)}.png", pil_bytes(frames[0], "PNG", save_all=True, append_images=frames[1:],
                                                       default_image=default_image))
    for o in range(1, 9):
        h, w = size()
        add(f"exif{o}.png", png_encode(picture(rng, h, w), 2, 8, exif=exif_block(o)[6:]))
    h, w = size()
    raw = exif_block(6)
    add("rawprofile6.png", png_encode(picture(rng, h, w), 2, 8, texts=[(
        b"Raw profile type exif", b"\nexif\n%8d\n%s\n" % (len(raw), raw.hex().encode()))]))
    add("xmp8.png", png_encode(picture(rng, h, w), 2, 8, texts=[(b"XML:com.adobe.xmp", xmp_packet(8))]))

    # JPEG: gray, RGB at each subsampling and a few qualities, progressive, CMYK; every orientation.
    for sub in (0, 1, 2):
        for progressive in (False, True):
            h, w = size()
            add(f"rgb_s{sub}{'_p' if progressive else ''}.jpg",
                pil_bytes(Image.fromarray(picture(rng, h, w)), "JPEG", quality=int(rng.choice([30, 75, 95, 100])),
                          subsampling=sub, progressive=progressive))
    for mode in ("L", "CMYK"):
        h, w = size()
        add(f"{mode}.jpg", pil_bytes(Image.fromarray(picture(rng, h, w)).convert(mode), "JPEG", quality=90))
    for o in range(1, 9):
        h, w = size()
        add(f"exif{o}.jpg", pil_bytes(Image.fromarray(picture(rng, h, w)), "JPEG", exif=exif_block(o, o % 2 == 0)))
    h, w = size()
    add("xmp6.jpg", pil_bytes(Image.fromarray(picture(rng, h, w)), "JPEG", xmp=xmp_packet(6)))
    add("exif3_xmp6.jpg", pil_bytes(Image.fromarray(picture(rng, h, w)), "JPEG", exif=exif_block(3),
                                    xmp=xmp_packet(6)))

    # WebP: lossy and lossless, with and without alpha, animated, with EXIF orientation.
    for lossless in (False, True):
        for alpha in (False, True):
            h, w = size()
            arr = np.concatenate([picture(rng, h, w), picture(rng, h, w, 1)], 2) if alpha else picture(rng, h, w)
            add(f"{'ll' if lossless else 'lossy'}{'_a' if alpha else ''}.webp",
                pil_bytes(Image.fromarray(arr), "WEBP", lossless=lossless, quality=int(rng.integers(20, 101)),
                          exact=True))
    h, w = size()
    frames = [Image.fromarray(np.concatenate([picture(rng, h, w), picture(rng, h, w, 1)], 2)) for _ in range(3)]
    add("anim.webp", pil_bytes(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50,
                               lossless=bool(rng.integers(2))))
    for o in (3, 6, 8):
        h, w = size()
        add(f"exif{o}.webp", pil_bytes(Image.fromarray(picture(rng, h, w)), "WEBP", exif=exif_block(o)))

    # GIF: Pillow's writer (quantised, transparency, animation) and the minimal writer (offsets, palettes).
    h, w = size()
    im = Image.fromarray(picture(rng, h, w)).quantize(int(rng.integers(2, 256)))
    add("pil.gif", pil_bytes(im, "GIF"))
    add("pil_t.gif", pil_bytes(im, "GIF", transparency=int(rng.integers(0, len(im.getpalette()) // 3))))
    add("pil_anim.gif", pil_bytes(im, "GIF", save_all=True, duration=40,
                                  append_images=[Image.fromarray(picture(rng, h, w)).quantize(16)]))
    add("pil_gray.gif", pil_bytes(Image.fromarray(picture(rng, h, w, 1)[..., 0]), "GIF"))
    for case in range(6):
        h, w = size()
        sw, sh = w + int(rng.integers(0, 9)), h + int(rng.integers(0, 9))
        left, top = int(rng.integers(0, sw - w + 1)), int(rng.integers(0, sh - h + 1))
        if case == 5:  # a frame reaching past the logical screen (Pillow grows the canvas)
            sw, sh = max(1, w - 3), max(1, h - 2)
        n = 1 << int(rng.integers(1, 9))
        pal = rng.integers(0, 256, (n, 3))
        frame = rng.integers(0, min(256, n + 4), (h, w)).astype(np.uint8)  # some indices past the palette
        gray_ramp = np.repeat(np.arange(n)[:, None], 3, 1)
        add(f"gif{case}.gif", gif_encode((sw, sh), frame, left, top,
                                         global_palette=gray_ramp if case == 4 else (None if case == 3 else pal),
                                         local_palette=pal if case in (1, 2) else None,
                                         transparent=int(rng.integers(0, 256)) if case % 2 == 0 else None,
                                         interlace=case in (2, 5)))
    return files


def reference(path, config):
    """Pillow and transformers: (decoded RGB, resized RGB, grid_thw, pixel_values) or the error's text."""
    im = ImageOps.exif_transpose(Image.open(path))
    decoded = convert_to_rgb(im, return_numpy=True)
    proc = Qwen2VLImageProcessorPil(**config)
    factor = config["patch_size"] * config["merge_size"]
    try:
        h, w = smart_resize(decoded.shape[0], decoded.shape[1], factor, config["size"]["shortest_edge"],
                            config["size"]["longest_edge"])
        out = proc(images=[im], return_tensors="np")
    except ValueError as e:
        return decoded, None, None, str(e)
    resized = np.array(Image.fromarray(decoded).resize((w, h), Image.Resampling.BICUBIC))
    return decoded, resized, out["image_grid_thw"][0].tolist(), out["pixel_values"]


def run_probe(probe, out_dir, files, config=QWEN36_CONFIG, *options):
    args = [str(probe), "--min-pixels", str(config["size"]["shortest_edge"]), "--max-pixels",
            str(config["size"]["longest_edge"]), *map(str, options), str(out_dir), *map(str, files)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == len(files)
    return lines


@pytest.mark.parametrize("config", [QWEN36_CONFIG, SMALL_CONFIG], ids=["qwen36", "small"])
def test_processor_matches_reference(probe, tmp_path, seed, config):
    rng = np.random.default_rng(seed)
    files = make_corpus(rng, tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    lines = run_probe(probe, out_dir, files, config)
    failures, counts, worst = [], {}, 0.0
    for i, (path, got) in enumerate(zip(files, lines)):
        decoded, resized, grid, pixels = reference(path, config)
        name = path.name
        counts[name.rsplit(".", 1)[1]] = counts.get(name.rsplit(".", 1)[1], 0) + 1
        if grid is None:  # the reference refused it (aspect ratio over 200)
            if got.get("kind") != "aspect_ratio":
                failures.append(f"{name}: reference refused ({pixels}), tern gave {got}")
            continue
        if "error" in got:
            failures.append(f"{name}: tern refused: {got['error']}")
            continue
        mine = np.load(out_dir / f"{i}.decoded.npy")
        if mine.shape != decoded.shape or (mine != decoded).any():
            bad = "shape" if mine.shape != decoded.shape else int((mine != decoded).any(2).sum())
            failures.append(f"{name}: decoded {mine.shape} vs {decoded.shape}, pixels that differ: {bad}")
            continue
        mine = np.load(out_dir / f"{i}.resized.npy")
        if mine.shape != resized.shape or (mine != resized).any():
            failures.append(f"{name}: resized {mine.shape} vs {resized.shape}, max diff "
                            f"{np.abs(mine.astype(int) - resized).max() if mine.shape == resized.shape else '-'}")
            continue
        if got["grid_thw"] != grid or got["tokens"] != grid[1] * grid[2] // 4 or got["token_count"] != got["tokens"]:
            failures.append(f"{name}: grid {got['grid_thw']} tokens {got['tokens']} vs grid {grid}")
            continue
        mine = np.load(out_dir / f"{i}.pixels.npy")
        diff = float(np.abs(mine - pixels).max()) if mine.shape == pixels.shape else None
        worst = max(worst, diff or 0.0)
        if diff is None or diff > 0:
            failures.append(f"{name}: pixel_values {mine.shape} vs {pixels.shape}, max abs diff {diff}")
    print(f"{len(files)} images {counts}, {len(failures)} differ, max |pixel_values - reference| {worst}")
    assert not failures, "\n".join(failures)


def test_resize_matches_pillow(probe, tmp_path, seed):
    """image_resize_bicubic against Pillow's Image.resize(BICUBIC) at random size pairs: each axis up, down or the
    same, small and large factors (which pass goes first, where each window starts and ends, clamping)."""
    rng = np.random.default_rng(seed)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    failures = []
    for case in range(60):
        w, h = (int(v) for v in rng.integers(1, 300, 2))
        ow, oh = (int(max(1, round(v * rng.choice([0.05, 0.3, 0.9, 1.0, 1.02, 1.7, 4.0]) + rng.integers(-3, 4))))
                  for v in (w, h))
        src = picture(rng, h, w)
        path = tmp_path / f"{case}.png"
        path.write_bytes(pil_bytes(Image.fromarray(src), "PNG"))
        run_probe(probe, out_dir, [path], QWEN36_CONFIG, "--resize", ow, oh)
        mine = np.load(out_dir / "0.resized.npy")
        ref = np.array(Image.fromarray(src).resize((ow, oh), Image.Resampling.BICUBIC))
        if mine.shape != ref.shape:
            failures.append(f"{w}x{h} -> {ow}x{oh}: shape {mine.shape} vs {ref.shape}")
        elif (mine != ref).any():
            failures.append(f"{w}x{h} -> {ow}x{oh}: {int((mine != ref).any(2).sum())} pixels differ")
    assert not failures, "\n".join(failures)


def test_truncated_and_damaged_files_are_refused(probe, tmp_path, seed):
    """Every prefix-cut or byte-flipped file gives a result or an error line, never a crash; a cut inside the
    pixel data is an error that names the image."""
    rng = np.random.default_rng(seed)
    files = make_corpus(rng, tmp_path)
    damaged = []
    for path in files:
        data = path.read_bytes()
        cut = tmp_path / f"{path.name}.cut"
        cut.write_bytes(data[:int(rng.integers(1, len(data)))])
        flip = bytearray(data)
        for _ in range(int(rng.integers(1, 8))):
            flip[int(rng.integers(len(flip)))] ^= 1 << int(rng.integers(8))
        flipped = tmp_path / f"{path.name}.flip"
        flipped.write_bytes(bytes(flip))
        damaged += [cut, flipped]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    lines = run_probe(probe, out_dir, damaged, SMALL_CONFIG)
    for i, (path, got) in enumerate(zip(damaged, lines)):
        if "error" in got:
            assert got["error"].startswith(f"image {i}: "), got
            assert got["kind"] in ("empty", "unsupported_format", "corrupt", "truncated", "too_large",
                                   "aspect_ratio"), got
    # Half the data of a PNG or a baseline JPEG cannot make an image.
    for path, got in zip(damaged, lines):
        if path.suffix == ".cut" and path.stat().st_size < 20:
            assert "error" in got, (path.name, got)


def test_image_decode_fuzz(tmp_path, seed):
    """libFuzzer over image_decode and the processor (ASan, UBSan), seeded with small images of every format."""
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    assert clang, "clang++ is needed for the libFuzzer target (scripts/install-deps installs clang)"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libpng", "libjpeg", "libwebp", "libwebpdemux"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = tmp_path / "image_decode_fuzz"
    srcs = [ROOT / "tests/fuzz/image_decode_fuzz.cpp", *sorted((ROOT / "src/vision").glob("*.cpp")),
            ROOT / "src/core/check.cpp", ROOT / "src/core/text_file.cpp"]
    r = subprocess.run([clang, "-std=c++20", "-O1", "-g", "-ffp-contract=off", "-fsanitize=fuzzer,address,undefined",
                        "-I", ROOT / "src", *srcs, "-o", exe, *flags, "-lgif"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(seed)
    for path in make_corpus(rng, tmp_path, sizes=[(1, 1), (2, 3), (7, 5), (16, 16), (3, 20)]):
        shutil.copy(path, corpus / path.name)
    secs = int(os.environ.get("TERN_FUZZ_SECONDS", "45"))
    fuzz_seed = random.SystemRandom().randrange(1 << 31)
    print(f"fuzz seed={fuzz_seed}")
    r = subprocess.run([exe, f"-max_total_time={secs}", f"-seed={fuzz_seed}", "-max_len=4096", "-timeout=10",
                        "-rss_limit_mb=2048", str(corpus)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=secs + 120)
    assert r.returncode == 0, r.stderr[-4000:]
