"""The chat page at GET / driven in headless Chromium (Debian's `chromium`, over the DevTools protocol) against
`tern serve --demo`: streaming, Stop (the server counts the cancel), markdown and code blocks, thinking, reload,
the random-weights warning, errors shown as errors, settings, new chat, and screenshots at desktop and phone size
(written to test-artifacts/ beside the tern binary, or $TERN_TEST_ARTIFACTS).

Skipped only when no chromium binary exists (scripts/install-deps installs it).
"""
import json
import os
import pathlib
import re
import time

import pytest

from cdp_browser import Browser, find_chromium
from test_server_helpers import demo_server_fixture, metrics, request, wait_idle

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (scripts/install-deps installs it)")

CANCELLED = 'tern_queue_finished_total{outcome="cancelled"}'


server = demo_server_fixture("--debug-allow-forced-output", "--ctx-size", "4096")


@pytest.fixture(scope="module")
def artifacts(tern_bin):
    d = pathlib.Path(os.environ.get("TERN_TEST_ARTIFACTS") or pathlib.Path(tern_bin).resolve().parent / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    print(f"screenshots in {d}")
    return d


@pytest.fixture(scope="module")
def browser(server):
    b = Browser(CHROMIUM)
    b.goto(server.base + "/")
    b.wait_for("document.getElementById('model-name').textContent !== 'connecting…'", what="the model name")
    yield b
    errors = b.exceptions()
    b.close()
    assert not errors, f"uncaught JS exceptions on the page: {errors}"


def send(b, text):
    b.js("document.getElementById('input').focus()")
    b.type_text(text)
    b.press_enter()


def streaming(b):
    return b.js("document.getElementById('send').disabled && !document.getElementById('stop').disabled")


def wait_done(b, timeout=120):
    b.wait_for("!document.getElementById('send').disabled && document.getElementById('stop').disabled",
               timeout=timeout, what="the answer to finish")


def last(b, selector):
    return b.js(f"(() => {{ const all = document.querySelectorAll({json.dumps(selector)});"
                f" return all.length ? all[all.length - 1].textContent : null; }})()")


def test_page_is_self_contained(server):
    status, headers, body = request("GET", server.port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "<script>" in page and "ternMarkdown" in page and "<style>" in page
    # Nothing loads from elsewhere: no external scripts, styles, fonts or images.
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b|@import|url\(", page), "an external resource"
    assert "/*TERN:" not in page  # every part was spliced in


def test_renderer_is_safe_and_renders_markdown(browser):
    md = ("# Head\nSome **bold**, *it*, `a<b`.\n\n```python\nprint('<hi>')\nx = 1\n```\n\n- one\n- two\n  - nested\n\n"
          "| a | b |\n|---|---|\n| 1 | 2 |\n\n[bad](javascript:alert(1)) [good](https://example.org/) "
          "<img src=x onerror=alert(1)><script>alert(2)</script>")
    r = browser.js(f"""(() => {{
      const d = document.createElement('div');
      d.innerHTML = tern.renderMarkdown({json.dumps(md)});
      return {{h1: d.querySelector('h1') && d.querySelector('h1').textContent,
               strong: d.querySelector('strong') && d.querySelector('strong').textContent,
               em: d.querySelector('em') && d.querySelector('em').textContent,
               inline: [...d.querySelectorAll('p code')].map(c => c.textContent),
               code: d.querySelector('.code pre code') && d.querySelector('.code pre code').textContent,
               lang: d.querySelector('.code-head span').textContent,
               copy: !!d.querySelector('.code button.copy'),
               items: [...d.querySelectorAll('li')].length, nested: !!d.querySelector('li ul li'),
               th: d.querySelectorAll('th').length, td: d.querySelectorAll('td').length,
               links: [...d.querySelectorAll('a')].map(a => a.getAttribute('href')),
               unsafe: d.querySelectorAll('script,img,[onerror]').length}};
    }})()""")
    assert r["h1"] == "Head" and r["strong"] == "bold" and r["em"] == "it"
    assert r["inline"] == ["a<b"]
    assert r["code"] == "print('<hi>')\nx = 1" and r["lang"] == "python" and r["copy"]
    assert r["items"] == 3 and r["nested"]
    assert r["th"] == 2 and r["td"] == 2
    assert r["links"] == ["https://example.org/"]
    assert r["unsafe"] == 0


def test_renderer_refuses_link_targets_with_control_characters(browser):
    # A browser strips leading C0 controls from a URL before reading its scheme: "\x01javascript:" runs script.
    md = "[a](\u0001javascript:alert(1)) [b](\u001fjavascript:alert(2)) [c](java\u0001script:alert(3)) [ok](/docs)"
    r = browser.js(f"""(() => {{
      const d = document.createElement('div');
      d.innerHTML = tern.renderMarkdown({json.dumps(md)});
      return [...d.querySelectorAll('a')].map(a => [a.textContent, a.protocol]);
    }})()""")
    assert r == [["ok", "http:"]]


def test_warning_and_model_name(browser):
    assert browser.js("document.getElementById('model-name').textContent") == "tern-demo-random-weights"
    assert not browser.js("document.getElementById('warning').hidden")
    assert "random weights" in browser.js("document.getElementById('warning').textContent").lower()


def test_stream_then_stop_cancels_on_the_server(browser, server):
    wait_idle(server.port)
    before = metrics(server.port)[CANCELLED]
    send(browser, "Hi")
    assert browser.wait_for("document.getElementById('send').disabled", timeout=10), "Send stays enabled"
    assert streaming(browser)
    text = "(() => { const m = document.querySelectorAll('.msg.assistant'); const a = m[m.length - 1];" \
           " return a.querySelector('.body').textContent.length + a.querySelector('.content').textContent.length; })()"
    first = browser.wait_for(text, timeout=120, what="streamed text")
    browser.wait_for(f"{text} > {first}", timeout=60, what="more streamed text")
    assert streaming(browser)
    browser.js("document.getElementById('stop').click()")
    wait_done(browser, timeout=30)
    meta = last(browser, ".msg.assistant .meta")
    assert "stopped" in meta and "first token" in meta, meta
    deadline = time.monotonic() + 30
    while metrics(server.port)[CANCELLED] < before + 1:
        assert time.monotonic() < deadline, "the server did not count the stopped generation as cancelled"
        time.sleep(0.1)
    assert last(browser, ".msg.user") == "Hi"


def test_real_answer_renders_markdown_and_thinking(browser):
    forced = "Let me think about it.</think>\n\nHere is code:\n\n```python\nprint(42)\n```\n\nand **bold**."
    browser.js(f"tern.hooks.extraBody = {{tern_debug_forced_output: {json.dumps(forced)}}}")
    try:
        send(browser, "Show me code")
        wait_done(browser)
    finally:
        browser.js("tern.hooks.extraBody = null")
    r = browser.js("""(() => { const m = document.querySelectorAll('.msg.assistant'); const a = m[m.length - 1];
      return {code: a.querySelector('.content .code code') && a.querySelector('.content .code code').textContent,
              strong: a.querySelector('.content strong') && a.querySelector('.content strong').textContent,
              thinking: a.querySelector('.body').textContent, summary: a.querySelector('summary').textContent,
              open: a.querySelector('details').open, meta: a.querySelector('.meta').textContent}; })()""")
    assert r["code"] == "print(42)" and r["strong"] == "bold"
    assert r["thinking"].strip() == "Let me think about it."
    n = int(re.search(r"(\d+) tokens", r["summary"]).group(1))
    assert n > 0 and not r["open"], r  # the thinking folds once the answer is there
    assert re.search(r"[\d.]+ tok/s", r["meta"]) and "first token" in r["meta"], r["meta"]
    # Thinking unfolds on a click.
    browser.js("(() => { const s = document.querySelectorAll('.msg.assistant summary'); s[s.length - 1].click(); })()")
    assert browser.js("(() => { const d = document.querySelectorAll('.msg.assistant details'); return d[d.length - 1].open; })()")


def test_http_error_shows_as_error(browser):
    browser.js("tern.hooks.extraBody = {temperature: 7}")
    try:
        send(browser, "this request is refused")
        wait_done(browser)
    finally:
        browser.js("tern.hooks.extraBody = null")
    err = last(browser, ".msg.error")
    assert err and "HTTP 400" in err and "temperature" in err, err
    # The error is not styled as an answer, and no empty answer was left behind.
    assert browser.js("getComputedStyle(document.querySelector('.msg.error')).backgroundColor") != \
        browser.js("getComputedStyle(document.querySelector('.msg.assistant')).backgroundColor")
    assert browser.js("document.querySelector('#log').lastElementChild.classList.contains('error')")


def test_reload_restores_the_chat(browser):
    users_before = browser.js("[...document.querySelectorAll('.msg.user')].map(e => e.textContent)")
    browser.reload()
    browser.wait_for("document.querySelectorAll('.msg.user').length > 0", what="the restored chat")
    assert browser.js("[...document.querySelectorAll('.msg.user')].map(e => e.textContent)") == users_before
    assert browser.js("document.querySelector('.content .code code').textContent") == "print(42)"
    assert browser.js("document.querySelectorAll('.msg.error').length") == 1
    assert browser.js("document.querySelectorAll('#chat-list li').length") == 1


def test_settings_are_sent_and_kept(browser, server):
    b = browser
    b.js("document.getElementById('open-settings').click()")
    assert b.js("document.getElementById('settings').open")
    assert b.js("document.getElementById('s-max-tokens').value") == "2048"
    b.js("document.getElementById('s-max-tokens').value = '0'")
    b.js("document.getElementById('s-close').click()")
    assert b.js("document.getElementById('settings').open"), "an invalid max tokens was accepted"
    assert "max tokens" in b.js("document.getElementById('settings-error').textContent")
    b.js("document.getElementById('s-max-tokens').value = '3';"
         "document.getElementById('s-thinking').checked = false;"
         "document.getElementById('s-close').click()")
    assert not b.js("document.getElementById('settings').open")
    send(b, "Short, please")
    wait_done(b)
    meta = last(b, ".msg.assistant .meta")
    assert re.search(r"\b3 tokens\b", meta) and "max tokens reached" in meta, meta
    b.reload()
    assert b.js("tern.settings().max_tokens") == 3 and b.js("tern.settings().thinking") is False
    b.js("document.getElementById('open-settings').click(); document.getElementById('s-reset').click();"
         "document.getElementById('s-close').click()")
    assert b.js("tern.settings().max_tokens") == 2048 and b.js("tern.settings().thinking") is True


def test_new_chat_and_chat_list(browser):
    b = browser
    b.js("document.getElementById('new-chat').click()")
    assert b.js("document.querySelectorAll('.msg').length") == 0
    b.js("tern.hooks.extraBody = {tern_debug_forced_output: 'Second chat.', max_tokens: 8}")
    try:
        send(b, "A second chat")
        wait_done(b)
    finally:
        b.js("tern.hooks.extraBody = null")
    titles = b.js("[...document.querySelectorAll('#chat-list li .title')].map(e => e.textContent)")
    assert len(titles) == 2 and titles[0] == "A second chat", titles
    b.js("document.querySelectorAll('#chat-list li .title')[1].click()")  # back to the first chat
    assert b.js("document.querySelector('.msg.user').textContent") == "Hi"


def test_screenshots_desktop_and_phone(browser, artifacts):
    b = browser
    for name, w, h, dark in (("desktop", 1280, 800, False), ("phone", 390, 844, False), ("phone-dark", 390, 844, True)):
        b.resize(w, h, mobile=w < 500)
        b.dark(dark)
        time.sleep(0.3)
        layout = b.js("""(() => { const r = document.getElementById('input').getBoundingClientRect();
          return {inputBottom: r.bottom, inputTop: r.top, vh: innerHeight, scrollW: document.documentElement.scrollWidth,
                  vw: innerWidth, menu: getComputedStyle(document.getElementById('menu')).display}; })()""")
        assert 0 < layout["inputTop"] and layout["inputBottom"] <= layout["vh"], layout  # the input stays in view
        assert layout["scrollW"] <= layout["vw"], layout  # no sideways scrolling
        assert (layout["menu"] != "none") == (w < 760), layout  # the chat list is a drawer on a phone
        path = artifacts / f"chat-page-{name}.png"
        b.screenshot(path)
        assert path.stat().st_size > 5000
        print(f"screenshot: {path}")
    b.resize(1280, 800)
    b.dark(False)


def test_thinking_budget_setting(browser):
    # Last in the file: it adds a chat to the list that the tests above count.
    b = browser
    b.js("document.getElementById('new-chat').click(); document.getElementById('open-settings').click()")
    b.js("document.getElementById('s-thinking-budget').value = '-1'; document.getElementById('s-close').click()")
    assert b.js("document.getElementById('settings').open"), "a negative thinking budget was accepted"
    assert "thinking budget" in b.js("document.getElementById('settings-error').textContent")
    b.js("document.getElementById('s-thinking-budget').value = '0'; document.getElementById('s-max-tokens').value = '30';"
         "document.getElementById('s-thinking').checked = true; document.getElementById('s-close').click()")
    assert not b.js("document.getElementById('settings').open")
    send(b, "Think briefly")
    wait_done(b)
    # A budget of 0: the reasoning is only the note the server forces, and the answer follows it.
    thought = b.js("(() => { const t = document.querySelectorAll('.msg.assistant details');"
                   " return t[t.length - 1].textContent; })()")
    assert "The thinking budget is spent" in thought, thought
    b.js("document.getElementById('open-settings').click(); document.getElementById('s-reset').click();"
         "document.getElementById('s-close').click()")
    assert b.js("tern.settings().thinking_budget") == ""

