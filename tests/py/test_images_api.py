"""Images through every door of `tern serve`, on the demo model and its small vision encoder (random weights): OpenAI
chat (image_url parts with data: URLs), the Responses API (input_image), Anthropic (image blocks with a base64 source,
in a message and in a tool result), Ollama (/api/chat and /api/generate images), /tokenize's chat form and
Anthropic's count_tokens. Each image takes as many prompt tokens as transformers' smart_resize makes it
(grid_h · grid_w / 4, beside <|vision_start|> and <|vision_end|>); the images reach the model (two images give other
log-probabilities, the same image the same ones); a conversation with an image resumes from the prefix cache past
the image, while another image of the same size is not mistaken for it. Bad input is a 400 that names the image and
says why (not an image, truncated, an unsupported format, too many pixels, an aspect ratio over 200:1, bad base64, a
remote URL without --allow-image-urls, one that cannot be fetched with it), a model folder without a vision
encoder says it has none, and --image-max-pixels lowers the largest image's size (and so its tokens).
`tern run`'s /image attaches an image to the next message."""
import base64
import io
import json
import pathlib
import struct
import subprocess
import sys
import zlib

import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from test_server_helpers import Server, demo_server_fixture, free_port, post_json, request

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = "tern-demo-random-weights"
IMAGE_PAD = 151655  # the demo tokenizer's <|image_pad|>

server = demo_server_fixture("--ctx-size", "4096", "--debug-allow-forced-output")


def image_bytes(size, color, fmt="PNG"):
    buf = io.BytesIO()
    mode = "P" if fmt == "GIF" else "RGB"
    Image.new("RGB", size, color).convert(mode).save(buf, fmt)
    return buf.getvalue()


def data_url(data, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(data).decode()


def b64(data):
    return base64.b64encode(data).decode()


def image_tokens(width, height):
    """<|image_pad|> tokens of an image: the demo's processor is Qwen3.6's defaults (patch 16, merge 2)."""
    h, w = smart_resize(height, width, 32, 65536, 16777216)
    return (h // 16) * (w // 16) // 4


def chat(port, content, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}
    return post_json(port, "/v1/chat/completions", body, timeout=300)


def text_prompt_tokens(port, text):
    status, _, r = chat(port, text)
    assert status == 200, r
    return r["usage"]["prompt_tokens"]


RED, BLUE = image_bytes((64, 48), (220, 20, 20)), image_bytes((64, 48), (20, 20, 220))


def test_openai_chat_counts_each_images_tokens(server):
    base = text_prompt_tokens(server.port, "What is in these pictures?")
    wide = image_bytes((500, 120), (0, 200, 0))
    status, _, r = chat(server.port, [{"type": "text", "text": "What is in these pictures?"},
                                      {"type": "image_url", "image_url": {"url": data_url(RED)}},
                                      {"type": "image_url", "image_url": {"url": data_url(wide), "detail": "high"}}])
    assert status == 200, r
    want = base + 2 * 2 + image_tokens(64, 48) + image_tokens(500, 120)
    assert r["usage"]["prompt_tokens"] == want, (r["usage"], want)


def first_logprob(port, image, text="Describe the picture."):
    status, _, r = chat(port, [{"type": "image_url", "image_url": {"url": data_url(image)}},
                               {"type": "text", "text": text}],
                        temperature=0, logprobs=True, top_logprobs=1, max_tokens=1)
    assert status == 200, r
    return r["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]


def test_the_image_reaches_the_model(server):
    red, blue, red_again = (first_logprob(server.port, im) for im in (RED, BLUE, RED))
    assert red != blue  # the same tokens, other pixels: another distribution
    assert red["token"] == red_again["token"] and abs(red["logprob"] - red_again["logprob"]) < 1e-4


def test_streamed_answer_with_an_image(server):
    body = {"model": MODEL, "stream": True, "max_tokens": 3, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(BLUE)}}]}]}
    status, _, data = request("POST", server.port, "/v1/chat/completions", body, timeout=300)
    assert status == 200 and data.rstrip().endswith(b"data: [DONE]"), data[-300:]


