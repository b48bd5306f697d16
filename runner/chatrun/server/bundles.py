"""Which bot versions kept in the store a replica may load (docs/security.md, "The store").

Whoever can write the store (Redis, the SQLite file) can write a `bot-version:<bot>:<hash>`
record: a bot.yaml whose tool has `handler: evil:run` and an evil.py, hashed as chatrun
hashes, and point a session at it. A replica that loaded it would import evil.py. So a
replica runs a stored version only when it can tell the bot's owner published it:

    signed      every replica that publishes signs the bundle: HMAC-SHA256, with a key that is
                NOT in the store (`chatrun serve --bundle-key FILE`, else $CHATRUN_BUNDLE_KEY),
                over the bundle's canonical bytes (bot, content version, label, published,
                files); a replica with the same key loads it, any other refuses it
    data-only   a bundle with no `.py` file and no MCP server `command` runs no code of its
                own; `--allow-unsigned-data-bundles` lets such bundles load unsigned
    no key      the default: no bundle from the store is loaded (the replica serves the
                versions in its own bot folders; sessions of other versions move by their
                `on_change`, server/versions.py)

Bundles also have a size limit (`--max-bundle-mb`, default 5): a bot whose files are larger
is refused when it is published, and a larger stored record is never loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatrun.errors import ChatrunError

if TYPE_CHECKING:
    from chatrun.definition.config import BotConfig

KEY_ENV = "CHATRUN_BUNDLE_KEY"
MIN_KEY_BYTES = 16
DEFAULT_MAX_BUNDLE_BYTES = 5 * 2**20
SIGNATURE_PREFIX = "hmac-sha256:"
HOW_TO_CONFIGURE = (f"give every replica the same key: chatrun serve --bundle-key FILE, or ${KEY_ENV} "
                    "(docs/security.md, \"The store\")")

# Why a stored bundle was refused: the `reason` label of chatrun_bundles_refused_total.
NO_KEY = "no_key"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
TOO_LARGE = "too_large"
STARTS_PROGRAM = "starts_program"


@dataclass(frozen=True)
class BundlePolicy:
    """What a replica signs its published bundles with and which stored bundles it loads."""

    key: bytes | None = None  # the bundle key (None: none configured; then nothing stored is loaded)
    allow_unsigned_data: bool = False  # load unsigned bundles that hold no code (no .py, no MCP command)
    max_bytes: int = DEFAULT_MAX_BUNDLE_BYTES  # a bundle's files at most (paths and texts, UTF-8)

    def __repr__(self) -> str:  # never the key itself, in a log or a traceback
        return (f"BundlePolicy(key={'set' if self.key else None}, allow_unsigned_data={self.allow_unsigned_data}, "
                f"max_bytes={self.max_bytes})")

    @classmethod
    def from_env(cls, key_file: str | Path | None = None, allow_unsigned_data: bool = False,
                 max_bytes: int = DEFAULT_MAX_BUNDLE_BYTES) -> BundlePolicy:
        """The key from `key_file`, else from $CHATRUN_BUNDLE_KEY, else none."""
        return cls(read_key(key_file), allow_unsigned_data, max_bytes)

    def sign(self, record: dict[str, Any]) -> str | None:
        """The signature of a bundle record (None without a key)."""
        if self.key is None:
            return None
        return SIGNATURE_PREFIX + hmac.new(self.key, canonical(record), hashlib.sha256).hexdigest()

    def signed(self, record: dict[str, Any]) -> bool:
        """Whether the record carries this replica's signature over its own contents."""
        mine, theirs = self.sign(record), record.get("signature")
        return mine is not None and isinstance(theirs, str) and hmac.compare_digest(mine, theirs)

    def refusal(self, record: dict[str, Any]) -> tuple[str, str] | None:
        """Why this replica may not load a stored bundle record (its files already checked
        against their hash): (reason label, sentence), or None when it may."""
        files = record.get("files") or {}
        size = bundle_size(files)
        if size > self.max_bytes:
            return TOO_LARGE, f"it is {megabytes(size)}, over the bundle limit of {megabytes(self.max_bytes)}"
        if self.signed(record):
            return None
        code = code_files(files)
        if not code and self.allow_unsigned_data:
            return None
        holds = (f"it holds code ({', '.join(code[:3])}{', ...' if len(code) > 3 else ''})" if code
                 else "it is a data-only bundle (no .py files), and --allow-unsigned-data-bundles is off")
        if self.key is None:
            return NO_KEY, f"{holds} and this replica has no bundle key to check who published it"
        if record.get("signature") is None:
            return UNSIGNED, f"{holds} and it is not signed"
        return BAD_SIGNATURE, f"{holds} and its signature does not match this replica's bundle key"

    def check_size(self, name: str, label: str, files: dict[str, str]) -> None:
        """Refuse to publish a bundle over the limit (ChatrunError naming the bot and its largest files)."""
        size = bundle_size(files)
        if size <= self.max_bytes:
            return
        largest = sorted(files, key=lambda f: -len(files[f].encode("utf-8")))[:3]
        raise ChatrunError(
            f"bot {name} version {label}: its files are {megabytes(size)}, over the bundle limit of "
            f"{megabytes(self.max_bytes)} (the largest: {', '.join(largest)}); every version is published to "
            "the store for the other replicas, so keep large data out of the bot folder (an API, a database) "
            "or raise the limit with --max-bundle-mb")


