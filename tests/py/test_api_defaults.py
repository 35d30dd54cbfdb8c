"""No surprises in the tools people use (issue 35): the model names tools send by default (gpt-4o-mini,
claude-3-5-haiku-latest, llama3:8b) are answered by the one model served, under its id, on every route;
`name:latest` works everywhere; --strict-model-name brings back the 404.
"""
import json

import anthropic
import openai
import pytest

from test_server_helpers import Server, post_json, request

MODEL = "tern-demo-random-weights"
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tern_bin):
    s = Server(tern_bin, "--ctx-size", "512", "--alias", "my-alias", "-q")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict(tern_bin):
    s = Server(tern_bin, "--ctx-size", "512", "--alias", "my-alias", "--strict-model-name", "-q")
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