def test_responses_input_image(server):
    base = {"model": MODEL, "max_output_tokens": 2}
    status, _, text = post_json(server.port, "/v1/responses", {**base, "input": "Look."}, timeout=300)
    assert status == 200, text
    content = [{"type": "input_text", "text": "Look."}, {"type": "input_image", "image_url": data_url(RED)}]
    status, _, r = post_json(server.port, "/v1/responses", {**base, "input": [{"role": "user", "content": content}]},
                             timeout=300)
    assert status == 200, r
    assert r["usage"]["input_tokens"] == text["usage"]["input_tokens"] + 2 + image_tokens(64, 48), r["usage"]


def anthropic(port, path, content, **extra):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}], **extra}
    return post_json(port, path, body, headers={"anthropic-version": "2023-06-01"}, timeout=300)


def test_anthropic_image_blocks_and_count_tokens(server):
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": b64(image_bytes((300, 200), (9, 99, 199), "JPEG"))}}
    status, _, text = anthropic(server.port, "/v1/messages/count_tokens", "What is it?")
    assert status == 200, text
    status, _, counted = anthropic(server.port, "/v1/messages/count_tokens",
                                   [block, {"type": "text", "text": "What is it?"}])
    assert status == 200, counted
    assert counted["input_tokens"] == text["input_tokens"] + 2 + image_tokens(300, 200), counted
    status, _, m = anthropic(server.port, "/v1/messages", [block, {"type": "text", "text": "What is it?"}])
    assert status == 200, m
    usage = m["usage"]
    assert usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0) == counted["input_tokens"], usage


def test_anthropic_image_in_a_tool_result(server):
    messages = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}},
            {"type": "text", "text": "Here it is."}]}]}]
    body = {"model": MODEL, "max_tokens": 2, "messages": messages,
            "tools": [{"name": "screenshot", "input_schema": {"type": "object"}}]}
    status, _, r = post_json(server.port, "/v1/messages/count_tokens", body, timeout=300)
    assert status == 200, r
    without = json.loads(json.dumps(body))
    without["messages"][2]["content"][0]["content"] = [{"type": "text", "text": "Here it is."}]
    status, _, w = post_json(server.port, "/v1/messages/count_tokens", without, timeout=300)
    assert r["input_tokens"] == w["input_tokens"] + 2 + image_tokens(64, 48), (r, w)
    status, _, m = post_json(server.port, "/v1/messages", body, timeout=300)
    assert status == 200 and m["type"] == "message", m


def test_ollama_images(server):
    base = {"model": MODEL, "stream": False, "options": {"num_predict": 2}}
    status, _, text = post_json(server.port, "/api/chat", {**base, "messages": [{"role": "user", "content": "Hi"}]},
                                timeout=300)
    assert status == 200, text
    msg = {"role": "user", "content": "Hi", "images": [b64(RED), b64(image_bytes((40, 40), (1, 2, 3), "WEBP"))]}
    status, _, r = post_json(server.port, "/api/chat", {**base, "messages": [msg]}, timeout=300)
    assert status == 200, r
    want = text["prompt_eval_count"] + 2 * 2 + image_tokens(64, 48) + image_tokens(40, 40)
    assert r["prompt_eval_count"] == want, (r, want)
    status, _, g = post_json(server.port, "/api/generate", {**base, "prompt": "Hi", "images": [b64(RED)]}, timeout=300)
    assert status == 200 and g["prompt_eval_count"] == text["prompt_eval_count"] + 2 + image_tokens(64, 48), g
    status, _, g = post_json(server.port, "/api/generate", {**base, "prompt": "Hi", "raw": True, "images": [b64(RED)]})
    assert status == 400 and "raw" in g["error"], g
    status, _, show = post_json(server.port, "/api/show", {"model": MODEL})
    assert "vision" in show["capabilities"], show["capabilities"]


