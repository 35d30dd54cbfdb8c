"""No surprises in the tools people use (issue 35): the model names tools send by default (gpt-4o-mini,
claude-3-5-haiku-latest, llama3:8b) are answered by the one model served, under its id, on every route;
`name:latest` works everywhere; --strict-model-name brings back the 404. And web apps on this machine
(http://localhost:3000, ...) get CORS answers without --cors-origin, preflights included, while the Host check
against DNS rebinding stays whatever the Origin.
"""
import http.server
import json
import threading

import anthropic
import openai
import pytest

from cdp_browser import Browser, CdpError, find_chromium
from test_server_helpers import HOST, Server, post_json, request

MODEL = "tern-demo-random-weights"
USER = [{"role": "user", "content": "Hi"}]
ASKED = "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-retry-count"


@pytest.fixture(scope="module")
def server(tern_bin):
    s = Server(tern_bin, "--ctx-size", "512", "--alias", "my-alias", "-q")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(tern_bin):
    s = Server(tern_bin, "--ctx-size", "512", "--alias", "my-alias", "--strict-model-name",
               "--cors-origin", "http://app.example", "-q")
    yield s
    s.stop()


# Every route that names a model: (path, body without "model", the answer's field naming it or None).
ROUTES = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 1}, "model"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}, "model"),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 1}, "model"),
    ("/v1/messages", {"messages": USER, "max_tokens": 1}, "model"),
    ("/v1/messages/count_tokens", {"messages": USER}, None),
    ("/api/chat", {"messages": USER, "stream": False, "options": {"num_predict": 1}}, "model"),
    ("/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 1}}, "model"),
    ("/api/show", {}, None),
]


@pytest.mark.parametrize("name", ["gpt-4o-mini", "claude-3-5-haiku-latest", "llama3:8b", MODEL + ":latest",
                                  "my-alias", "my-alias:latest"])
def test_any_model_name_is_answered_by_the_served_model(server, name):
    known = name.split(":")[0] in (MODEL, "my-alias")
    for path, body, field in ROUTES:
        status, _, data = post_json(server.port, path, dict(body, model=name))
        assert status == 200, (path, name, data)
        if field:
            # As OpenAI and Anthropic answer: the served model's id. Ollama echoes a name of the model as written.
            expected = name if path.startswith("/api/") and known else MODEL
            assert data[field] == expected, (path, name, data)
    status, _, data = request("GET", server.port, "/v1/models/" + name)
    assert status == 200 and json.loads(data)["id"] == (name.split(":")[0] if known else MODEL), data


def test_sdk_default_names(server):
    with openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        r = client.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=1)
        assert r.model == MODEL
        chunks = list(client.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=2, stream=True))
        assert chunks and all(c.model == MODEL for c in chunks)
        assert client.models.retrieve("gpt-4o-mini").id == MODEL
    with anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120) as client:
        m = client.messages.create(model="claude-3-5-haiku-latest", max_tokens=1, messages=USER)
        assert m.model == MODEL
    assert f'use model "{MODEL}" or "my-alias" (any other name' in server.log_text()


def test_strict_model_name_refuses_other_names(strict):
    for path, body, _ in ROUTES:
        status, _, data = post_json(strict.port, path, dict(body, model="gpt-4o-mini"))
        assert status == 404, (path, data)
        if path.startswith("/api/"):
            assert data == {"error": "model 'gpt-4o-mini' not found"}, (path, data)
        elif path.startswith("/v1/messages"):
            assert data["type"] == "error" and data["error"]["type"] == "not_found_error", (path, data)
            assert set(data["error"]) == {"type", "message"}, (path, data)
        else:
            assert data["error"]["code"] == "model_not_found", (path, data)
        for name in (MODEL, MODEL + ":latest", "my-alias:latest"):
            status, _, data = post_json(strict.port, path, dict(body, model=name))
            assert status == 200, (path, name, data)
    assert request("GET", strict.port, "/v1/models/gpt-4o-mini")[0] == 404
    assert request("GET", strict.port, f"/v1/models/{MODEL}:latest")[0] == 200
    assert "any other name" not in strict.log_text()


# --- CORS ---------------------------------------------------------------------------------------------------------

