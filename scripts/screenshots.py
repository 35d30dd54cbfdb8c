#!/usr/bin/env python3
"""Screenshots of the chat page for the docs: desktop and phone, light and dark.

    scripts/screenshots.py [--tern build/tern] [--out docs/screenshots]

Starts `tern serve --demo --debug-allow-forced-output` (the demo model's answer forced to a realistic one: markdown,
highlighted code, a formula and a folded thought, so the page shows what a real model's answers look like), drives
the page in headless Chromium (Debian's `chromium`, tests/py/cdp_browser.py) through one question and writes
chat-desktop-light.png, chat-desktop-dark.png, chat-phone-light.png and chat-phone-dark.png to --out. Run it after a
change to the page and commit the images.
"""
import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "py"))
from cdp_browser import Browser, find_chromium  # noqa: E402
from test_server_helpers import Server  # noqa: E402

QUESTION = "How do I reverse a list in Python, and what does it cost?"
ANSWER = (
    "The user wants the ways to reverse a list and their costs. In place, a copy, or an iterator.</think>\n\n"
    "Three ways, depending on whether you want to keep the original:\n\n"
    "1. **In place**: `items.reverse()` changes the list itself and returns `None`.\n"
    "2. **A reversed copy**: `items[::-1]` builds a new list.\n"
    "3. **Lazily**: `reversed(items)` gives an iterator, with no copy until you consume it.\n\n"
    "```python\nitems = [3, 1, 4, 1, 5]\nitems.reverse()          # [5, 1, 4, 1, 3]\n"
    "copy = items[::-1]       # a new list\nfor x in reversed(items):\n    print(x)\n```\n\n"
    "Each of the first two touches every element once, so for a list of $n$ items the cost is $O(n)$ time; "
    "the copy also takes $O(n)$ memory, while `reversed` needs $O(1)$ until it is iterated."
)
SHOTS = (("desktop", 1280, 800), ("phone", 390, 844))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tern", default=str(ROOT / "build" / "tern"), help="the tern binary (default: build/tern)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"), help="folder for the PNG files")
    a = ap.parse_args()
    chromium = find_chromium()
    if chromium is None:
        sys.exit("screenshots: no chromium binary (scripts/install-deps installs it)")
    if not os.access(a.tern, os.X_OK):
        sys.exit(f"screenshots: no tern binary at {a.tern} (scripts/build makes it)")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    server = Server(a.tern, "--debug-allow-forced-output", "--ctx-size", "4096")
    browser = Browser(chromium)
    try:
        browser.goto(server.base + "/")
        browser.wait_for("document.getElementById('model-name').textContent !== 'connecting…'", what="the model")
        browser.js("tern.hooks.extraBody = {tern_debug_forced_output: " + json.dumps(ANSWER) + ", max_tokens: 1024}")
        browser.js("document.getElementById('input').focus()")
        browser.type_text(QUESTION)
        browser.press_enter()
        browser.wait_for("!document.getElementById('send').disabled && document.getElementById('stop').disabled",
                         timeout=300, what="the answer")
        browser.js("tern.hooks.extraBody = null")
        for name, w, h in SHOTS:
            for dark in (False, True):
                browser.resize(w, h, mobile=w < 500)
                browser.dark(dark)
                time.sleep(0.4)  # layout and the colour scheme's transition
                path = out / f"chat-{name}-{'dark' if dark else 'light'}.png"
                browser.screenshot(path)
                print(f"screenshots: {path} ({path.stat().st_size // 1024} KB)")
        errors = browser.exceptions()
        if errors:
            sys.exit(f"screenshots: uncaught JS exceptions on the page: {errors}")
    finally:
        browser.close()
        server.stop()


if __name__ == "__main__":
    main()
