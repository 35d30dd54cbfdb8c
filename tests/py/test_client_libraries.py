"""The client libraries people point at tern (issue 35), each driven as it is used by default: the openai SDK (chat
completions, streamed or not, also with llama.cpp's return_progress, and the Responses API), the anthropic SDK
(messages.create, messages.stream), litellm (an "openai/" model on a custom api_base), pydantic-ai (structured output, by its default tool-call mode and by its
native response_format json_schema mode) and the ollama client (chat, streamed or not, generate, list, show). Each
sends the model name the tool defaults to (any name is answered when one model is served) and must get a usable
answer in the shapes the library parses: non-empty text, or an object that validates.

The demo model has random weights: the tests check shapes and non-emptiness, never content, and keep the answers
short (max tokens small where the client lets a caller set it). The demo is a thinking model that never closes its
reasoning by itself, so the server runs with --thinking-budget 4: after four reasoning tokens it is told to answer,
as a deployer would configure it; the requests themselves carry no thinking settings. Only the local server is
reached: litellm is kept from fetching its model-cost map, and every client has retries off and a bounded timeout.
"""
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported: no fetch from GitHub

import anthropic
import litellm
import ollama
import openai
import pydantic
import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from test_server_helpers import demo_server_fixture

MODEL = "tern-demo-random-weights"
USER = [{"role": "user", "content": "Hi"}]
TIMEOUT = 120
# Enough for the four reasoning tokens, the server's "budget spent" line and some answer text.
MAX_TOKENS = 40

# litellm builds pydantic models of TypedDicts with ReadOnly items when first called: noise, not a finding.
pytestmark = pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier:UserWarning")

server = demo_server_fixture("--ctx-size", "1024", "--thinking-budget", "4", "-q")


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def olla(server):
    return ollama.Client(host=server.base, timeout=TIMEOUT)


# ---- openai ----

def test_openai_chat_completion(oai):
    """The call every OpenAI-compatible tool makes first: one chat completion, with the SDK's default model name."""
    r = oai.chat.completions.create(model="gpt-4o-mini", messages=USER, max_completion_tokens=MAX_TOKENS)
    assert r.object == "chat.completion" and r.model == MODEL and r.id
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip(), r
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= MAX_TOKENS and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_chat_completion_stream(oai):
    """stream=True as chat front-ends send it: chunks of the one choice, text in the deltas, one finish_reason."""
    chunks = list(oai.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=MAX_TOKENS, stream=True))
    assert chunks and all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1
    choices = [ch for c in chunks for ch in c.choices]
    assert choices and all(ch.index == 0 for ch in choices)
    text = "".join(ch.delta.content or "" for ch in choices)
    assert text.strip(), chunks
    finishes = [ch.finish_reason for ch in choices if ch.finish_reason]
    assert finishes in (["stop"], ["length"]), finishes


def test_openai_chat_completion_stream_with_progress(oai):
    """llama.cpp's return_progress through the SDK (extra_body, as clients that know llama-server send it): the
    progress chunks parse as chunks with an empty delta, their prompt_progress kept in model_extra, and the answer's
    text adds up as without them."""
    chunks = list(oai.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=MAX_TOKENS, stream=True,
                                              extra_body={"return_progress": True}))
    assert chunks and all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    progress = [c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in (c.model_extra or {})]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] > 0, progress
    choices = [ch for c in chunks for ch in c.choices]
    assert choices and all(ch.index == 0 for ch in choices)
    assert "".join(ch.delta.content or "" for ch in choices).strip(), chunks
    assert [ch.finish_reason for ch in choices if ch.finish_reason] in (["stop"], ["length"])


@pytest.mark.skipif(not hasattr(openai.OpenAI, "responses"), reason="this openai SDK has no Responses API")
def test_openai_responses(oai):
    """responses.create, the SDK's newer default API (Codex, the Agents SDK): output_text gathers a message's text."""
    r = oai.responses.create(model="gpt-4o-mini", input="Hi", max_output_tokens=MAX_TOKENS)
    assert r.object == "response" and r.model == MODEL
    assert r.status in ("completed", "incomplete")
    messages = [item for item in r.output if item.type == "message"]
    assert len(messages) == 1 and messages[0].role == "assistant"
    assert r.output_text.strip(), r
    assert r.usage.output_tokens <= MAX_TOKENS


# ---- anthropic ----

