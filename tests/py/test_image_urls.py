"""http(s) image URLs fetched by `tern serve --allow-image-urls` (the demo model and its small vision encoder), from a
local HTTP server started here: a fetched PNG gives the same prompt tokens and log-probabilities as the same PNG sent
as a data: URL, through OpenAI chat, the Responses API's input_image, Anthropic's url source, /tokenize and
count_tokens; redirects are followed (a few, to http(s) only); a conversation resumes from the prefix cache past a
fetched image. Each failure is a 400 naming the image's field and saying why, within --image-url-timeout: an HTTP
404, a page that is not an image, a body over 20 MiB (announced or not), a slow server, a host that does not answer,
too many redirects, a redirect to another scheme or to an address not allowed, corrupt image bytes (the decoder's own
message, as for a data: URL), an https server whose certificate no CA signed. The local server is on loopback, which
the server refuses unless --image-url-allow lets it through: the fixture's server allows 127.0.0.1 (only), and one
without the flag refuses it saying why. Without --allow-image-urls a URL is still refused (test_images_api.py)."""
import base64
import http.server
import io
import ssl
import shutil
import subprocess
import threading
import time

import pytest
from PIL import Image

from test_server_helpers import HOST, Server, free_port, post_json

MODEL = "tern-demo-random-weights"
IMAGE_PAD = 151655  # the demo tokenizer's <|image_pad|>
TIMEOUT_S = 2  # --image-url-timeout here: the slow endpoint waits longer than this
BIG = 20 * 2**20 + 1  # one byte past the cap


def png(size, color):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


RED = png((64, 48), (220, 20, 20))
RED_REDIRECT_HOPS = 3  # the most the server follows


class Images(http.server.BaseHTTPRequestHandler):
    """The endpoints the tests fetch. HTTP/1.0: one request a connection, as the server's client asks."""

    slow_started = threading.Event()

    def log_message(self, *args):  # quiet
        pass

    def send(self, status, body=b"", content_type="image/png", length=True, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: as meant
            pass

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/red.png":
            return self.send(200, RED, "image/png")
        if path == "/red-octet":  # a store that does not know the type: the bytes say it is a PNG
            return self.send(200, RED, "application/octet-stream")
        if path == "/missing.png":
            return self.send(404, b"not found", "text/plain")
        if path == "/page.html":
            return self.send(200, b"<html><body>hello</body></html>", "text/html; charset=utf-8")
        if path == "/corrupt.png":
            return self.send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "image/png")
        if path == "/big-announced.png":  # Content-Length over the cap: refused before the body is read
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            return
        if path == "/big-unannounced.png":  # no Content-Length: refused while it arrives
            return self.send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * BIG, length=False)
        if path == "/slow.png":  # headers at once, then nothing for longer than the timeout
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(RED)))
            self.end_headers()
            self.wfile.flush()
            time.sleep(TIMEOUT_S * 3)
            return
        if path.startswith("/hop/"):  # /hop/N redirects N more times, then to the picture (relative Locations)
            n = int(path.split("/")[2])
            return self.send(302, b"", "text/plain", extra=[("Location", str(n - 1) if n > 0 else "/red.png")])
        if path == "/to-ftp":
            return self.send(301, b"", "text/plain", extra=[("Location", "ftp://example.com/red.png")])
        if path == "/no-location":
            return self.send(302, b"", "text/plain")
        if path == "/to-other-loopback":  # the same server at another loopback address, which is not allowed
            port = self.server.server_address[1]
            return self.send(302, b"", "text/plain", extra=[("Location", f"http://127.0.0.2:{port}/red.png")])
        if path == "/to-metadata":  # the cloud metadata address
            return self.send(302, b"", "text/plain", extra=[("Location", "http://169.254.169.254/latest/meta-data/")])
        return self.send(404, b"", "text/plain")


@pytest.fixture(scope="module")
def images_url():
    httpd = http.server.ThreadingHTTPServer((HOST, 0), Images)
    httpd.daemon_threads = True  # the slow endpoint's thread must not hold the test run at its end
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://{HOST}:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server(tern_bin):
    s = Server(tern_bin, "--ctx-size", "2048", "--allow-image-urls", "--image-url-timeout", str(TIMEOUT_S),
               "--image-url-allow", HOST)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict_server(tern_bin):
    """--allow-image-urls alone: public addresses only."""
    s = Server(tern_bin, "--ctx-size", "2048", "--allow-image-urls", "--image-url-timeout", str(TIMEOUT_S))
    yield s
    s.stop()


def data_url(data):
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat(port, url, **extra):
    content = [{"type": "text", "text": "Describe the picture."}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0,
            "logprobs": True, "top_logprobs": 2, **extra}
    return post_json(port, "/v1/chat/completions", body, timeout=120)


