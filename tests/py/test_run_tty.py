"""`tern run --demo` on a pseudo-terminal, typed at as a person would: line editing (arrow keys, Home/End, Ctrl keys),
history (up arrow), multi-line input (backslash, \"\"\" blocks, bracketed paste), the live thinking indicator,
/help, /history, /clear, Ctrl-C at the prompt and during an answer, Ctrl-D and /exit with status 0 and a newline;
the history kept between sessions (a private file; --no-history keeps none); a line longer than the terminal is
wide wrapped onto rows (read back through a small screen model), the cursor moving across them; the progress of a
long prompt's prefill.

What the conversation holds is read back through /history, which prints each message as [role] text.
"""
import fcntl
import os
import pty
import re
import struct
import termios
import select
import signal
import stat
import tempfile
import time

import pytest

PROMPT = b"\x1b[1m> \x1b[0m"
LEFT, RIGHT, UP, DOWN, HOME, END, DELETE = b"\x1b[D", b"\x1b[C", b"\x1b[A", b"\x1b[B", b"\x1b[H", b"\x1b[F", b"\x1b[3~"
CTRL_A, CTRL_C, CTRL_D, CTRL_E, CTRL_K, CTRL_U, CTRL_W = b"\x01", b"\x03", b"\x04", b"\x05", b"\x0b", b"\x15", b"\x17"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z~]|\r")