def test_anthropic_messages_create(claude):
    """messages.create with Claude Code's small default model name: one text block, a stop reason, usage."""
    m = claude.messages.create(model="claude-3-5-haiku-latest", max_tokens=16, messages=USER)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    texts = [b for b in m.content if b.type == "text"]
    assert texts and all(b.text for b in texts) and "".join(b.text for b in texts).strip(), m
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 16 and m.usage.input_tokens > 0


def test_anthropic_messages_stream(claude):
    """messages.stream, the SDK's streaming helper: text_stream yields the text, the final message holds the same."""
    with claude.messages.stream(model="claude-3-5-haiku-latest", max_tokens=16, messages=USER) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces).strip(), pieces
    assert "".join(b.text for b in final.content if b.type == "text") == "".join(pieces)
    assert final.model == MODEL and final.stop_reason in ("end_turn", "max_tokens")


# ---- litellm ----

def litellm_args(server):
    return dict(model="openai/gpt-4o-mini", api_base=server.base + "/v1", api_key="x", messages=USER,
                max_tokens=MAX_TOKENS, timeout=TIMEOUT, num_retries=0)


def test_litellm_completion(server):
    """litellm.completion on an OpenAI-compatible api_base (how aider, LangChain's LiteLLM and proxies reach it)."""
    r = litellm.completion(**litellm_args(server))
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content.strip(), r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= MAX_TOKENS


def test_litellm_completion_stream(server):
    """The same with stream=True: litellm's chunk wrapper yields the text and one finish reason."""
    chunks = list(litellm.completion(**litellm_args(server), stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), chunks
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in \
        (["stop"], ["length"])


# ---- pydantic-ai ----

class City(pydantic.BaseModel):
    """Bounded fields: the random model, forced into a schema, still picks a string's or a number's length at random
    and would rarely end an unbounded one within max_tokens. pydantic-ai passes maxLength and the bounds through."""
    name: str = pydantic.Field(max_length=16)
    population: int = pydantic.Field(ge=0, le=10**8)
    coastal: bool


def agent(server, output_type):
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.base + "/v1", api_key="x"))
    # A retry would hide a first answer that did not validate: none allowed.
    return Agent(model, output_type=output_type, retries=0,
                 model_settings={"max_tokens": 200, "timeout": TIMEOUT})


def test_pydantic_ai_default_tool_output(server):
    """pydantic-ai's default structured output: a `final_result` tool whose parameters are the model's schema, with
    tool_choice "required" (no text output allowed). The random model can only produce a valid call if the server
    forces the tool's schema."""
    result = agent(server, City).run_sync("Name a city.")
    assert isinstance(result.output, City), result.output


def test_pydantic_ai_native_output(server):
    """NativeOutput: response_format json_schema (strict), which the server enforces with its grammar."""
    result = agent(server, NativeOutput(City)).run_sync("Name a city.")
    assert isinstance(result.output, City), result.output


# ---- ollama ----

def test_ollama_chat(olla):
    """ollama.Client.chat, not streamed, with a name:tag as Ollama tools send one."""
    r = olla.chat(model=MODEL + ":latest", messages=USER, options={"num_predict": MAX_TOKENS})
    assert r.message.role == "assistant" and r.message.content.strip(), r
    assert r.done and r.done_reason in ("stop", "length")
    assert 0 < r.eval_count <= MAX_TOKENS and r.prompt_eval_count > 0


def test_ollama_chat_stream(olla):
    """stream=True: parts with text, the last one done with the counts."""
    parts = list(olla.chat(model="llama3.2", messages=USER, stream=True, options={"num_predict": MAX_TOKENS}))
    assert parts and parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts).strip(), parts
    assert parts[-1].done_reason in ("stop", "length") and 0 < parts[-1].eval_count <= MAX_TOKENS


def test_ollama_generate(olla):
    """generate (Continue's and older tools' completion call), streamed and not."""
    r = olla.generate(model=MODEL + ":latest", prompt="Hi", options={"num_predict": MAX_TOKENS})
    assert r.done and r.response.strip(), r
    parts = list(olla.generate(model=MODEL + ":latest", prompt="Hi", stream=True,
                               options={"num_predict": MAX_TOKENS}))
    assert parts[-1].done and "".join(p.response for p in parts).strip(), parts


def test_ollama_list_and_show(olla):
    """list and show, which Ollama front-ends call before chatting: the model listed, its details parsed."""
    names = [m.model for m in olla.list().models]
    assert names and any(n.split(":")[0] == MODEL for n in names), names
    shown = olla.show(MODEL + ":latest")
    assert shown.details is not None and shown.modelinfo, shown
