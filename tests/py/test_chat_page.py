"""The chat page at GET / driven in headless Chromium (Debian's `chromium`, over the DevTools protocol) against
`tern serve --demo`: streaming, Stop (the server counts the cancel), markdown and code blocks, thinking, reload,
the random-weights warning, errors shown as errors, settings, new chat, repairing a conversation (copy, delete,
regenerate, edit and resend; deleting a chat asks; New chat and switching stop a stream; a context overflow
offers a new chat), code highlighting and math (highlight.js and KaTeX with its fonts, served from the binary under
/page/), the
favicon, a phone (the placeholder fits; Enter adds a line and the Send button sends), the queue and prompt progress
shown until the first token, images (picked, pasted or dropped; sent as image_url parts, kept with the chat,
refused in the page when not an image or too large, the server's refusal shown with its reason), and screenshots
at desktop and phone size
(written to test-artifacts/ beside the tern binary, or $TERN_TEST_ARTIFACTS).

Skipped only when no chromium binary exists (scripts/install-deps installs it).
"""
import base64
import io
import json
import os
import pathlib
import re
import time

import pytest
from PIL import Image

from cdp_browser import Browser, find_chromium
from test_server_helpers import demo_server_fixture, metrics, post_json, request, wait_idle

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


PAGE_ASSETS = {"page/highlight.min.js": "text/javascript", "page/highlight.css": "text/css",
               "page/katex.min.js": "text/javascript", "page/katex.min.css": "text/css"}


