"""docs/architecture.md is the map of the product; these tests keep it true.

- Every product module (each ``.py`` file under ``cosmos3_runtime/``, ``policy_server/`` and
  ``robot_clients/``) is named in the doc, and every module the doc names exists. The doc's convention,
  stated at its top: a module is named in backticks by its path inside its package (``sessions/native.py``
  is ``policy_server/sessions/native.py``), or from the repository root where two packages share that
  path (``cosmos3_runtime/cli.py``) or where the package is not obvious; a package's ``__init__.py`` by its
  folder (``sessions/``).
- The doc's lists of the modules one observation passes through are what one really passes through. A
  real server runs in this process on the tiny checkpoint, the real client (ours for the native protocol,
  openpi's own in its virtualenv) sends one observation, and ``sys.setprofile`` on every server thread
  records which product modules' functions run from the moment the observation is sent until its chunk is
  back and the server is idle again. The server's periodic housekeeping (the engine watchdog and the
  connection supervisor, tasks that run beside every request but act on none) is left out, and so is
  the first observation of a session (it is sent before tracing starts: what runs once per session, such
  as a first import, is not the path of an observation).

Nothing here asserts a time: the window ends when the server's threads are idle, however slow the machine.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from server_fixtures import DOMAIN, REPO_ROOT, ServerThread, rgb_image, tiny_engine_loader

from policy_server.openpi_settings import OpenpiSettings
from robot_clients import AsyncPolicyClient

DOC = REPO_ROOT / "docs" / "architecture.md"
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")
NATIVE_HEADING = "Modules a native observation passes through"
OPENPI_HEADING = "Modules an openpi observation passes through"
# The asyncio tasks of the server's periodic housekeeping (their names, set where they are created).
HOUSEKEEPING_TASKS = frozenset({"engine-watchdog", "connection-supervisor"})
OPENPI_PYTHON = Path(os.environ.get("OPENPI_CLIENT_PYTHON", REPO_ROOT / ".venv-openpi" / "bin" / "python"))


# -- the names in the doc ---------------------------------------------------------------------------


def product_modules() -> list[str]:
    """Every product module, by its path from the repository root."""
    return sorted(
        path.relative_to(REPO_ROOT).as_posix() for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")
    )


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def code_spans(markdown: str) -> list[str]:
    """The contents of the inline code spans of ``markdown`` (fenced blocks left out)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return re.findall(r"`([^`\n]+)`", prose)


def candidates(name: str) -> list[str]:
    """The files a name written in the doc may denote, by their path from the repository root: itself,
    or its path inside each package; a folder (``sessions/``) denotes its ``__init__.py``."""
    target = name + "__init__.py" if name.endswith("/") else name
    if (REPO_ROOT / target).is_file():
        return [target]
    return [f"{package}/{target}" for package in PACKAGES if (REPO_ROOT / package / target).is_file()]


def module_names(markdown: str) -> list[str]:
    """The code spans that name a module or a package folder (a path of identifiers, at least one)."""
    module = re.compile(r"(?:[A-Za-z_][\w]*/)*[A-Za-z_][\w]*\.py")
    folder = re.compile(r"(?:[A-Za-z_][\w]*/)+")
    return [span for span in code_spans(markdown) if module.fullmatch(span) or folder.fullmatch(span)]


def named_modules(markdown: str) -> set[str]:
    """The product modules the doc names unambiguously."""
    named = set()
    for name in module_names(markdown):
        found = candidates(name)
        if len(found) == 1:
            named.add(found[0])
    return named


def test_every_product_module_is_named_in_the_map():
    modules = product_modules()
    assert len(modules) > 50
    missing = sorted(set(modules) - named_modules(doc_text()))
    assert not missing, f"docs/architecture.md does not name {len(missing)} module(s): " + ", ".join(missing)


def test_every_module_the_map_names_exists():
    text = doc_text()
    names = module_names(text)
    assert len(names) > 50
    # A folder that is no package (`docs/`, `dashboard/`) is not a module: only `.py` names must exist.
    stale = sorted({name for name in names if name.endswith(".py") and not candidates(name)})
    ambiguous = sorted({name for name in names if len(candidates(name)) > 1})
    assert not stale, "docs/architecture.md names modules that do not exist: " + ", ".join(stale)
    assert not ambiguous, "name these from the repository root, two packages have them: " + ", ".join(ambiguous)


def path_list(markdown: str, heading: str) -> list[str]:
    """The modules listed under the ``### heading`` of ``markdown``: one bullet each, its name first."""
    lines = markdown.splitlines()
    try:
        start = lines.index(f"### {heading}")
    except ValueError:
        pytest.fail(f"docs/architecture.md has no '### {heading}' section")
    listed = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        match = re.match(r"- `([^`]+)`", line)
        if match:
            found = candidates(match.group(1))
            assert len(found) == 1, f"{match.group(1)!r} under '{heading}' names {found or 'no module'}"
            listed.append(found[0])
    assert listed, f"no module listed under '### {heading}'"
    assert len(listed) == len(set(listed)), f"a module is listed twice under '{heading}'"
    return listed


# -- the trace --------------------------------------------------------------------------------------