def answer(r):
    """What the model read: the prompt's length and the first token's distribution."""
    return r["usage"]["prompt_tokens"], r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]


def same_answer(a, b):
    (na, top_a), (nb, top_b) = a, b
    assert na == nb
    assert [t["token"] for t in top_a] == [t["token"] for t in top_b]
    assert all(abs(x["logprob"] - y["logprob"]) < 1e-4 for x, y in zip(top_a, top_b))


def test_a_fetched_image_reads_as_its_data_url(server, images_url):
    status, _, inline = chat(server.port, data_url(RED))
    assert status == 200, inline
    for path in ("/red.png", "/red-octet", "/red.png?size=64#top", f"/hop/{RED_REDIRECT_HOPS - 1}"):
        status, _, fetched = chat(server.port, images_url + path)
        assert status == 200, (path, fetched)
        same_answer(answer(fetched), answer(inline))


def test_other_apis_fetch_urls_too(server, images_url):
    url = images_url + "/red.png"
    body = {"model": MODEL, "max_output_tokens": 1}
    counts = []
    for image in (data_url(RED), url):
        content = [{"type": "input_text", "text": "Look."}, {"type": "input_image", "image_url": image}]
        request = {**body, "input": [{"role": "user", "content": content}]}
        status, _, r = post_json(server.port, "/v1/responses", request, timeout=120)
        assert status == 200, r
        counts.append(r["usage"]["input_tokens"])
    assert counts[0] == counts[1]
    headers = {"anthropic-version": "2023-06-01"}
    counts = []
    for source in ({"type": "base64", "media_type": "image/png", "data": base64.b64encode(RED).decode()},
                   {"type": "url", "url": url}):
        content = [{"type": "image", "source": source}, {"type": "text", "text": "What is it?"}]
        status, _, r = post_json(server.port, "/v1/messages/count_tokens",
                                 {"model": MODEL, "messages": [{"role": "user", "content": content}]}, headers, 120)
        assert status == 200, r
        counts.append(r["input_tokens"])
    assert counts[0] == counts[1]
    content = [{"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "What is it?"}]
    status, _, r = post_json(server.port, "/v1/messages", {"model": MODEL, "max_tokens": 1,
                                                           "messages": [{"role": "user", "content": content}]},
                             headers, 120)
    assert status == 200, r
    tokenized = [post_json(server.port, "/tokenize", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}]}]})[2]["count"]
        for u in (data_url(RED), url)]
    assert tokenized[0] == tokenized[1], tokenized


@pytest.mark.parametrize("path,words", [
    ("/missing.png", "answered HTTP 404"),
    ("/page.html", "not an image (Content-Type 'text/html'"),
    ("/corrupt.png", "does not start with an IHDR chunk"),  # the decoder's message, as for a data: URL
    ("/big-announced.png", "larger than 20 MiB"),
    ("/big-unannounced.png", "larger than 20 MiB"),
    ("/slow.png", "timed out"),
    (f"/hop/{RED_REDIRECT_HOPS}", "redirected more than 3 times"),
    ("/to-ftp", "where it is not an http(s) URL"),
    ("/no-location", "HTTP 302 without a Location"),
    ("/to-other-loopback", "/red.png', where the host 127.0.0.2 is a loopback address (127.0.0.0/8), which this "
                           "server does not fetch from (tern serve --image-url-allow 127.0.0.2"),
    ("/to-metadata", "it redirected to 'http://169.254.169.254/latest/meta-data/', where the host 169.254.169.254 is a "
                     "link-local address (169.254.0.0/16, where cloud metadata services answer)"),
], ids=["404", "html", "corrupt", "big-announced", "big-unannounced", "slow", "redirects", "ftp", "no-location",
        "to-other-loopback", "to-metadata"])
def test_fetch_failures_are_400s_naming_the_image(server, images_url, path, words):
    started = time.monotonic()
    status, _, r = chat(server.port, images_url + path)
    took = time.monotonic() - started
    assert status == 400, r
    err = r["error"]
    assert err["param"] == "messages[0].content[1].image_url.url", err
    assert words in err["message"], err
    if path != "/corrupt.png":
        assert "could not be fetched from '" + images_url + path + "'" in err["message"], err
    assert took < TIMEOUT_S + 1.5, took  # the slow server holds the request no longer than the timeout
    assert server.alive()


def test_unreachable_hosts_and_bad_urls(server):
    closed = free_port()  # nothing listens there
    for url, words in ((f"http://{HOST}:{closed}/a.png", f"could not connect to {HOST}:{closed}"),
                       ("http://user:pw@example.com/a.png", "credentials"),
                       ("http://example.com:99999/a.png", "port")):
        status, _, r = chat(server.port, url)
        assert status == 400 and words in r["error"]["message"], (url, r)
        assert r["error"]["param"] == "messages[0].content[1].image_url.url", r


