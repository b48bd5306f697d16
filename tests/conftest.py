"""Shared test setup: offline tiktoken encodings, and small bot-writing helpers."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TIKTOKEN = REPO.parent / "shared" / "tiktoken"

# Tests never download: point tiktoken at the encodings shipped beside the repo.
if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))

ENCODINGS = ("o200k_base", "cl100k_base")
NO_ENCODINGS = (
    "tiktoken's encoding files are not available (offline, and TIKTOKEN_CACHE_DIR={} holds "
    "none): set TIKTOKEN_CACHE_DIR to a folder holding them to run these tests"
)
_encodings_available: bool | None = None


def encodings_available() -> bool:
    """Whether tiktoken can load the encodings the exact-count tests use (tried once per process)."""
    global _encodings_available
    if _encodings_available is None:
        import tiktoken

        try:
            for name in ENCODINGS:
                tiktoken.get_encoding(name)
            _encodings_available = True
        except Exception:  # a ConnectionError offline, an unreadable cache folder
            _encodings_available = False
    return _encodings_available


def no_encodings_reason() -> str:
    return NO_ENCODINGS.format(os.environ.get("TIKTOKEN_CACHE_DIR") or "(unset)")


def skip_without_encodings(items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("needs_encodings")]
    if marked and not encodings_available():
        skip = pytest.mark.skip(reason=no_encodings_reason())
        for item in marked:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """One line (also with -q and xdist) saying why the exact-count tests were skipped."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if "tiktoken's encoding files are not available" in str(r.longrepr)]
    if skipped:
        reason = str(skipped[0].longrepr[-1]).removeprefix("Skipped: ")
        terminalreporter.write_line(f"{len(skipped)} skipped: {reason}", yellow=True)


@pytest.fixture
def fake(monkeypatch):
    """A local OpenAI-compatible server; the openai provider is pointed at it through the environment."""
    from chatrun.testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


@pytest.fixture
def write_bot(tmp_path):
    """Write a single-file bot from YAML text and return its path."""

    def write(text: str, name: str = "bot.yaml", extra: dict[str, str] | None = None) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        for rel, content in (extra or {}).items():
            (tmp_path / rel).write_text(textwrap.dedent(content))
        return path

    return write


# Fixtures that start a process (a server or a terminal): a test using one is a subprocess test.
PROCESS_FIXTURES = {"redis_server", "postgres_server", "pgvector_server", "term"}


def pytest_collection_modifyitems(items):
    """Every browser or subprocess test is slow too, so `-m "not slow"` leaves them out; the
    tests that need tiktoken's encodings skip when there are none."""
    skip_without_encodings(items)
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)
        if item.get_closest_marker("browser") or item.get_closest_marker("subprocess"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _inner_loop_starts_no_process(request, monkeypatch):
    """The inner loop (`-m "not slow"`) stays fast only if no unmarked test starts a process:
    a test that starts one (a browser, a CLI, an MCP server, node) without the `slow` mark
    fails, naming the command, instead of silently slowing every developer's loop."""
    if request.node.get_closest_marker("slow"):
        return
    import subprocess

    def refuse(self, args, *rest, **kwargs):
        shown = args if isinstance(args, str) else " ".join(map(str, args))
        raise RuntimeError(
            f"{request.node.nodeid} starts a process ({shown[:80]}) but is not marked: mark it "
            "`subprocess` or `browser` (both imply `slow`) so the inner loop stays fast"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)  # undone by monkeypatch after the test


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server on a free loopback port, for the whole test session (each xdist
    worker starts its own). Tests take `redis_server.url()`: a URL with its own key prefix."""
    from redis_support import REDIS_SERVER, RedisServer

    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (apt-get install redis-server): Redis tests skipped")
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL on a free loopback port, for the whole test session (each xdist worker
    starts its own: tests/postgres_support.py). Tests take `postgres_server.url()`: a URL of a
    fresh database of their own."""
    from postgres_support import PostgresServer, postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): Postgres tests skipped")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'chatrun[postgres]')")
    server = PostgresServer().start()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def pgvector_server():
    """A real PostgreSQL with the pgvector extension (the `pgserver` wheel's binaries: Debian 12
    packages no pgvector), like postgres_server."""
    from postgres_support import PostgresServer, pgvector_binaries

    bindir = pgvector_binaries()
    if bindir is None:
        pytest.skip("pgvector: the pgserver wheel is not installed (pip install pgserver; the test extra has it "
                    "where it has a wheel): the database's vector ranking not tested")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'chatrun[postgres]')")
    server = PostgresServer(bindir).start()
    yield server
    server.remove()


_span_exporter: list = []  # the in-memory exporter, added once per process to the SDK's tracer provider


@pytest.fixture
def spans():
    """The OpenTelemetry spans finished during the test (the SDK's in-memory exporter)."""
    trace = pytest.importorskip("opentelemetry.trace", reason="opentelemetry is not installed (pip install 'chatrun[otel]')")
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is not installed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if not _span_exporter:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, sdk_trace.TracerProvider):  # set once per process, as OpenTelemetry allows
            provider = sdk_trace.TracerProvider()
            trace.set_tracer_provider(provider)
        _span_exporter.append(InMemorySpanExporter())
        provider.add_span_processor(SimpleSpanProcessor(_span_exporter[0]))
    exporter = _span_exporter[0]
    exporter.clear()
    yield exporter


@pytest.fixture
def term(tmp_path):
    """term(*args) starts `chatrun repl *args` in a pseudo-terminal (tty_support.Terminal); all
    are closed after the test."""
    from tty_support import Terminal

    started: list[Terminal] = []

    def start(*args: str) -> Terminal:
        t = Terminal.chatrun(["repl", *args], home=tmp_path)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()