class ModuleTrace:
    """A profile function for the server's threads: while ``active``, the product modules whose
    functions are entered (a coroutine resumed counts), and on which threads.

    Installed on each server thread (``sys.setprofile`` there) and, for threads started later,
    with ``threading.setprofile``; the client's thread never carries it."""

    def __init__(self) -> None:
        self.active = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.modules: dict[str, set[str]] = {}
        self.threads: set[int] = set()
        self._prefixes = tuple(f"{REPO_ROOT / package}{os.sep}" for package in PACKAGES)
        self._root = len(f"{REPO_ROOT}{os.sep}")

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.active or event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(self._prefixes) or code.co_name == "<module>":
            return
        thread = threading.get_ident()
        if thread == self.loop_thread and self.loop is not None:
            task = asyncio.current_task(self.loop)
            if task is not None and task.get_name() in HOUSEKEEPING_TASKS:
                return
        self.threads.add(thread)
        module = code.co_filename[self._root :].replace(os.sep, "/")
        self.modules.setdefault(module, set()).add(threading.current_thread().name)


def _idle(thread: int) -> bool:
    """Whether ``thread`` waits for work: blocked in a condition, a queue or an executor's wait."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return True  # ended
    filename = Path(frame.f_code.co_filename).name
    return (filename, frame.f_code.co_name) in {("threading.py", "wait"), ("queue.py", "get"), ("thread.py", "_worker")}


@pytest.fixture(scope="module")
def traced():
    """A server on the tiny checkpoint whose every thread carries one :class:`ModuleTrace`."""
    trace = ModuleTrace()
    load = tiny_engine_loader("distilled")

    def load_traced() -> Any:  # on the engine worker's thread, which also starts the host-prep thread
        engine = load()
        threading.setprofile(trace)
        sys.setprofile(trace)
        return engine

    settings = OpenpiSettings(requested={"domain_name": "droid_lerobot", "action_horizon": 8})
    try:
        with ServerThread(load_traced, openpi=settings) as server:
            trace.loop, trace.loop_thread = server.loop, server.run(threading.get_ident)
            server.run(lambda: sys.setprofile(trace))
            yield server, trace
            trace.active = False
            server.run(lambda: sys.setprofile(None))
    finally:
        threading.setprofile(None)


def start_tracing(trace: ModuleTrace) -> None:
    trace.modules.clear()
    trace.threads.clear()
    trace.active = True


def settle(server: ServerThread, trace: ModuleTrace) -> set[str]:
    """Once the chunk is back: the traced modules, when every thread the server used is idle again and
    its event loop has run all they posted (however long that takes: there is no time to assert)."""
    try:
        deadline = time.monotonic() + 60
        for _ in range(2):  # the loop's callbacks may wake a thread, and a thread may post callbacks
            while not all(_idle(thread) for thread in trace.threads - {trace.loop_thread}):
                assert time.monotonic() < deadline, "the server's threads never went idle"
                time.sleep(0.01)
            server.run(lambda: None)  # every callback posted before has run, and what it scheduled
            server.run(lambda: None)
    finally:
        trace.active = False
    return set(trace.modules)


def _compare(traced_modules: set[str], heading: str) -> None:
    listed = set(path_list(doc_text(), heading))
    unlisted, not_run = sorted(traced_modules - listed), sorted(listed - traced_modules)
    assert not unlisted and not not_run, (
        f"'### {heading}' in docs/architecture.md differs from the traced round trip "
        f"({len(traced_modules)} modules): list {unlisted or 'nothing more'}; drop {not_run or 'nothing'}"
    )


def test_the_native_path_in_the_map_is_the_traced_one(traced):
    server, trace = traced
    image = rgb_image(64)
    chunks = []

    async def session() -> set[str]:
        async with AsyncPolicyClient(server.url) as client:
            await client.configure(domain_name=DOMAIN)
            chunks.append(await client.infer({"image": image}, timeout=60))  # the session's first: untraced
            start_tracing(trace)
            chunks.append(await client.infer({"image": image}, timeout=60))
            return settle(server, trace)  # blocks the client's loop: it has nothing left to do

    modules = asyncio.run(session())
    assert [chunk.seq for chunk in chunks] == [0, 1] and chunks[1].domain_name == DOMAIN
    print(f"\nnative round trip: {len(modules)} product modules:\n  " + "\n  ".join(sorted(modules)))
    _compare(modules, NATIVE_HEADING)


OPENPI_CLIENT = """
import sys
import numpy as np
from openpi_client import websocket_client_policy
sys.path.insert(0, sys.argv[2])
from openpi_client_script import stateless

policy = websocket_client_policy.WebsocketClientPolicy(host=sys.argv[1])
observation = stateless("libero", np.random.default_rng(0))
policy.infer(observation)  # the session's first: untraced
print("ready", flush=True)
sys.stdin.readline()
actions = policy.infer(observation)["actions"]
print("answered", actions.shape, flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not OPENPI_PYTHON.exists(), reason="openpi-client's virtualenv is missing; `make test` builds it")
def test_the_openpi_path_in_the_map_is_the_traced_one(traced):
    server, trace = traced
    client = subprocess.Popen(
        [str(OPENPI_PYTHON), "-c", OPENPI_CLIENT, f"ws://127.0.0.1:{server.port}/openpi", str(REPO_ROOT / "tests")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_PROXY": "*"},
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "ready", client.stderr.read() if client.stderr else ""
        start_tracing(trace)
        client.stdin.write("go\n")
        client.stdin.flush()
        answer = client.stdout.readline().strip()
        modules = settle(server, trace)
        assert answer == "answered (8, 10)", answer
        client.stdin.write("bye\n")
        client.stdin.flush()
        assert client.wait(60) == 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
    print(f"\nopenpi round trip: {len(modules)} product modules:\n  " + "\n  ".join(sorted(modules)))
    _compare(modules, OPENPI_HEADING)