def test_page_loads_nothing_from_elsewhere(server):
    status, headers, body = request("GET", server.port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "<script>" in page and "ternMarkdown" in page and "<style>" in page
    # Its only resources are the embedded libraries, relative to the page (served by this server, below).
    assert sorted(re.findall(r'<(?:script|link)\b[^>]*\s(?:src|href)="([^"]*)"', page)) == sorted(PAGE_ASSETS)
    rest = re.sub(r'<(?:script|link)\b[^>]*\s(?:src|href)="page/[^"]*"[^>]*>', "", page)
    # Nothing else loads: no other scripts, styles, fonts or images.
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b|@import|url\(", rest), "an external resource"
    assert "/*TERN:" not in page  # every part was spliced in


def test_page_assets_are_served_from_the_binary(server):
    for path, media_type in PAGE_ASSETS.items():
        status, headers, body = request("GET", server.port, "/" + path)
        assert status == 200, path
        assert headers["content-type"].split(";")[0] == media_type, (path, headers["content-type"])
        assert "max-age" in headers.get("cache-control", ""), path
        if media_type == "text/css":
            # Nothing is imported; the only urls are KaTeX's fonts, each a woff2 served beside the stylesheet.
            assert b"@import" not in body, path
            for url in re.findall(rb"url\(([^)]*)\)", body):
                assert re.fullmatch(rb"KaTeX_[A-Za-z0-9-]+\.woff2", url), (path, url)
    _, _, hl = request("GET", server.port, "/page/highlight.min.js")
    assert hl.startswith(b"var hljs=") and b'hljs.registerLanguage("python",' in hl and len(hl) < 200_000
    _, _, css = request("GET", server.port, "/page/highlight.css")
    assert b"prefers-color-scheme:light" in css and b"prefers-color-scheme:dark" in css
    _, _, kx = request("GET", server.port, "/page/katex.min.js")
    assert b"katex" in kx and b"renderToString" in kx
    # KaTeX's 20 fonts: every one its stylesheet names is served as woff2, the bytes of Debian's fonts-katex.
    _, _, kcss = request("GET", server.port, "/page/katex.min.css")
    fonts = sorted(set(re.findall(rb"url\((KaTeX_[A-Za-z0-9-]+\.woff2)\)", kcss)))
    assert len(fonts) == 20, fonts
    for font in fonts:
        status, headers, data = request("GET", server.port, "/page/" + font.decode())
        assert status == 200 and headers["content-type"] == "font/woff2", (font, status, headers)
        assert data.startswith(b"wOF2") and "max-age" in headers.get("cache-control", ""), font
        package_file = pathlib.Path("/usr/share/fonts/truetype/katex") / font.decode()
        if package_file.exists():
            assert data == package_file.read_bytes(), font
    for bad in ("/page/nope.js", "/page/..%2Fstyle.css", "/page/"):
        assert request("GET", server.port, bad)[0] == 404, bad


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


def test_math_uses_katex_fonts(browser):
    # A formula in the page: the browser fetches KaTeX's own fonts from /page/ and they load (no serif stand-in).
    r = browser.js("""(async () => {
      const d = document.createElement('div');
      d.innerHTML = tern.renderMarkdown('$$\\\\int_0^1 x^2\\\\,dx = \\\\frac{1}{3}$$');
      tern.decorate(d);
      document.body.appendChild(d);
      await document.fonts.ready;
      const loaded = await Promise.all(['16px KaTeX_Main', 'italic 16px KaTeX_Math', '16px KaTeX_Size1']
                                         .map(f => document.fonts.load(f).then(l => l.length)));
      d.remove();
      return {loaded, main: document.fonts.check('16px KaTeX_Main'),
              faces: [...document.fonts].filter(f => f.family.startsWith('KaTeX') && f.status === 'loaded')
                                        .map(f => f.family)};
    })()""")
    assert all(n >= 1 for n in r["loaded"]) and r["main"], r
    assert "KaTeX_Main" in r["faces"], r


def test_code_is_highlighted_and_math_rendered_while_streaming_too(browser):
    # A half-streamed answer: the closed fence is highlighted, the open one (still growing) is left plain; math
    # renders; code and "$5 and $10" stay as written.
    md = ("Area $\\pi r^2$ costs $5 and $10.\n\n```python\ndef f(x):\n    return '$x$'\n```\n\n"
          "`$y$` and \\(a_1 * b_2\\)\n\n$$\n\\sum_{i=1}^n i\n$$\n\n```python\ndef g(")
    r = browser.js(f"""(() => {{
      const d = document.createElement('div');
      d.innerHTML = tern.renderMarkdown({json.dumps(md)});
      tern.decorate(d);
      const codes = d.querySelectorAll('pre code');
      return {{hljs: [...codes].map(c => c.classList.contains('hljs')),
               keyword: codes[0].querySelector('.hljs-keyword') && codes[0].querySelector('.hljs-keyword').textContent,
               code: codes[0].textContent, open: codes[1].textContent,
               katex: d.querySelectorAll('.katex').length, display: d.querySelectorAll('.katex-display').length,
               mathInCode: d.querySelectorAll('code .katex, pre .katex').length,
               inline: d.querySelector('p code').textContent, dollars: d.querySelector('p').textContent,
               annotations: [...d.querySelectorAll('annotation')].map(a => a.textContent)}};
    }})()""")
    assert r["hljs"] == [True, False], r
    assert r["keyword"] == "def"
    assert r["code"] == "def f(x):\n    return '$x$'" and r["open"] == "def g("
    assert r["katex"] == 3 and r["display"] == 1 and r["mathInCode"] == 0, r
    assert r["inline"] == "$y$"
    assert "costs $5 and $10." in r["dollars"], r["dollars"]
    assert r["annotations"] == ["\\pi r^2", "a_1 * b_2", "\\sum_{i=1}^n i"], r["annotations"]


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
    assert last(browser, ".msg.user .text") == "Hi"


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
    users_before = browser.js("[...document.querySelectorAll('.msg.user .text')].map(e => e.textContent)")
    browser.reload()
    browser.wait_for("document.querySelectorAll('.msg.user').length > 0", what="the restored chat")
    assert browser.js("[...document.querySelectorAll('.msg.user .text')].map(e => e.textContent)") == users_before
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
    assert b.js("document.querySelector('.msg.user .text').textContent") == "Hi"


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



# ---- repairing a conversation (issue 35): message actions, chat deletion, stopping before switching, favicon ----
# Each test starts its own chat (these run after the tests above, which count the chats they made).

def new_chat(b):
    b.js("document.getElementById('new-chat').click()")
    b.wait_for("document.querySelectorAll('.msg').length === 0 && !document.getElementById('send').disabled",
               what="an empty new chat")


def click_forced(b, index, action, answer):
    """Clicks the action button of message `index`; the request it makes is answered `answer` (thinking off)."""
    b.js(f"tern.hooks.extraBody = {{tern_debug_forced_output: {json.dumps(answer)}, max_tokens: 64,"
         " chat_template_kwargs: {enable_thinking: false}}")
    try:
        assert click_action(b, index, action)
        wait_done(b)
    finally:
        b.js("tern.hooks.extraBody = null")


def ask_forced(b, text, answer):
    """Sends `text`; the demo model answers `answer` (thinking off, so it is all content)."""
    b.js(f"tern.hooks.extraBody = {{tern_debug_forced_output: {json.dumps(answer)}, max_tokens: 64,"
         " chat_template_kwargs: {enable_thinking: false}}")
    try:
        send(b, text)
        wait_done(b)
    finally:
        b.js("tern.hooks.extraBody = null")


def record_requests(b):
    """From now on, the page's chat requests' bodies are kept in window.__bodies."""
    b.js("""(() => { window.__bodies = []; if (window.__fetch) return; window.__fetch = window.fetch;
      window.fetch = (url, opts) => { if (String(url).includes('/chat/completions')) __bodies.push(JSON.parse(opts.body));
        return window.__fetch(url, opts); }; })()""")


def bodies(b):
    return b.js("window.__bodies.map(x => x.messages.map(m => [m.role, m.content]))")


def log_messages(b):
    """The log as [role, text]: a question's text, an answer's markdown text content, an error's text."""
    return b.js("""[...document.querySelectorAll('#log .msg')].map(e => [
      e.classList.contains('user') ? 'user' : e.classList.contains('error') ? 'error' : 'assistant',
      (e.querySelector('.text') || e.querySelector('.content')).textContent.trim()])""")


def click_action(b, index, act):
    """Clicks the button data-act=`act` of the log's message at `index` (negative: from the end)."""
    return b.js(f"""(() => {{ const all = document.querySelectorAll('#log .msg'); const i = {index};
      const btn = all[i < 0 ? all.length + i : i].querySelector('button[data-act="{act}"]');
      if (!btn || btn.disabled || btn.hidden) return false; btn.click(); return true; }})()""")


def test_copy_an_answer(browser):
    b = browser
    new_chat(b)
    ask_forced(b, "Copy test", "Copy **this** answer.\n\n```\nline 1\n```")
    assert click_action(b, -1, "copy")
    copied = b.wait_for("tern.hooks.copied", what="the copied text")
    assert copied.strip() == "Copy **this** answer.\n\n```\nline 1\n```", copied  # the whole answer, as written
    assert b.js("document.querySelector('#log .msg.assistant button[data-act=copy]').textContent") in ("Copied", "Copy failed")
    # Every action is a real button with a title (keyboard-reachable).
    assert b.js("[...document.querySelectorAll('#log .actions button')].every(x => x.tagName === 'BUTTON' && x.title)")


def test_delete_a_question_takes_its_answers(browser):
    b = browser
    new_chat(b)
    ask_forced(b, "Q one", "A one.")
    ask_forced(b, "Q two", "A two.")
    assert log_messages(b) == [["user", "Q one"], ["assistant", "A one."], ["user", "Q two"], ["assistant", "A two."]]
    assert click_action(b, 0, "delete")
    assert log_messages(b) == [["user", "Q two"], ["assistant", "A two."]]
    assert click_action(b, -1, "delete")  # an answer goes alone
    assert log_messages(b) == [["user", "Q two"]]
    b.reload()
    b.wait_for("document.querySelectorAll('.msg.user').length", what="the restored chat")
    assert log_messages(b) == [["user", "Q two"]]  # kept


def test_regenerate_the_last_answer(browser):
    b = browser
    new_chat(b)
    ask_forced(b, "Q one", "A one.")
    ask_forced(b, "Q two", "First try.")
    assert not click_action(b, 1, "regenerate")  # only the last answer can be regenerated
    record_requests(b)
    click_forced(b, -1, "regenerate", "Second try.")
    assert log_messages(b) == [["user", "Q one"], ["assistant", "A one."], ["user", "Q two"], ["assistant", "Second try."]]
    # Asked again with the same conversation, the dropped answer left out.
    assert bodies(b) == [[["user", "Q one"], ["assistant", "A one."], ["user", "Q two"]]]


def test_edit_and_resend_a_question(browser):
    b = browser
    new_chat(b)
    ask_forced(b, "Q one", "A one.")
    ask_forced(b, "Q two", "A two.")
    # Cancel keeps the message as it was.
    assert click_action(b, 0, "edit")
    assert b.js("document.querySelector('#log .msg textarea.edit').value") == "Q one"
    assert click_action(b, 0, "cancel")
    assert log_messages(b)[0] == ["user", "Q one"] and not b.js("document.querySelector('textarea.edit')")
    # Send: the edited question replaces the old one, what followed it goes, a new answer streams.
    record_requests(b)
    assert click_action(b, 0, "edit")
    b.js("document.querySelector('textarea.edit').value = 'Q one, edited'")
    b.js("tern.hooks.extraBody = {tern_debug_forced_output: 'New answer.', max_tokens: 64,"
         " chat_template_kwargs: {enable_thinking: false}}")
    try:
        assert click_action(b, 0, "resend")
        wait_done(b)
    finally:
        b.js("tern.hooks.extraBody = null")
    assert log_messages(b) == [["user", "Q one, edited"], ["assistant", "New answer."]]
    assert bodies(b) == [[["user", "Q one, edited"]]]
    assert b.js("document.querySelector('#chat-list li.current .title').textContent") == "Q one, edited"


def test_deleting_a_chat_asks_first(browser):
    b = browser
    new_chat(b)
    ask_forced(b, "Doomed chat", "Bye.")
    count = "document.querySelectorAll('#chat-list li').length"
    n = b.js(count)
    b.js("document.querySelector('#chat-list li.current .del').click()")
    assert b.js(count) == n and b.js("document.querySelector('#chat-list li.confirming .title').textContent").startswith("Delete")
    b.js("document.querySelector('#chat-list li.confirming .no').click()")  # No: nothing happens
    assert b.js(count) == n and not b.js("document.querySelector('#chat-list li.confirming')")
    assert log_messages(b)[0] == ["user", "Doomed chat"]
    b.js("document.querySelector('#chat-list li.current .del').click()")
    b.js("document.querySelector('#chat-list li.confirming .yes').click()")
    b.wait_for(f"{count} === {n - 1}", timeout=10, what="the chat to go")
    assert "Doomed chat" not in b.js("[...document.querySelectorAll('#chat-list .title')].map(e => e.textContent)")
    assert b.js("document.querySelectorAll('#log .msg').length") == 0


def start_streaming(b, text):
    send(b, text)
    b.wait_for("document.getElementById('send').disabled", timeout=10, what="the stream to start")
    b.wait_for("(() => { const m = document.querySelectorAll('.msg.assistant'); const a = m[m.length - 1];"
               " return a.querySelector('.body').textContent.length + a.querySelector('.content').textContent.length; })()",
               timeout=120, what="streamed text")
    assert streaming(b)


def test_new_chat_and_switching_stop_a_streaming_answer(browser, server):
    b = browser
    new_chat(b)
    ask_forced(b, "The other chat", "Other.")
    # New chat while an answer streams: the stream stops (the server sees the cancel), the answer is kept, then the
    # new chat opens.
    new_chat(b)
    wait_idle(server.port)
    before = metrics(server.port)[CANCELLED]
    start_streaming(b, "Long one")
    b.js("document.getElementById('new-chat').click()")
    wait_done(b, timeout=30)
    b.wait_for("document.querySelectorAll('#log .msg').length === 0", timeout=10, what="the new chat")
    deadline = time.monotonic() + 30
    while metrics(server.port)[CANCELLED] < before + 1:
        assert time.monotonic() < deadline, "the server did not see the stream stop"
        time.sleep(0.1)
    b.js("[...document.querySelectorAll('#chat-list .title')].find(e => e.textContent === 'Long one').click()")
    b.wait_for("!!document.querySelector('#log .msg.user .text')", what="the stopped chat")
    assert "stopped" in last(b, ".msg.assistant .meta")
    # Switching chats while an answer streams: the same, then the other chat shows.
    start_streaming(b, "Another long one")
    b.js("[...document.querySelectorAll('#chat-list .title')].find(e => e.textContent === 'The other chat').click()")
    wait_done(b, timeout=30)
    b.wait_for("document.querySelector('#log .msg.user .text').textContent === 'The other chat'", timeout=10,
               what="the switch")
    b.js("[...document.querySelectorAll('#chat-list .title')].find(e => e.textContent === 'Long one').click()")
    b.wait_for("document.querySelectorAll('#log .msg.user').length === 2", what="the stopped chat")
    assert "stopped" in last(b, ".msg.assistant .meta")


def test_context_overflow_offers_a_new_chat(browser):
    b = browser
    new_chat(b)
    long_a, long_b = "alpha " * 2500, "beta " * 2500  # about 2,500 tokens each: together over the 4,096 context
    b.js(f"document.getElementById('input').value = {json.dumps(long_a)}")
    ask_forced(b, "", "Fine.")
    b.js(f"document.getElementById('input').value = {json.dumps(long_b)}")
    ask_forced(b, "", "unused")
    err = last(b, ".msg.error .text")
    assert "too long for the model's context" in err and "--ctx-size" not in err, err
    record_requests(b)
    click_forced(b, -1, "continue", "Continued.")
    # A new chat with the last question (what fits in about half the context), answered there.
    assert log_messages(b) == [["user", long_b.strip()], ["assistant", "Continued."]]
    assert b.js("document.querySelector('#chat-list li.current .title').textContent").endswith("(continued)")
    assert [len(m) for m in bodies(b)] == [1]


def test_favicon(server):
    status, headers, body = request("GET", server.port, "/favicon.ico")
    assert status == 200 and headers["content-type"] == "image/svg+xml"
    assert body.startswith(b"<svg") and len(body) < 2000


def test_real_answer_gets_highlighting_math_and_both_themes(browser):
    new_chat(browser)
    answer = "Math: $x^2$.\n\n```python\nimport os\nprint(os.name, '$HOME')\n```\n\n```\nprice = $3\n```\nDone."
    browser.js(f"tern.hooks.extraBody = {{tern_debug_forced_output: {json.dumps(answer)}, max_tokens: 256,"
               " chat_template_kwargs: {enable_thinking: false}}")
    try:
        send(browser, "Code and math")
        wait_done(browser)
    finally:
        browser.js("tern.hooks.extraBody = null")
    sel = "(() => { const m = document.querySelectorAll('.msg.assistant .content'); return m[m.length - 1]; })()"
    r = browser.js(f"""(() => {{ const c = {sel}; const codes = c.querySelectorAll('pre code');
      return {{n: codes.length, hljs: [...codes].every(e => e.classList.contains('hljs')),
               keywords: [...codes[0].querySelectorAll('.hljs-keyword')].map(k => k.textContent),
               strings: [...c.querySelectorAll('.hljs-string')].map(k => k.textContent),
               texts: [...codes].map(e => e.textContent), katex: c.querySelectorAll('.katex').length,
               mathInCode: c.querySelectorAll('pre .katex').length,
               copied: c.querySelector('.code').querySelector('code').textContent}}; }})()""")
    assert r["n"] == 2 and r["hljs"], r
    assert "import" in r["keywords"], r
    assert "'$HOME'" in r["strings"], r
    assert r["texts"] == ["import os\nprint(os.name, '$HOME')", "price = $3"], r
    assert r["katex"] == 1 and r["mathInCode"] == 0, r
    # The highlight.js theme follows the colour scheme, as the page's own colours do.
    color = f"getComputedStyle({sel}.querySelector('.hljs-keyword')).color"
    try:
        browser.dark(False)
        light = browser.js(color)
        browser.dark(True)
        dark = browser.js(color)
    finally:
        browser.dark(False)
    assert light != dark, (light, dark)


PLACEHOLDER_FIT = """(() => { const i = document.getElementById('input'), cs = getComputedStyle(i);
  const c = document.createElement('canvas').getContext('2d');
  c.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  return {placeholder: i.placeholder, text: c.measureText(i.placeholder).width,
          room: i.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),
          coarse: matchMedia('(pointer: coarse)').matches}; })()"""


def as_phone(b, width, height, on=True):
    """A phone: a narrow mobile viewport with touch (its primary pointer coarse); on=False: back to the desktop."""
    b.resize(width, height, mobile=on)
    b.call("Emulation.setTouchEmulationEnabled", {"enabled": on, "maxTouchPoints": 5} if on else {"enabled": False})
    b.wait_for(f"matchMedia('(pointer: coarse)').matches === {json.dumps(on)}", timeout=10, what="the touch emulation")


def test_phone_placeholder_fits_and_enter_adds_a_line(browser):
    b = browser
    new_chat(b)
    try:
        for w, h in ((375, 667), (320, 568)):
            as_phone(b, w, h)
            fit = b.wait_for(f"(() => {{ const f = {PLACEHOLDER_FIT}; return f.text <= f.room && f; }})()", timeout=10,
                             what=f"the placeholder to fit at {w}x{h}: {b.js(PLACEHOLDER_FIT)}")
            assert fit["placeholder"] and fit["coarse"], fit
            b.wait_for("document.getElementById('empty').textContent.includes('the Send button sends')", timeout=10,
                       what="the phone's hint")
        # Enter adds a line and sends nothing; the Send button sends the lines.
        b.js("tern.hooks.lastBody = null; document.getElementById('input').focus()")
        b.type_text("first line")
        b.press_enter()
        b.type_text("second line")
        time.sleep(0.3)
        assert b.js("document.getElementById('input').value") == "first line\nsecond line"
        assert b.js("tern.hooks.lastBody") is None and not streaming(b), "Enter sent on a phone"
        assert b.js("document.querySelectorAll('.msg.user').length") == 0
        b.js("tern.hooks.extraBody = {tern_debug_forced_output: 'Two lines.', max_tokens: 8}")
        try:
            b.js("document.getElementById('send').click()")
            wait_done(b)
        finally:
            b.js("tern.hooks.extraBody = null")
        sent = b.js("tern.hooks.lastBody.messages")
        assert sent[-1] == {"role": "user", "content": "first line\nsecond line"}, sent
        assert last(b, ".msg.user .text") == "first line\nsecond line"
        assert b.js("document.getElementById('input').value") == ""
    finally:
        as_phone(b, 1280, 800, on=False)
    # The desktop is as it was: the longer placeholder (and it fits), Enter sends, Shift+Enter adds a line.
    fit = b.wait_for(f"(() => {{ const f = {PLACEHOLDER_FIT}; return f.placeholder.includes('Shift+Enter') && f; }})()",
                     timeout=10, what="the desktop placeholder")
    assert fit["text"] <= fit["room"], fit
    new_chat(b)
    assert "Enter sends, Shift+Enter" in b.js("document.getElementById('empty').textContent")
    b.js("tern.hooks.lastBody = null; tern.hooks.extraBody = {tern_debug_forced_output: 'Ok.', max_tokens: 8};"
         "document.getElementById('input').focus()")
    try:
        b.type_text("desk one")
        b.press_enter(shift=True)
        b.type_text("desk two")
        assert b.js("tern.hooks.lastBody") is None
        b.press_enter()
        wait_done(b)
    finally:
        b.js("tern.hooks.extraBody = null")
    assert b.js("tern.hooks.lastBody.messages")[-1] == {"role": "user", "content": "desk one\ndesk two"}


# ---- queued and prefill progress (issue 35): the server's prompt_progress in place of the bare "…" ----

def test_progress_shows_in_place_of_the_dots_until_the_first_token(browser):
    """The page asks for progress (return_progress) and shows what the server reports before the first token:
    its place in the queue, then how much of the prompt is read; the first token clears it. The stream is played
    by a stand-in for fetch, one event at a time, so that each state can be looked at."""
    b = browser
    new_chat(b)
    b.js("""(() => { window.__fetchBeforeProgress = window.fetch; window.__progressStream = null;
      window.fetch = (url, opts) => {
        if (!String(url).includes('/chat/completions')) return window.__fetchBeforeProgress(url, opts);
        window.__progressSent = JSON.parse(opts.body);
        const body = new ReadableStream({start(c) { window.__progressStream = c; }});
        return Promise.resolve(new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
      }; })()""")
    meta = {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    empty = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}]

    def emit(event):
        payload = "data: " + (event if isinstance(event, str) else json.dumps(event)) + "\n\n"
        b.js(f"window.__progressStream.enqueue(new TextEncoder().encode({json.dumps(payload)}))")

    def shown(want):
        expr = ("(() => { const m = document.querySelectorAll('.msg.assistant'); const a = m[m.length - 1];"
                " const p = a.querySelector('.progress'); return p.hidden ? '' : p.textContent; })()")
        b.wait_for(f"{expr} === {json.dumps(want)}", timeout=10, what=f"the progress line {want!r}: {b.js(expr)!r}")

    dots = ("(() => { const m = document.querySelectorAll('.msg.assistant .content');"
            " return getComputedStyle(m[m.length - 1], '::after').content; })()")
    try:
        send(b, "Progress please")
        b.wait_for("window.__progressStream !== null", timeout=10, what="the request")
        assert b.js("window.__progressSent.return_progress") is True
        emit(dict(meta, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
        shown("")
        assert b.wait_for(f"{dots} !== 'none' && {dots}", timeout=10) == '"…"', "the dots while nothing is known"
        reading = {"total": 31000, "cache": 0, "processed": 0, "time_ms": 0}
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, queued=True, queued_ahead=2)))
        shown("waiting for 2 requests ahead")
        assert b.js(dots) == "none", "no dots beside the progress line"
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, queued=True, queued_ahead=1)))
        shown("waiting for 1 request ahead")
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, queued=True, queued_ahead=0)))
        shown("waiting for a running request to finish")
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, processed=12000, time_ms=900)))
        shown("reading prompt 12,000 / 31,000")
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, cache=2000, processed=14000, time_ms=950)))
        shown("reading prompt 14,000 / 31,000 (2,000 reused)")
        emit(dict(meta, choices=empty, prompt_progress=dict(reading, processed=31000, time_ms=2000)))
        shown("")  # read: the first token is near, the dots again
        emit(dict(meta, choices=[{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]))
        b.wait_for("(() => { const m = document.querySelectorAll('.msg.assistant .content');"
                   " return m[m.length - 1].textContent === 'Hello'; })()", timeout=10, what="the first token")
        shown("")
        emit(dict(meta, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        emit("[DONE]")
        b.js("window.__progressStream.close()")
        wait_done(b)
        shown("")
    finally:
        b.js("""(() => { try { window.__progressStream && window.__progressStream.close(); } catch (e) {}
          window.fetch = window.__fetchBeforeProgress; })()""")
        if streaming(b):
            b.js("document.getElementById('stop').click()")
            wait_done(b, timeout=30)
    assert last(b, ".msg.assistant .content").strip() == "Hello"
    assert b.js("tern.progressText({total: 10, cache: 0, processed: 10, time_ms: 5})") == ""


def test_long_prompt_shows_its_reading_on_the_real_server(browser, server):
    """Against the server: a prompt of two of the CPU runner's chunks shows "reading prompt N / M" (every state the
    progress line took is recorded), and the answer then comes as usual."""
    b = browser
    new_chat(b)
    b.js("""(() => { window.__progressSeen = [];
      window.__progressObserver = new MutationObserver(() => {
        for (const p of document.querySelectorAll('#log .progress'))
          if (!p.hidden && __progressSeen[__progressSeen.length - 1] !== p.textContent)
            __progressSeen.push(p.textContent);
      });
      window.__progressObserver.observe(document.getElementById('log'),
        {subtree: true, childList: true, characterData: true, attributes: true}); })()""")
    try:
        b.js(f"document.getElementById('input').value = {json.dumps('gamma ' * 3000)}")
        ask_forced(b, "", "Read it.")
    finally:
        b.js("window.__progressObserver.disconnect()")
    seen = b.js("window.__progressSeen")
    assert any(re.fullmatch(r"reading prompt [\d,]+ / 3,\d{3}", s) for s in seen), seen
    assert last(b, ".msg.assistant .content").strip() == "Read it."
    assert b.js("document.querySelector('#log .msg.assistant .progress').hidden")


# ---- images (issue 34): attached by the pick button, a paste or a drop; sent as image_url parts; kept with the chat;
# refused in the page when not an image or too large, and the server's refusal shown with its reason ----

def png_bytes(width, height, color):
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


def data_url(data, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(data).decode()


def image_tokens(width, height):
    """<|image_pad|> tokens of an image on the demo model (Qwen3.6's processor defaults: patch 16, merge 2)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    h, w = smart_resize(height, width, 32, 65536, 16777216)
    return (h // 16) * (w // 16) // 4


def pick_files(b, *paths):
    """Chooses files in the page's file input, as its Attach button's picker would."""
    root = b.call("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    node = b.call("DOM.querySelector", {"nodeId": root, "selector": "#file"})["nodeId"]
    b.call("DOM.setFileInputFiles", {"nodeId": node, "files": [str(p) for p in paths]})


def js_file(data, name, media):
    return (f"new File([Uint8Array.from(atob({json.dumps(base64.b64encode(data).decode())}), c => c.charCodeAt(0))],"
            f" {json.dumps(name)}, {{type: {json.dumps(media)}}})")


def paste_file(b, data, name, media="image/png"):
    """A paste into the message box whose clipboard holds one file (as a screenshot tool leaves it)."""
    b.js(f"""(() => {{ const dt = new DataTransfer(); dt.items.add({js_file(data, name, media)});
      document.getElementById('input').dispatchEvent(
        new ClipboardEvent('paste', {{clipboardData: dt, bubbles: true, cancelable: true}})); }})()""")


def drop_file(b, file_js):
    """A file (a JS File expression) dropped on the chat's log."""
    b.js(f"""(() => {{ const dt = new DataTransfer(); dt.items.add({file_js});
      document.getElementById('log').dispatchEvent(
        new DragEvent('drop', {{dataTransfer: dt, bubbles: true, cancelable: true}})); }})()""")


def composer_images(b, n):
    """Waits for `n` thumbnails in the composer; their images' names."""
    b.wait_for(f"document.querySelectorAll('#attachments .attachment img').length === {n}", timeout=10,
               what=f"{n} image(s) in the composer")
    return b.js("[...document.querySelectorAll('#attachments img')].map(i => i.alt)")


def message_thumbnails(b, timeout=10):
    """The user messages' thumbnails as (message index, natural width, src), once every one has loaded."""
    expr = """(() => { const users = [...document.querySelectorAll('#log .msg.user')];
      const out = []; users.forEach((u, i) => u.querySelectorAll('img.thumb').forEach(img => {
        out.push([i, img.complete ? img.naturalWidth : 0, img.getAttribute('src')]); }));
      return out; })()"""
    b.wait_for(f"{expr}.every(t => t[1] > 0)", timeout=timeout, what="the thumbnails to load")
    return b.js(expr)


def note(b):
    return b.js("(() => { const n = document.getElementById('attach-note'); return n.hidden ? '' : n.textContent; })()")


def stored_images(b):
    return b.js("""new Promise((resolve, reject) => { const r = indexedDB.open('tern', 1);
      r.onsuccess = () => { const c = r.result.transaction('images').objectStore('images').count();
        c.onsuccess = () => { resolve(c.result); r.result.close(); }; c.onerror = () => reject(c.error); };
      r.onerror = () => reject(r.error); })""")


def test_image_picked_is_sent_shown_and_kept(browser, server, tmp_path):
    b = browser
    new_chat(b)
    red = png_bytes(64, 48, (220, 20, 20))
    (tmp_path / "red.png").write_bytes(red)
    pick_files(b, tmp_path / "red.png")
    assert composer_images(b, 1) == ["red.png"]
    record_requests(b)
    ask_forced(b, "What is in the picture?", "A red picture.")
    # (a) The question shows its image; the composer is empty again.
    assert message_thumbnails(b) == [[0, 64, data_url(red)]]
    assert b.js("document.getElementById('attachments').hidden") and note(b) == ""
    assert log_messages(b) == [["user", "What is in the picture?"], ["assistant", "A red picture."]]
    # (b) It went as an image_url part before the text, and the server read it: the prompt is longer than the same
    # question without it by the image's tokens and its two markers.
    sent = b.js("window.__bodies[0]")
    assert sent["messages"][-1]["content"] == [{"type": "image_url", "image_url": {"url": data_url(red)}},
                                               {"type": "text", "text": "What is in the picture?"}], sent["messages"]
    with_image = int(re.search(r"prompt (\d+)", last(b, ".msg.assistant .meta")).group(1))
    question = [{"role": "user", "content": "What is in the picture?"}]
    text_only = dict(sent, stream=False, max_tokens=1, messages=question)
    for streamed_only in ("stream_options", "return_progress"):
        text_only.pop(streamed_only)
    status, _, r = post_json(server.port, "/v1/chat/completions", text_only, timeout=300)
    assert status == 200, r
    assert with_image == r["usage"]["prompt_tokens"] + 2 + image_tokens(64, 48), (with_image, r["usage"])
    # (c) After a reload the chat shows the image again, and a follow-up question resends it.
    b.reload()
    assert message_thumbnails(b) == [[0, 64, data_url(red)]]
    record_requests(b)
    ask_forced(b, "And now?", "Still red.")
    msgs = b.js("window.__bodies[0].messages")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"], msgs
    assert msgs[0]["content"][0] == {"type": "image_url", "image_url": {"url": data_url(red)}}, msgs[0]
    assert msgs[2]["content"] == "And now?"


def test_images_pasted_and_dropped_and_one_removed(browser):
    b = browser
    new_chat(b)
    blue, green = png_bytes(40, 40, (20, 20, 220)), png_bytes(50, 30, (20, 200, 20))
    paste_file(b, blue, "blue.png")
    assert composer_images(b, 1) == ["blue.png"]
    # A file with no type (the server checks the type): the page tells it by its bytes.
    drop_file(b, js_file(green, "green", ""))
    assert composer_images(b, 2) == ["blue.png", "green"]
    # Text pasted with a file (a spreadsheet's cells) is text: nothing more is attached.
    b.js(f"""(() => {{ const dt = new DataTransfer(); dt.setData('text/plain', 'cells');
      dt.items.add({js_file(blue, 'cells.png', 'image/png')});
      document.getElementById('input').dispatchEvent(
        new ClipboardEvent('paste', {{clipboardData: dt, bubbles: true, cancelable: true}})); }})()""")
    time.sleep(0.3)
    assert composer_images(b, 2) == ["blue.png", "green"]
    b.js("document.querySelector('#attachments .remove').click()")  # × on the first: blue goes
    assert composer_images(b, 1) == ["green"]
    record_requests(b)
    ask_forced(b, "Which colour?", "Green.")
    content = b.js("window.__bodies[0].messages[0].content")
    assert content == [{"type": "image_url", "image_url": {"url": data_url(green)}},
                       {"type": "text", "text": "Which colour?"}], content
    assert [(i, w) for i, w, _ in message_thumbnails(b)] == [(0, 50)]
    # An image alone is a question too.
    drop_file(b, js_file(blue, "only.png", "image/png"))
    composer_images(b, 1)
    ask_forced(b, "", "Blue.")
    assert b.js("window.__bodies[1].messages[2].content") == [
        {"type": "image_url", "image_url": {"url": data_url(blue)}}]
    assert [(i, w) for i, w, _ in message_thumbnails(b)] == [(0, 50), (1, 40)]


def test_non_images_and_huge_files_are_refused_in_the_page(browser, tmp_path):
    b = browser
    new_chat(b)
    (tmp_path / "notes.txt").write_text("not a picture")
    pick_files(b, tmp_path / "notes.txt")
    b.wait_for("!document.getElementById('attach-note').hidden", timeout=10, what="the refusal")
    assert "notes.txt is not an image" in note(b), note(b)
    assert b.js("getComputedStyle(document.getElementById('attach-note')).display") != "none"
    assert b.js("document.getElementById('attachments').hidden")
    # A format the server does not read, and a PNG over the page's 20 MB.
    drop_file(b, js_file(b"BM" + bytes(60), "old.bmp", "image/bmp"))
    b.wait_for("document.getElementById('attach-note').textContent.includes('old.bmp')", timeout=10)
    assert "format the server does not read" in note(b), note(b)
    drop_file(b, "new File([new Uint8Array([0x89, 0x50, 0x4e, 0x47]), new Uint8Array(21 << 20)], 'huge.png',"
                 " {type: 'image/png'})")
    b.wait_for("document.getElementById('attach-note').textContent.includes('huge.png')", timeout=20)
    assert "21 MB" in note(b) and "20 MB" in note(b), note(b)
    assert b.js("document.getElementById('attachments').hidden")
    # Sending stays as it was: nothing was attached. A good image clears the note.
    paste_file(b, png_bytes(8, 8, (1, 2, 3)), "fine.png")
    composer_images(b, 1)
    assert note(b) == ""
    b.js("document.querySelector('#attachments .remove').click()")
    assert b.js("document.getElementById('attachments').hidden")


def test_server_refusing_an_image_shows_why(browser):
    b = browser
    new_chat(b)
    broken = png_bytes(64, 48, (9, 9, 9))[:60]  # a PNG's header, its pixels cut off: the page takes it, the server not
    paste_file(b, broken, "broken.png")
    composer_images(b, 1)
    ask_forced(b, "Look at this", "unused")
    err = last(b, ".msg.error .text")
    assert err.startswith("The server refused an image (HTTP 400): ") and "PNG" in err, err
    assert "delete the question with the image" in err, err
    assert log_messages(b)[0] == ["user", "Look at this"] and len(log_messages(b)) == 2
    # Deleting the question lets the chat go on; its image leaves the browser's storage.
    stored = stored_images(b)
    assert click_action(b, 0, "delete")
    deadline = time.monotonic() + 10
    while stored_images(b) != stored - 1:
        assert time.monotonic() < deadline, "the deleted question's image stayed stored"
        time.sleep(0.1)
    ask_forced(b, "Plain text now", "Fine.")
    assert log_messages(b) == [["user", "Plain text now"], ["assistant", "Fine."]]