def test_loopback_and_private_addresses_are_refused_by_default(strict_server, images_url):
    """Without --image-url-allow the server fetches from public addresses only: the local server (on loopback), by
    address or by name, the metadata address and private ranges are refused before any connection, saying why."""
    port = images_url.rsplit(":", 1)[1]
    for url, words in (
            (images_url + "/red.png", f"the host {HOST} is a loopback address (127.0.0.0/8), which this server does "
                                      f"not fetch from (tern serve --image-url-allow {HOST}, or a range holding it, "
                                      "would allow it)"),
            (f"http://localhost:{port}/red.png", "the host localhost resolves to "),
            (f"http://[::1]:{port}/red.png", "the host ::1 is the loopback address (::1/128)"),
            ("http://169.254.169.254/latest/meta-data/", "is a link-local address (169.254.0.0/16, where cloud "
                                                         "metadata services answer)"),
            ("http://10.0.0.5/x.png", "the host 10.0.0.5 is a private address (10.0.0.0/8)"),
            ("http://[::ffff:192.168.1.1]/x.png", "is a private address (192.168.0.0/16)")):
        started = time.monotonic()
        status, _, r = chat(strict_server.port, url)
        assert status == 400, (url, r)
        err = r["error"]
        assert err["param"] == "messages[0].content[1].image_url.url", err
        assert "could not be fetched from '" + url + "': " in err["message"], err
        assert words in err["message"], err
        if "localhost" in url:
            assert "a loopback address" in err["message"] or "the loopback address" in err["message"], err
        assert time.monotonic() - started < TIMEOUT_S, url  # refused before any connection is tried


def test_a_bad_allowed_range_is_refused_at_start(tern_bin):
    done = subprocess.run([tern_bin, "serve", "--demo", "--port", "0", "--allow-image-urls", "--image-url-allow",
                           "127.0.0.1,10.0.0.1/8"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done
    assert "'10.0.0.1/8' has bits set past its prefix length (did you mean 10.0.0.0/8?)" in done.stderr, done.stderr


def test_the_first_failing_image_is_named(server, images_url):
    content = [{"type": "image_url", "image_url": {"url": images_url + "/red.png"}},
               {"type": "image_url", "image_url": {"url": images_url + "/missing.png"}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    status, _, r = post_json(server.port, "/v1/chat/completions", body, timeout=120)
    assert status == 400 and r["error"]["param"] == "messages[0].content[1].image_url.url", r
    assert "HTTP 404" in r["error"]["message"], r


def test_the_server_keeps_serving_during_a_slow_fetch(server, images_url):
    """The fetch runs on the request's HTTP thread: another request is answered while it waits."""
    results = {}
    slow = threading.Thread(target=lambda: results.update(slow=chat(server.port, images_url + "/slow.png")))
    slow.start()
    time.sleep(0.3)
    status, _, r = chat(server.port, data_url(RED))
    assert status == 200, r
    slow.join(timeout=TIMEOUT_S + 30)
    assert results["slow"][0] == 400 and "timed out" in results["slow"][2]["error"]["message"], results


def test_a_fetched_image_resumes_from_the_prefix_cache(server, images_url):
    """The prefix cache keys images by their pixels: turn 1 sends the picture inline, turn 2 by URL, and turn 2
    reuses turn 1's prompt past the image."""
    def body(image, *more):
        content = [{"type": "text", "text": "Remember this picture."},
                   {"type": "image_url", "image_url": {"url": image}}]
        return {"model": MODEL, "messages": [{"role": "user", "content": content}, *more], "max_tokens": 2,
                "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    status, _, t = post_json(server.port, "/tokenize", body(data_url(RED)), timeout=120)
    assert status == 200, t
    image_end = t["tokens"].index(IMAGE_PAD) + t["tokens"].count(IMAGE_PAD)
    status, _, r = post_json(server.port, "/v1/chat/completions", body(data_url(RED)), timeout=120)
    assert status == 200, r
    follow = [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "What colour was it?"}]
    url = images_url + "/red.png"
    status, _, r = post_json(server.port, "/v1/chat/completions", body(url, *follow), timeout=120)
    assert status == 200, r
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > image_end, (r["usage"], image_end)


def test_https_checks_the_certificate(server, tmp_path):
    """https is fetched through OpenSSL: a server whose certificate no CA signed is refused, saying so."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate with")
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("openssl could not make a certificate: " + made.stderr.decode()[-300:])
    httpd = http.server.ThreadingHTTPServer((HOST, 0), Images)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"https://{HOST}:{httpd.server_address[1]}/red.png"
        status, _, r = chat(server.port, url)
        assert status == 400, r
        assert "TLS certificate of" in r["error"]["message"], r
        assert r["error"]["param"] == "messages[0].content[1].image_url.url", r
    finally:
        httpd.shutdown()
        httpd.server_close()
