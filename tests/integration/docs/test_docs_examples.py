"""The README's and the guide's examples run, so that none can rot.

Every fenced block of README.md, docs/index.md and docs/guide/*.md runs, page by page in nav order, in
one scratch directory (with `examples/` and `benchmarks/` linked in, as from the repository root):
  - ```bash / ```sh blocks: `bash -euo pipefail`, with `geotrain` (below), then this interpreter's bin first on
    PATH;
  - ```python blocks: this interpreter, as a script;
  - other blocks (```text, ```toml, ```yaml: output and config shown to the reader) are not run;
Markers, an HTML comment on the line right above a block (invisible on the site and on GitHub):
  - `<!-- example: skip (why) -->`: the block is not run (long benches, root, several hosts, fragments);
  - `<!-- example: file NAME -->`: the block's text is written to NAME in the scratch directory (every
    page's files are written before any block runs, so a page may use another page's cluster file).

The `geotrain` first on the blocks' PATH is a thin client: it hands its command line, working directory,
environment, stdin/stdout/stderr and ignored signals to one server process that imported torch, numba and
scipy once, which forks a process that runs `geotrain.cli.main.main()` as the console script would (geotrain's
own modules import there, afresh) and sends back its exit status. That saves a few seconds of imports per
command line (some 30 of them); where the server cannot be reached the client runs the real `geotrain`.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from paths import ROOT

PAGES = ("README.md", "docs/index.md", "docs/guide/quick-start.md", "docs/guide/placing-a-job.md",
         "docs/guide/training-a-plan.md", "docs/guide/running-across-real-sites.md", "docs/guide/slow-links.md",
         "docs/guide/surviving-failures.md",
         "docs/guide/emulating-any-script.md", "docs/guide/heterogeneous-sites.md",
         "docs/guide/heterogeneous-sites-diloco.md", "docs/guide/heterogeneous-sites-async.md",
         "docs/guide/watching-a-run.md")
RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
MARKER = re.compile(r"^<!--\s*example:\s*(skip|file)\b\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```([\w+-]*)\s*$")
BLOCK_TIMEOUT_S = 300
PRELOAD = ("torch", "torch.distributed", "torch.distributed.pipelining", "torch.utils.tensorboard", "numba", "numpy",
           "scipy.optimize", "rich.console", "rich.progress", "rich.table", "yaml")
"""What the `geotrain` server imports once: the commands' third-party imports (2-3 s of CPU per command line)."""
SERVER_START_S = 120
"""Seconds to wait for the server's imports; the client runs the real `geotrain` until it listens."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str | None  # "skip", "file" or None
    argument: str  # the skip reason or the file name

    @property
    def runs(self) -> bool:
        return self.marker is None and self.language in RUN_LANGUAGES


def blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of a markdown text, each with the marker on the line above it."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a fenced block is not closed")
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above.strip())
        found.append(Block(page, i + 1, opening.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n",
                           marker.group(1) if marker else None, marker.group(2) if marker else ""))
        i = end + 1
    return found


def page_blocks(page: str) -> list[Block]:
    return blocks(page, (ROOT / page).read_text())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One directory for every page (nav order), with each page's `file` blocks written in it."""
    where = tmp_path_factory.mktemp("docs-examples")
    for name in ("examples", "benchmarks"):
        (where / name).symlink_to(ROOT / name)
    for page in PAGES:
        for block in page_blocks(page):
            if block.marker == "file":
                (where / block.argument).write_text(block.text)
    return where


def block_env(first_on_path: Path | None = None) -> dict[str, str]:
    """The blocks' environment: this interpreter's bin (`geotrain`, `python`) first on PATH, after
    `first_on_path` when given; no colours, 160 columns, unbuffered Python."""
    path = os.pathsep.join(str(p) for p in (first_on_path, Path(sys.executable).parent) if p is not None)
    return {**os.environ, "PATH": f"{path}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1",
            "COLUMNS": "160", "PYTHONUNBUFFERED": "1"}


def _serve(address: str, preload: list[str], console_script: str, ready: str) -> None:
    """Import `preload`, write `ready`, then fork a manager (`_manage`) for each connection; dies with its parent
    (the test process)."""
    import ctypes
    import importlib
    import os
    import signal
    import socket
    import sys

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    sys.path[0] = os.path.dirname(console_script)  # as the console script's interpreter has it
    for name in preload:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    open(ready, "w").close()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the managers
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _manage(conn, console_script)
        conn.close()


def _manage(conn: "socket.socket", console_script: str) -> None:
    """Read a command line (its length `!I` with the client's stdin, stdout and stderr, then its JSON), fork its
    process (`_become`), send the client its pid, then its wait status (both `!i`); only for this user's
    clients; never returns."""
    import os
    import signal
    import socket
    import struct

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        peer_uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if peer_uid != os.getuid():  # an abstract socket is open to every user of the machine
            return
        size, fds = socket.recv_fds(conn, 4, 3)[:2]
        (length,) = struct.unpack("!I", size)
        body = b""
        while len(body) < length:
            body += conn.recv(length - len(body))
        pid = os.fork()
        if pid == 0:
            conn.close()
            _become(body, fds, console_script)
        for fd in fds:
            os.close(fd)
        conn.sendall(struct.pack("!i", pid))
        conn.sendall(struct.pack("!i", os.waitpid(pid, 0)[1]))
    finally:
        os._exit(0)