LOOPBACK_ORIGINS = ["http://localhost:3000", "http://127.0.0.1:5173", "http://[::1]:8080", "https://localhost",
                    "https://127.0.0.1:8443", "https://[::1]:4443"]


@pytest.mark.parametrize("origin", LOOPBACK_ORIGINS)
def test_loopback_origins_get_cors_by_default(server, origin):
    status, headers, _ = request("OPTIONS", server.port, "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": ASKED})
    assert status == 204
    assert headers["access-control-allow-origin"] == origin
    assert headers["access-control-allow-headers"] == ASKED
    assert "POST" in headers["access-control-allow-methods"]
    status, headers, _ = request("POST", server.port, "/v1/chat/completions",
                                 {"model": MODEL, "messages": USER, "max_tokens": 1}, headers={"Origin": origin})
    assert status == 200 and headers["access-control-allow-origin"] == origin
    assert "origin" in headers["vary"].lower()


@pytest.mark.parametrize("origin", ["http://evil.example", "http://localhost.evil.example:3000", "null",
                                    "http://127.0.0.2:3000", "http://localhost:3000.evil.example"])
def test_other_origins_get_no_cors(server, origin):
    status, headers, _ = request("OPTIONS", server.port, "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": ASKED})
    assert "access-control-allow-origin" not in headers and "access-control-allow-headers" not in headers
    status, headers, _ = request("GET", server.port, "/v1/models", headers={"Origin": origin})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_a_loopback_origin_does_not_open_the_host_check(server, strict):
    for s in (server, strict):
        for host in ("evil.example", f"evil.example:{s.port}", "localhost.evil.example", "127.0.0.1.nip.io"):
            for method in ("GET", "OPTIONS"):
                status, _, body = request(method, s.port, "/v1/models", headers={
                    "Host": host, "Origin": "http://localhost:3000", "Access-Control-Request-Method": "GET"})
                assert status == 403 and b"--allowed-hosts" in body, (host, method, status, body)


def test_cors_origin_adds_to_the_loopback_origins(strict):
    status, headers, _ = request("OPTIONS", strict.port, "/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Headers": ASKED})
    assert headers["access-control-allow-origin"] == "http://localhost:3000"
    assert headers["access-control-allow-headers"] == ASKED
    status, headers, _ = request("OPTIONS", strict.port, "/v1/chat/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Headers": ASKED})
    assert headers["access-control-allow-origin"] == "http://app.example"
    assert headers["access-control-allow-headers"] == ASKED
    _, headers, _ = request("GET", strict.port, "/v1/models", headers={"Origin": "http://evil.example"})
    assert headers["access-control-allow-origin"] == "http://app.example"  # as before: never the other origin


# --- a real browser: a page on another loopback port calls the server --------------------------------------------

CHROMIUM = find_chromium()


class _Page(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        body = b"<!doctype html><title>app</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def page_host():
    """An HTTP server for a blank page on 127.0.0.1 and 127.0.0.2 (another port than tern's)."""
    servers = []

    def start(address):
        httpd = http.server.ThreadingHTTPServer((address, 0), _Page)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd.server_address[1]

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (scripts/install-deps installs it)")
def test_a_page_on_localhost_calls_the_server_from_a_browser(server, page_host):
    port = page_host(HOST)
    other = page_host("127.0.0.2")
    # Authorization and the JSON Content-Type make the browser send a preflight first.
    fetch = ("fetch('http://%s:%d/v1/chat/completions', {method: 'POST', headers: {'Content-Type': "
             "'application/json', 'Authorization': 'Bearer unused', 'x-stainless-os': 'Linux'}, body: JSON.stringify("
             "{model: 'gpt-4o-mini', max_tokens: 1, messages: [{role: 'user', content: 'Hi'}]})})"
             ".then(r => r.json())" % (HOST, server.port))
    b = Browser(CHROMIUM)
    try:
        b.goto(f"http://localhost:{port}/")
        assert b.js(fetch)["model"] == MODEL
        # A page of an origin that is not loopback (127.0.0.2 is not one of them) cannot read the answer.
        b.goto(f"http://127.0.0.2:{other}/")
        with pytest.raises(CdpError, match="Failed to fetch"):
            b.js(fetch)
    finally:
        b.close()
