"""A real PostgreSQL server for tests (Debian's `postgresql`), started on a free loopback port in
a temporary folder, like tests/redis_support.py starts Redis. No tests here.

Where the binaries are: `pg_config --bindir`, then /usr/lib/postgresql/*/bin, then PATH
(`initdb`, `postgres`). None found: `postgres_binaries()` is None and the tests that need a
server skip with one line. Debian 12 packages no pgvector, so the tests of the knowledge index's
pgvector ranking take a second server from the `pgserver` wheel (PostgreSQL 16 with pgvector
built in; the `test` extra installs it where it has a wheel): `pgvector_binaries()`, only its
binaries (`pgserver`'s own Python is not imported).

PostgreSQL refuses to run as root ("root" execution of the PostgreSQL server is not permitted).
When the tests run as root (a CI container), initdb and postgres are started as an unprivileged
user: the system's `postgres` user that Debian's package creates, else `nobody`, by Popen's
`user=`/`group=` (a setuid in the child, so the process we hold IS postgres: a SIGKILL reaches
it, no `su` in between). The data folder is made theirs first. Trust authentication on
127.0.0.1 only; fsync off (a test server: speed over durability, a kill -9 of a chatrun
replica is what the chaos tests make, never of the server's machine).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from redis_support import free_port


def postgres_binaries() -> Path | None:
    """The folder holding initdb and postgres, or None."""
    candidates: list[str] = []
    if shutil.which("pg_config"):
        try:
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
            candidates.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(str(Path(found).parent))
    for folder in candidates:
        if folder and (Path(folder) / "initdb").exists() and (Path(folder) / "postgres").exists():
            return Path(folder)
    return None


def pgvector_binaries() -> Path | None:
    """The `pgserver` wheel's folder of PostgreSQL binaries, when it is installed and has
    pgvector beside them; else None."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        install = Path(root) / "pginstall"
        if (install / "share" / "postgresql" / "extension" / "vector.control").exists() and \
                (install / "bin" / "postgres").exists():
            return install / "bin"
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run PostgreSQL as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


class PostgresServer:
    """initdb into a temporary folder, then `postgres` on a free loopback port."""

    def __init__(self, bindir: Path | None = None) -> None:
        bindir = bindir or postgres_binaries()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, postgres)")
        self.bindir = bindir
        self.port = free_port()
        self.user = _run_as()
        self.folder = Path(tempfile.mkdtemp(prefix="chatrun-pg-"))
        self.data = self.folder / "data"
        self.proc: subprocess.Popen | None = None
        if self.user is not None:
            os.chmod(self.folder, 0o755)
            os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)

    def _popen(self, args: list[str], **kwargs: object) -> subprocess.Popen:
        extra: dict = {}
        if self.user is not None:
            extra = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.Popen(args, cwd=self.folder, **extra, **kwargs)  # type: ignore[call-overload]

    def start(self) -> PostgresServer:
        if not self.data.exists():
            init = self._popen([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "chatrun",
                                "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out, _ = init.communicate(timeout=120)
            if init.returncode != 0:
                raise RuntimeError(f"initdb failed: {out.decode(errors='replace')}")
        self.proc = self._popen(
            [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self.folder), "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off", "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=open(self.folder / "log", "ab"))  # noqa: SIM115 - the child holds it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.folder / 'log').read_text(errors='replace')[-2000:]}")
            if self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"postgres did not start on port {self.port}")

    def _ready(self) -> bool:
        import psycopg

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
            with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except (OSError, psycopg.Error):
            return False

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://chatrun@127.0.0.1:{self.port}/{database}"

    def url(self) -> str:
        """A URL of a fresh database of its own: every test gets an empty store."""
        import psycopg

        name = "t" + secrets.token_hex(6)
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def restart(self) -> None:
        """Stop the server (fast shutdown: connections are cut) and start it again, same port and data."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