def _become(body: bytes, fds: list[int], console_script: str) -> None:
    """Turn this fork into the client's `geotrain` process (its stdio, directory, environment, argv and
    signal dispositions, a fresh temporary directory and `__main__`) and run `main()`; never returns."""
    import json
    import os
    import signal
    import sys
    import tempfile
    import traceback
    import types

    request = json.loads(body)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # gettempdir() reads this environment's TMPDIR
    if "multiprocessing.process" in sys.modules:  # what its import would have set here
        process = sys.modules["multiprocessing.process"]
        process.ORIGINAL_DIR = os.getcwd()
        process.current_process().authkey = os.urandom(32)
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        try:
            signal.signal(sig, signal.SIG_DFL)  # as exec leaves them, then what Python sets at start-up
        except (OSError, ValueError):  # the C library's own real-time signals
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *request["ignored"]):
        signal.signal(sig, signal.SIG_IGN)
    main_module = types.ModuleType("__main__")
    main_module.__file__ = console_script  # what multiprocessing's fork server imports as __mp_main__
    sys.modules["__main__"] = main_module
    sys.argv = [console_script, *request["argv"][1:]]
    from geotrain.procs.exit import exit_without_teardown
    try:
        from geotrain.cli.main import main
        main()  # ends the process itself
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_without_teardown(code)


def _client(address: str, console_script: str) -> None:
    """`geotrain` on the blocks' PATH: run this command line in the server, or the real `geotrain` where the
    server cannot take it; exit as the command line did, forwarding SIGINT, SIGTERM and SIGHUP (unless ignored)."""
    import json
    import os
    import signal
    import socket
    import struct
    import sys

    ignored = [int(sig) for sig in signal.valid_signals() - {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL,
                                                            signal.SIGSTOP}
               if signal.getsignal(sig) == signal.SIG_IGN]
    body = json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": ignored}).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address)
        socket.send_fds(conn, [struct.pack("!I", len(body))], [0, 1, 2])
        conn.sendall(body)
    except OSError:
        os.execv(console_script, [console_script, *sys.argv[1:]])

    def read_int() -> int:
        data = b""
        while len(data) < 4:
            more = conn.recv(4 - len(data))
            if not more:
                print("geotrain (docs test client): the server ended before the command line", file=sys.stderr)
                os._exit(1)
            data += more
        return struct.unpack("!i", data)[0]

    pid = read_int()
    for sig in {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} - set(ignored):
        signal.signal(sig, lambda number, frame: os.kill(pid, number))
    code = os.waitstatus_to_exitcode(read_int())
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


@pytest.fixture(scope="module")
def geotrain_bin(tmp_path_factory) -> Iterator[Path]:
    """A folder holding the `geotrain` client, its server running until the module's tests end."""
    folder = tmp_path_factory.mktemp("docs-geotrain")
    address = f"\0geotrain-docs-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # abstract: no path-length limit
    console_script, ready = str(Path(sys.executable).parent / "geotrain"), folder / "ready"
    server_source = "\n\n".join(inspect.getsource(f) for f in (_serve, _manage, _become))
    (folder / "server.py").write_text(
        f"{server_source}\n\n_serve({address!r}, {list(PRELOAD)!r}, {console_script!r}, {str(ready)!r})\n")
    client = folder / "geotrain"
    client.write_text(f"#!{sys.executable} -S\n{inspect.getsource(_client)}\n\n"
                      f"_client({address!r}, {console_script!r})\n")
    client.chmod(0o755)
    with (folder / "server.log").open("w") as log:
        server = subprocess.Popen([sys.executable, str(folder / "server.py")], stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=log, env=block_env(), start_new_session=True)
    deadline = time.monotonic() + SERVER_START_S  # until then (or if it fails) the client runs the real geotrain
    while server.poll() is None and not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield folder
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)  # the server, its managers and command lines (their workers,
        except ProcessLookupError:                 # in groups of their own, die with them)
            pass
        server.wait()


def run_block(block: Block, where: Path, first_on_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run one block in `where`; its output goes to files, not pipes: a launcher's fork server tears torch down
    for a second or two after the launcher exits, and would hold a pipe open (a shell returns at once)."""
    if RUN_LANGUAGES[block.language] == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    else:
        script = where / f"example-{Path(block.page).stem}-{block.line}.py"
        script.write_text(block.text)
        argv = [sys.executable, str(script)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        code = subprocess.run(argv, cwd=where, env=block_env(first_on_path), stdout=out, stderr=err,
                              timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL).returncode
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, code, out.read(), err.read())


def test_markers_decide_what_runs():
    text = ("```bash\necho run\n```\n\n<!-- example: skip (long) -->\n```bash\nsleep 999\n```\n"
            "<!-- example: file c.yaml -->\n```yaml\nname: x\n```\n```text\noutput\n```\n```python\nprint(1)\n```\n")
    found = blocks("t.md", text)
    assert [(b.language, b.marker, b.argument, b.runs) for b in found] == [
        ("bash", None, "", True), ("bash", "skip", "(long)", False), ("yaml", "file", "c.yaml", False),
        ("text", None, "", False), ("python", None, "", True)]
    assert found[2].text == "name: x\n"


def test_every_page_has_examples_and_every_skip_says_why():
    for page in PAGES:
        found = page_blocks(page)
        assert any(b.runs for b in found) or page == "docs/index.md", page
        for block in found:
            assert block.marker != "skip" or block.argument.startswith("("), f"{page}:{block.line}: skip, no reason"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_run(page, scratch, geotrain_bin):
    for block in page_blocks(page):
        if not block.runs:
            continue
        done = run_block(block, scratch, geotrain_bin)
        assert done.returncode == 0, (f"{page}:{block.line} ({block.language}) exited {done.returncode}\n{block.text}"
                                      f"\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}")


def test_every_guide_page_is_run():
    guide = {f"docs/guide/{page.name}" for page in (ROOT / "docs" / "guide").glob("*.md")}
    assert guide <= set(PAGES), sorted(guide - set(PAGES))