class Tty:
    """tern run on a pseudo-terminal: type(), read until a pattern, exit status."""

    def __init__(self, tern_bin, *args, history_file=None, size=None):
        # Each session its own history file unless a test shares one (never the user's own).
        self.own_history = None if history_file else tempfile.mktemp(prefix="tern-history-")
        history_file = history_file or self.own_history
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the program on the terminal's side
            os.environ["TERN_THREADS"] = "2"
            os.environ["TERN_HISTORY_FILE"] = str(history_file)
            os.execv(tern_bin, [tern_bin, "run", "--demo", "--seed", "1", *args])
        if size:  # (rows, columns) of the terminal
            fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        self.out = b""

    def read_until(self, pred, timeout=60):
        end = time.monotonic() + timeout
        while not pred(self.out):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; the terminal shows:\n{self.out[-3000:]!r}")
            r, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the program ended; the terminal shows:\n{self.out[-3000:]!r}")
                self.out += chunk
        return self.out

    def prompt(self, since, timeout=120):
        """Waits for a fresh prompt after offset `since`; returns the offset after it."""
        self.read_until(lambda o: o.find(PROMPT, since) >= 0, timeout)
        return self.out.find(PROMPT, since) + len(PROMPT)

    def type(self, *keys, pause=0.05):
        for k in keys:  # one write per key, as keys arrive from a person (not as a paste)
            os.write(self.fd, k)
            time.sleep(pause)

    def command(self, text, until):
        """Types a line and Enter; returns the plain text printed up to `until` (a regex over the plain text)."""
        start = len(self.out)
        self.type(text.encode(), b"\r")
        self.read_until(lambda o: re.search(until, plain(o[start:])), 60)
        return plain(self.out[start:])

    def drain(self):
        """Reads what is left in the terminal after the program exited (until EOF or nothing for 0.2 s)."""
        while True:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.2)
                if not r:
                    return
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the other side is closed and empty
                return
            if not data:
                return
            self.out += data

    def exit_status(self, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                self.drain()  # what it wrote just before exiting is still in the terminal's buffer
                return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
            try:
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    self.out += os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the program did not exit; the terminal shows:\n{self.out[-2000:]!r}")

    def close(self):
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
        if self.own_history and os.path.exists(self.own_history):
            os.unlink(self.own_history)


def plain(b: bytes) -> str:
    return ANSI.sub(b"", b).decode("utf-8", errors="replace")


@pytest.fixture
def tty(tern_bin):
    t = Tty(tern_bin, "-n", "4", "--no-think")
    t.prompt(0)
    yield t
    t.close()


def history(t):
    """The conversation as /history prints it: the list of its [user] lines."""
    text = t.command("/history", r"\[(user|assistant)\][^\n]*\n[\s\S]*> $|\(no messages yet\)")
    return re.findall(r"^\[user\] (.*)$", text, re.M)


def send_and_wait(t, *keys):
    since = len(t.out)
    t.type(*keys, b"\r")
    t.read_until(lambda o: b"tok/s" in o[since:])  # the speed line after the answer
    t.prompt(since)


def test_arrow_keys_edit_the_line_and_history_recalls(tty):
    t = tty
    send_and_wait(t, b"h", b"e", b"l", b"o", LEFT, b"l")  # "helo", left, "l" -> "hello"
    assert history(t) == ["hello"]
    # Home/End and Ctrl-A/E, Delete and Backspace, Ctrl-W/U/K.
    send_and_wait(t, b"world", HOME, b"big ", END, b"!", CTRL_A, b"a ", CTRL_E, b"\x7f", LEFT, LEFT, DELETE)
    assert history(t)[-1] == "a big word"
    send_and_wait(t, b"one two three", CTRL_W, b"3", CTRL_A, RIGHT, RIGHT, RIGHT, CTRL_K, b"1")
    assert history(t)[-1] == "one1"
    # Up recalls earlier messages (and /history itself, typed in between); Down comes back.
    send_and_wait(t, UP, UP, UP, UP, DOWN, UP, b"?")
    users = history(t)
    assert users[-1] == "a big word?", users
    # Ctrl-U clears what is before the cursor; the conversation never saw an escape sequence.
    send_and_wait(t, b"garbage", CTRL_U, b"clean")
    users = history(t)
    assert users[-1] == "clean" and not any("\x1b" in u or "[D" in u for u in users), users


def test_multiline_input(tty):
    t = tty
    send_and_wait(t, b"first \\", b"\r", b"second")  # a trailing backslash continues the message
    send_and_wait(t, b'"""', b"\r", b"  indented", b"\r", b"last", b"\r", b'"""')
    # Pasted text keeps its newlines (bracketed paste, as terminals send it).
    send_and_wait(t, b"\x1b[200~pasted one\rpasted two\x1b[201~", b" end")
    text = t.command("/history", r"pasted two end\n[\s\S]*> $")
    assert "[user] first \nsecond" in text
    assert '[user]   indented\nlast\n' in text
    assert "[user] pasted one\npasted two end" in text


def test_help_clear_and_unknown(tty):
    t = tty
    text = t.command("/help", r"/exit[\s\S]*> $")
    for word in ("/clear", "/system", "/history", "/exit", "Ctrl-C", '"""'):
        assert word in text, word
    send_and_wait(t, b"remember me")
    assert history(t) == ["remember me"]
    assert "(new conversation)" in t.command("/clear", r"new conversation")
    assert history(t) == []
    assert "unknown command /bogus" in t.command("/bogus", r"unknown command")


def test_ctrl_c_clears_the_line_and_stops_an_answer(tern_bin):
    t = Tty(tern_bin, "-n", "3000")  # thinking on: the live indicator shows while the demo model "thinks"
    try:
        t.prompt(0)
        since = len(t.out)
        t.type(b"typed but dropped", CTRL_C)  # Ctrl-C at the prompt clears the line
        since = t.prompt(since)
        t.type(b"Tell me a long story", b"\r")
        t.read_until(lambda o: re.search(rb"thinking: [1-9]\d* tokens", o[since:]))  # the live indicator counts
        first = int(re.findall(rb"thinking: (\d+) tokens", t.out[since:])[-1])
        t.read_until(lambda o: int(re.findall(rb"thinking: (\d+) tokens", o[since:])[-1]) > first + 3)
        t.type(CTRL_C)
        t.read_until(lambda o: b"stopped" in o[since:], 30)  # the answer stopped ...
        t.prompt(since)  # ... and the prompt came back
        users = history(t)
        assert users == ["Tell me a long story"], users  # the dropped line never became a message
        start = len(t.out)
        t.type(b"/exit", b"\r")
        assert t.exit_status() == 0
        assert plain(t.out[start:]).endswith("/exit\n")  # the shell prompt starts on a line of its own
    finally:
        t.close()


def test_ctrl_d_exits_zero_with_a_newline(tty):
    t = tty
    t.type(b"some text", CTRL_D)  # not empty: Ctrl-D deletes under the cursor (nothing here), no exit
    time.sleep(0.3)
    assert t.pid and os.waitpid(t.pid, os.WNOHANG) == (0, 0)
    since = len(t.out)
    t.type(CTRL_U, CTRL_D)
    assert t.exit_status() == 0
    assert plain(t.out[since:]).endswith("> \n")


def test_history_is_kept_between_sessions(tern_bin, tmp_path):
    path = tmp_path / "state" / "tern" / "run_history"  # folders that do not exist yet
    t = Tty(tern_bin, "-n", "2", "--no-think", history_file=path)
    try:
        t.prompt(0)
        send_and_wait(t, b"first one")
        send_and_wait(t, b"two \\", b"\r", b"lines \\ here")  # a message of two lines, with a backslash
        t.type(b"/exit", b"\r")
        assert t.exit_status() == 0
    finally:
        t.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # private to the user
    assert path.read_text().splitlines() == ["first one", "two \\n" + "lines \\\\ here", "/exit"]
    t = Tty(tern_bin, "-n", "2", "--no-think", history_file=path)
    try:
        t.prompt(0)
        send_and_wait(t, UP, UP, b" again")  # Up, Up: the two-line message of the last session (past /exit)
        text = t.command("/history", r"again\n[\s\S]*> $")
        assert re.findall(r"^\[user\] ", text, re.M) == ["[user] "] and "[user] two \nlines \\ here again" in text
    finally:
        t.close()
    # --no-history: recalls nothing from the file and adds nothing to it.
    before = path.read_text()
    t = Tty(tern_bin, "-n", "2", "--no-think", "--no-history", history_file=path)
    try:
        t.prompt(0)
        send_and_wait(t, UP, b"fresh")
        assert history(t) == ["fresh"]
    finally:
        t.close()
    assert path.read_text() == before


def test_long_history_file_is_trimmed(tern_bin, tmp_path):
    path = tmp_path / "run_history"
    path.write_bytes(b"".join(b"message %d\r\n" % i for i in range(2500)))  # CRLF ends, as an editor may write
    t = Tty(tern_bin, "-n", "2", "--no-think", history_file=path)
    try:
        t.prompt(0)
        send_and_wait(t, UP, b"!")  # Up: the file's last message (its \r dropped)
        assert history(t) == ["message 2499!"]
    finally:
        t.close()
    lines = path.read_text().splitlines()
    # Rewritten at start with the last 1,000, then this session's two messages appended.
    assert lines[0] == "message 1500" and lines[999] == "message 2499" and lines[1000:] == ["message 2499!", "/history"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("run_history.*"))  # no temporary file left behind


class Screen:
    """What a terminal of `columns` columns shows after some output (ASCII text): the cursor moves of the line
    editor (CR, LF, ESC[nA, ESC[nC), clearing (ESC[J, ESC[K), wrapping at the right edge as terminals do (a
    character written past the last column starts the next row); other sequences are ignored."""

    def __init__(self, columns):
        self.columns, self.rows, self.row, self.col = columns, [[]], 0, 0

    def feed(self, data: bytes):
        for m in re.finditer(rb"\x1b\[([0-9;?]*)([A-Za-z~])|([\r\n])|([^\x1b\r\n])", data):
            params, final, ctl, ch = m.groups()
            if final:
                n = int(params) if params.isdigit() else 1
                if final == b"A":
                    self.row = max(0, self.row - n)
                elif final == b"C":
                    self.col = min(self.columns - 1, self.col + n)
                elif final == b"J":
                    del self.line[self.col:]
                    del self.rows[self.row + 1:]
                elif final == b"K":
                    del self.line[self.col:]
            elif ctl == b"\r":
                self.col = 0
            elif ctl == b"\n":
                self.down()
            else:
                if self.col >= self.columns:  # the pending wrap
                    self.col = 0
                    self.down()
                self.line.extend(" " * (self.col - len(self.line)))
                self.line[self.col:self.col + 1] = [ch.decode("latin-1")]
                self.col += 1

    @property
    def line(self):
        return self.rows[self.row]

    def down(self):
        self.row += 1
        if self.row == len(self.rows):
            self.rows.append([])

    def text(self):
        return ["".join(r) for r in self.rows]

    def cursor(self):
        return self.row, min(self.col, self.columns - 1)


def test_long_lines_wrap_and_the_cursor_moves_across_rows(tern_bin):
    t = Tty(tern_bin, "-n", "2", "--no-think", size=(24, 20))
    try:
        since = t.prompt(0) - len(PROMPT)

        def screen():
            sc = Screen(20)
            sc.feed(t.out[since:])
            return sc

        def expect(rows, cursor):
            """Waits until the screen shows `rows` (None: any) with the cursor at `cursor`."""
            def shown(_):
                sc = screen()
                return (rows is None or sc.text() == rows) and sc.cursor() == cursor
            try:
                t.read_until(shown, 10)
            except AssertionError:
                pass
            sc = screen()
            assert (rows is None or sc.text() == rows) and sc.cursor() == cursor, (sc.text(), sc.cursor())

        def rows_of(line):  # 18 cells after the prompt, then rows of 20
            return ["> " + line[:18].decode()] + [line[k:k + 20].decode() for k in range(18, len(line), 20)]

        digits = b"0123456789" * 5  # 50 characters: the prompt's row holds 18, then 20, then 12
        t.type(digits)
        expect(rows_of(digits), (2, 12))
        t.type(HOME)
        expect(None, (0, 2))
        line = b"ab" + digits  # every row shifts by two
        t.type(b"ab")
        expect(rows_of(line), (0, 4))
        t.type(RIGHT * 16)  # along the row and on to the next
        expect(None, (1, 0))
        t.type(LEFT)
        expect(None, (0, 19))
        t.type(END, b"xyzxyz")  # the last row filled to its edge: the cursor starts a row of its own
        expect(rows_of(line + b"xyzxyz") + [""], (3, 0))
        t.type(b"\x7f" * 8)  # Backspace back up a row: the rows below are cleared
        expect(rows_of(line[:50]), (2, 12))
        since_send = len(t.out)
        t.type(b"\r")
        t.read_until(lambda o: b"tok/s" in o[since_send:])
        t.prompt(since_send)
        assert history(t) == [line[:50].decode()]
    finally:
        t.close()


def test_long_prompt_shows_the_prefill_progress(tern_bin):
    t = Tty(tern_bin, "-n", "2", "--no-think")
    try:
        since = t.prompt(0)
        words = b"word " * 2600  # about 2,600 tokens: more than 2,048 new ones
        os.write(t.fd, b"\x1b[200~" + words + b"\x1b[201~")
        t.type(b"\r")
        t.read_until(lambda o: b"tok/s" in o[since:], 120)
        text = plain(t.out[since:])
        # Shown while the prompt is read: from 0, then after the first 2,048-token chunk (and where the generation
        # prompt begins); then the line is cleared before the answer.
        assert re.search(r"reading prompt 0 / 2,6\d\d tokens", text), text[-2000:]
        assert re.search(r"reading prompt 2,048 / 2,6\d\d tokens", text), text[-2000:]
        last = t.out.rfind(b"reading prompt")
        assert t.out[last:].split(b"\x1b[0m\x1b[K", 1)[1].startswith(b"\r\x1b[K"), t.out[last:]
        total, reused = map(int, re.findall(r"prompt (\d+) tokens \((\d+) reused\)", text)[-1])
        assert total > 2600 and reused == 0
        since = t.prompt(since)
        # A short message after it: resumed from the cache, no progress shown.
        start = len(t.out)
        t.type(b"and a short one", b"\r")
        t.read_until(lambda o: b"tok/s" in o[start:], 120)
        text = plain(t.out[start:])
        assert "reading prompt" not in text
        reused = int(re.findall(r"\((\d+) reused\)", text)[-1])
        assert reused > 2600, text
    finally:
        t.close()