def read_key(key_file: str | Path | None) -> bytes | None:
    """The bundle key: the contents of `key_file` (surrounding whitespace dropped), else of
    $CHATRUN_BUNDLE_KEY, else None. A key shorter than 16 bytes is refused."""
    if key_file is not None:
        try:
            key = Path(key_file).read_bytes().strip()
        except OSError as exc:
            raise ChatrunError(f"--bundle-key {key_file}: cannot read it: {exc.strerror or exc}") from None
        where = f"--bundle-key {key_file}"
    else:
        key = os.environ.get(KEY_ENV, "").strip().encode("utf-8")
        where = f"${KEY_ENV}"
        if not key:
            return None
    if len(key) < MIN_KEY_BYTES:
        raise ChatrunError(f"{where}: the bundle key must be at least {MIN_KEY_BYTES} bytes (it has {len(key)}); "
                           "make one with: python -c 'import secrets; print(secrets.token_hex(32))'")
    return key


def canonical(record: dict[str, Any]) -> bytes:
    """The bytes a bundle's signature covers: what it is of (bot, content version, label), when
    it was first published (it orders versions across replicas), and every file."""
    published = record.get("published")
    covered = {
        "bot": str(record.get("bot")),
        "content_version": str(record.get("content_version")),
        "label": str(record.get("label")),
        "published": float(published) if isinstance(published, int | float) else None,
        "files": record.get("files"),
    }
    return b"chatrun-bundle-v1\n" + json.dumps(covered, sort_keys=True, ensure_ascii=False,
                                               separators=(",", ":")).encode("utf-8")


def code_files(files: dict[str, str]) -> list[str]:
    """The files of a bundle that are code a replica would import (handlers)."""
    return sorted(name for name in files if name.endswith(".py"))


def starts_program(config: BotConfig) -> str | None:
    """The `mcp_servers:` entry of a loaded bot that runs a command (a program of the bundle's
    choosing), else None: what a data-only bundle may not have."""
    from chatrun.toolkinds.mcp import McpKind

    servers = config.kind_config.get(McpKind.key, {}) or {}
    return next((name for name, server in servers.items() if getattr(server, "command", None)), None)


def bundle_size(files: dict[str, str]) -> int:
    return sum(len(str(name).encode("utf-8")) + len(str(text).encode("utf-8")) for name, text in files.items())


def megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MB"