def test_tokenize_counts_image_tokens(server):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(RED)}},
                                             {"type": "text", "text": "Hi"}]}]
    status, _, r = post_json(server.port, "/tokenize", {"messages": messages}, timeout=300)
    assert status == 200, r
    assert r["count"] == len(r["tokens"]) and r["tokens"].count(IMAGE_PAD) == image_tokens(64, 48), r["count"]
    status, _, c = chat(server.port, messages[0]["content"])
    assert c["usage"]["prompt_tokens"] == r["count"]
    status, _, plain = post_json(server.port, "/tokenize", {"content": "Hi"})
    assert status == 200 and plain["tokens"]  # the text form as before
    status, _, props = request("GET", server.port, "/props")
    assert json.loads(props)["modalities"]["vision"] is True


def test_every_format_is_read(server):
    for fmt, media in (("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")):
        status, _, r = chat(server.port, [{"type": "image_url", "image_url": {"url": data_url(
            image_bytes((33, 77), (10, 200, 30), fmt), media)}}])
        assert status == 200, (fmt, r)


def png_header_only(width, height):
    """A PNG whose header declares width x height, with no pixel data: a decompression bomb's header."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


@pytest.mark.parametrize("url,words", [
    (data_url(b"hello, world"), "not a PNG, JPEG, WebP or GIF image"),
    (data_url(RED[:60]), "PNG"),
    (data_url(b"BM" + b"\0" * 60, "image/bmp"), "BMP"),
    (data_url(png_header_only(30000, 30000)), "more than 16384 pixels on a side"),
    (data_url(png_header_only(12000, 12000)), "pixels, more than"),
    (data_url(image_bytes((1000, 4), (5, 5, 5))), "200"),
    ("data:image/png;base64,iVBO%%%", "not valid base64"),
    ("data:text/plain;base64,aGk=", "not an image"),
    ("data:image/png,rawbytes", "not base64"),
    ("file:///etc/passwd", "data: URL"),
], ids=["not-an-image", "truncated", "bmp", "bomb-side", "bomb-pixels", "aspect", "base64", "media", "no-base64",
        "file-url"])
def test_bad_images_are_400s_naming_the_image(server, url, words):
    content = [{"type": "text", "text": "Two pictures:"},
               {"type": "image_url", "image_url": {"url": data_url(RED)}},
               {"type": "image_url", "image_url": {"url": url}}]
    status, _, r = chat(server.port, content)
    assert status == 400, r
    err = r["error"]
    assert err["param"].startswith("messages[0].content[2]"), err
    assert words in err["message"], err
    assert server.alive()


def test_an_image_too_large_for_the_context(server):
    """4000 x 3000 pixels take about 11,700 tokens: more than the server's 4,096, refused with both numbers."""
    status, _, r = chat(server.port, [{"type": "image_url", "image_url": {"url": data_url(
        image_bytes((4000, 3000), (40, 40, 40)))}}])
    assert status == 400 and r["error"]["code"] == "context_length_exceeded", r
    assert "4096" in r["error"]["message"], r


def test_images_only_where_they_belong(server):
    part = {"type": "image_url", "image_url": {"url": data_url(RED)}}
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "system", "content": [part]},
                                                          {"role": "user", "content": "Hi"}]}
    status, _, r = post_json(server.port, "/v1/chat/completions", body)
    assert status == 400 and r["error"]["param"] == "messages[0].content[0]", r


