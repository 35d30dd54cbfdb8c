"""A small headless-Chromium driver over the DevTools protocol, for the chat page tests.

Chromium speaks CDP over a pipe (--remote-debugging-pipe: it reads commands on fd 3 and writes on fd 4, each
message JSON ended by a NUL byte), so no websocket library and no port are needed. Only Debian's `chromium`
is used; nothing is downloaded. Not a test module itself.
"""
import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page (tab); close() ends it."""

    def __init__(self, binary, width=1280, height=800):
        self.profile = tempfile.mkdtemp(prefix="tern-chromium-")
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # The child's ends moved to fds >= 10: were one of them 3 or 4 (a process with few files open), the shell's
        # redirections below would close it after making it fd 3 or 4.
        to_r, from_w = (self._high_fd(to_r), self._high_fd(from_w))
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", "about:blank"]
        # bash puts the pipe ends on fds 3 and 4, where Chromium looks for them.
        shell = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        self.log = tempfile.NamedTemporaryFile(prefix="tern-chromium-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(["bash", "-c", shell, binary, *args], pass_fds=(to_r, from_w),
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._replies = {}
        self.events = []  # (method, params, sessionId) in arrival order
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=None)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.resize(width, height)

    @staticmethod
    def _high_fd(fd):
        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return high

    # ---- protocol ---------------------------------------------------------------------------------------------
    def _read_loop(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies["closed"] = True
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append((msg.get("method"), msg.get("params", {}), msg.get("sessionId")))
                    self._cond.notify_all()

    def call(self, method, params=None, session="page", timeout=60):
        with self._cond:
            self._next_id += 1
            mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session == "page":
            msg["sessionId"] = self.session
        elif session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                if self._replies.get("closed"):
                    raise CdpError(f"chromium exited during {method}:\n{self.log_text()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CdpError(f"no reply to {method} in {timeout}s")
                self._cond.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def log_text(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    # ---- page helpers -------------------------------------------------------------------------------------------
    def resize(self, width, height, mobile=False):
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})

    def dark(self, on):
        self.call("Emulation.setEmulatedMedia",
                  {"features": [{"name": "prefers-color-scheme", "value": "dark" if on else "light"}]})

    def _wait_load(self, since, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(m == "Page.loadEventFired" for m, _, _ in self.events[since:]):
                    return
            time.sleep(0.02)
        raise CdpError("the page did not load")

    def goto(self, url):
        since = len(self.events)
        self.call("Page.navigate", {"url": url})
        self._wait_load(since)

    def reload(self):
        since = len(self.events)
        self.call("Page.reload", {})
        self._wait_load(since)

    def js(self, expression, timeout=60):
        """Evaluates an expression (awaiting a promise) and returns its JSON value; JS exceptions raise."""
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                      timeout=timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CdpError(f"JS error in {expression!r}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=60, what=None):
        """Polls a JS expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.js(expression)
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}")
            time.sleep(0.05)

    def type_text(self, text):
        self.call("Input.insertText", {"text": text})

    def key(self, key, code=None, vk=0, text=None, shift=False):
        base = {"key": key, "code": code or key, "windowsVirtualKeyCode": vk, "modifiers": 8 if shift else 0}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", **base, **({"text": text} if text else {})})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def press_enter(self, shift=False):
        self.key("Enter", vk=13, text="\r", shift=shift)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def exceptions(self):
        with self._lock:
            return [p for m, p, _ in self.events if m == "Runtime.exceptionThrown"]

    def close(self):
        try:
            self.call("Browser.close", session=None, timeout=10)
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        os.close(self._to_w)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