def test_remote_urls_are_not_fetched(server, tern_bin):
    status, _, r = chat(server.port, [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    assert status == 400 and "does not fetch" in r["error"]["message"] and "--allow-image-urls" in r["error"]["message"]
    # With --allow-image-urls the server fetches them (test_image_urls.py); here one where nothing answers.
    allowing = Server(tern_bin, "--ctx-size", "1024", "--allow-image-urls")
    try:
        url = f"http://127.0.0.1:{free_port()}/a.png"
        status, _, r = chat(allowing.port, [{"type": "image_url", "image_url": {"url": url}}])
        assert status == 400 and "could not be fetched" in r["error"]["message"], r
        assert r["error"]["param"] == "messages[0].content[0].image_url.url"
    finally:
        allowing.stop()


def test_image_max_pixels_lowers_what_an_image_takes(tern_bin):
    capped = Server(tern_bin, "--ctx-size", "4096", "--image-max-pixels", "65536")
    try:
        big = image_bytes((1024, 512), (0, 0, 200))  # 524,288 pixels: resized down to at most 65,536
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(big)}}]}]
        status, _, r = post_json(capped.port, "/tokenize", {"messages": messages}, timeout=300)
        assert status == 200, r
        h, w = smart_resize(512, 1024, 32, 65536, 65536)
        want = (h // 16) * (w // 16) // 4
        assert want < image_tokens(1024, 512)
        assert r["tokens"].count(IMAGE_PAD) == want, (r["tokens"].count(IMAGE_PAD), want)
    finally:
        capped.stop()
    bad = subprocess.run([tern_bin, "serve", "--image-max-pixels", "100"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--image-max-pixels" in bad.stderr, bad.stderr


def cached(usage):
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_a_conversation_with_an_image_resumes(server):
    """Turn 2 reuses turn 1's prompt past its image; the same conversation with another image of the same size
    reuses nothing from the image's first token on."""
    def body(image, *more):
        messages = [{"role": "user", "content": [{"type": "text", "text": "Remember this picture."},
                                                 {"type": "image_url", "image_url": {"url": data_url(image)}}]},
                    *more]
        return {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False}}

    def turn(image, *more):
        status, _, r = post_json(server.port, "/v1/chat/completions", body(image, *more), timeout=300)
        assert status == 200, r
        return r["usage"]
    green, pink = image_bytes((64, 48), (10, 250, 10)), image_bytes((64, 48), (250, 10, 250))
    status, _, t = post_json(server.port, "/tokenize", body(green), timeout=300)
    assert status == 200, t
    first_pad = t["tokens"].index(IMAGE_PAD)
    image_end = first_pad + t["tokens"].count(IMAGE_PAD)
    turn(green)
    follow = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "What colour was it?"}]
    second = turn(green, *follow)
    assert cached(second) > image_end, (second, image_end)
    other = turn(pink, *follow)
    assert cached(other) <= first_pad, (other, first_pad)


def test_a_model_without_a_vision_encoder_says_so(tern_bin, tmp_path):
    model = tmp_path / "text-only"
    r = subprocess.run([sys.executable, str(ROOT / "tests/oracles/make_model.py"), "--out", str(model), "--seed", "3",
                        "--layers", "4"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    s = Server(tern_bin, "-m", str(model), "--ctx-size", "512", demo=False)
    try:
        status, _, r = chat(s.port, [{"type": "image_url", "image_url": {"url": data_url(RED)}}])
        assert status == 400 and "no vision encoder" in r["error"]["message"], r
        status, _, r = post_json(s.port, "/api/chat", {"model": MODEL, "stream": False, "messages": [
            {"role": "user", "content": "x", "images": [b64(RED)]}]})
        assert status == 400 and "no vision encoder" in r["error"], r
        status, _, props = request("GET", s.port, "/props")
        assert json.loads(props)["modalities"]["vision"] is False
        status, _, r = chat(s.port, "Text still works.")
        assert status == 200, r
    finally:
        s.stop()


def test_tern_run_attaches_an_image(tern_bin, tmp_path):
    picture, broken = tmp_path / "picture.png", tmp_path / "broken.png"
    picture.write_bytes(RED)
    broken.write_bytes(RED[:40])
    lines = [f"/image {broken}", f"/image {picture}", "/history", "What is it?", "/history", "And now?"]
    r = subprocess.run([tern_bin, "run", "--no-history", "-n", "2", "--no-think"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert f"cannot attach the image: {broken}" in out, out
    assert f"(image attached to your next message: {picture}, 64x48, {image_tokens(64, 48)} tokens)" in out, out
    assert "(1 image(s) attached to the next message)" in out and "[user] [image] What is it?" in out, out
    stats = [ln for ln in r.stderr.splitlines() if "prompt" in ln and "tok/s" in ln]
    assert len(stats) == 2, r.stderr
    assert "reused" in stats[1] and "(0 reused)" not in stats[1], stats  # the second turn resumes past the image
