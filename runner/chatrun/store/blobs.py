"""The blob area: the bytes of the files users attach, kept beside a store, by session.

A memory keeps an `Attachment` (chatrun.messages), whose `ref` is the SHA-256 of the bytes;
the bytes live here, once per session however often they are sent, and go with the session
(`delete_session`). `MemoryBlobs` serves `memory://`, `FolderBlobs` a folder beside a SQLite
file (`<file>.blobs/`), `RedisBlobs` (store/redis_blobs.py) a Redis store. A store object with
a `blob_area` attribute (any object with BlobArea's methods: an external object store, say)
brings its own (`blobs_of`).

Every built-in area caps what one session keeps (`BlobQuota`): at most `max_blob_files` files
and `max_blob_bytes` bytes, parameters of the store URL (`sqlite:///chat.db?max_blob_files=20`,
docs/deploy.md "Attachments"): a client must not fill the disk or the memory. A put over either
is refused (AttachmentRefused: a 400 naming the cap); the same bytes sent again take nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl

from chatrun.errors import AttachmentRefused, ChatrunError
from chatrun.messages import Attachment
from chatrun.store.urls import shown_url

MAX_BLOB_BYTES_PARAMETER = "max_blob_bytes"
MAX_BLOB_FILES_PARAMETER = "max_blob_files"
BLOB_PARAMETERS = (MAX_BLOB_BYTES_PARAMETER, MAX_BLOB_FILES_PARAMETER)  # a store URL's, on every store
DEFAULT_MAX_BLOB_FILES = 100
DEFAULT_MAX_MEMORY_BLOB_BYTES = 32 * 2**20  # memory:// and Redis: the files are in RAM
DEFAULT_MAX_FOLDER_BLOB_BYTES = 256 * 2**20  # a SQLite file's folder: on disk


class BlobArea(Protocol):
    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        """Keep `data` for the session (once: the same bytes give the same reference)."""
        ...

    def read(self, session_id: str, ref: str) -> bytes | None:
        """The bytes of a reference, or None when the session has no such blob."""
        ...

    def refs(self, session_id: str) -> list[str]:
        """The references the session holds."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Forget every blob of the session."""
        ...


def blob_ref(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BlobQuota:
    """What one session's files may take in a blob area: `max_files` files, `max_bytes` bytes."""

    max_bytes: int
    max_files: int = DEFAULT_MAX_BLOB_FILES

    def check(self, session_id: str, files: int, total: int) -> None:
        """AttachmentRefused, naming the cap, when one more file would make the session hold
        `files` files of `total` bytes together (the store URL's parameter that sets it)."""
        if files > self.max_files:
            raise AttachmentRefused(
                f"session {session_id}: it holds {files - 1} files, the store's limit per session "
                f"({MAX_BLOB_FILES_PARAMETER}={self.max_files} in the store URL)")
        if total > self.max_bytes:
            raise AttachmentRefused(
                f"session {session_id}: its files would take {total} bytes, over the store's limit of "
                f"{self.max_bytes} bytes per session ({MAX_BLOB_BYTES_PARAMETER} in the store URL)")


def blob_quota(url: str, default_bytes: int, shown: str | None = None) -> BlobQuota:
    """The quota a store URL's query sets (`max_blob_bytes`, `max_blob_files`; absent: the
    defaults); ChatrunError for a value that is no positive number (naming the URL as `shown`:
    without its password)."""
    given = dict(parse_qsl(url.partition("?")[2]))
    shown = shown or shown_url(url)
    return BlobQuota(_positive(given.get(MAX_BLOB_BYTES_PARAMETER), default_bytes, "a positive number of bytes", shown),
                     _positive(given.get(MAX_BLOB_FILES_PARAMETER), DEFAULT_MAX_BLOB_FILES, "a positive number", shown))


def _positive(value: str | None, default: int, what: str, url: str) -> int:
    if value is None:
        return default
    if not value.isdigit() or int(value) <= 0:
        name = MAX_BLOB_BYTES_PARAMETER if what.endswith("bytes") else MAX_BLOB_FILES_PARAMETER
        raise ChatrunError(f"store {url}: {name} must be {what}, not {value!r}")
    return int(value)


def local_store_url(url: str) -> str:
    """A memory or SQLite store URL without its query, which may hold only the blob area's
    parameters (ChatrunError naming any other)."""
    base, _, query = url.partition("?")
    for name, _value in parse_qsl(query, keep_blank_values=True):
        if name not in BLOB_PARAMETERS:
            raise ChatrunError(f"store {shown_url(url)}: unknown URL parameter `{name}` (a local store takes "
                               f"{', '.join(BLOB_PARAMETERS)})")
    blob_quota(url, 1)  # its values, checked when the store opens
    return base


class MemoryBlobs:
    """A blob area in this process (for `memory://` stores and tests)."""

    def __init__(self, quota: BlobQuota = BlobQuota(DEFAULT_MAX_MEMORY_BLOB_BYTES)) -> None:  # noqa: B008 - frozen
        self._blobs: dict[str, dict[str, bytes]] = {}
        self.quota = quota

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        held = self._blobs.setdefault(session_id, {})
        if ref not in held:
            self.quota.check(session_id, len(held) + 1, sum(map(len, held.values())) + len(data))
            held[ref] = data
        return Attachment(ref, media_type, name, len(data))

    def read(self, session_id: str, ref: str) -> bytes | None:
        return self._blobs.get(session_id, {}).get(ref)

    def refs(self, session_id: str) -> list[str]:
        return sorted(self._blobs.get(session_id, {}))

    def delete_session(self, session_id: str) -> None:
        self._blobs.pop(session_id, None)


class FolderBlobs:
    """A blob area in a folder: `<root>/<hash of the session id>/<ref>`. The session id is
    hashed because it comes from clients and is no safe file name; a blob is written to a
    temporary file and renamed, so a reader never sees half of one."""

    def __init__(self, root: str | Path,
                 quota: BlobQuota = BlobQuota(DEFAULT_MAX_FOLDER_BLOB_BYTES)) -> None:  # noqa: B008 - frozen
        self.root = Path(root)
        self.quota = quota

    def _folder(self, session_id: str) -> Path:
        return self.root / hashlib.sha256(session_id.encode()).hexdigest()[:32]

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        folder = self._folder(session_id)
        target = folder / ref
        if not target.exists():
            # Counted from the folder itself: what the session holds, however it got there
            # (one server writes a SQLite file's folder: no other put runs between).
            held = [p.stat().st_size for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []
            self.quota.check(session_id, len(held) + 1, sum(held) + len(data))
            folder.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, target)
        return Attachment(ref, media_type, name, len(data))

    def read(self, session_id: str, ref: str) -> bytes | None:
        if len(ref) != 64 or not all(c in "0123456789abcdef" for c in ref):
            return None  # no path of a reference leaves the session's folder
        try:
            return (self._folder(session_id) / ref).read_bytes()
        except FileNotFoundError:
            return None

    def refs(self, session_id: str) -> list[str]:
        folder = self._folder(session_id)
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []

    def delete_session(self, session_id: str) -> None:
        shutil.rmtree(self._folder(session_id), ignore_errors=True)


def blobs_of(store: Any) -> BlobArea | None:
    """The blob area of a store: its own `blob_area` (Redis's, or one an embedding program
    gives its store), else the one beside its URL."""
    own = getattr(store, "blob_area", None)
    return own if own is not None else blobs_for_url(getattr(store, "url", None))


def blobs_for_url(url: str | None) -> BlobArea | None:
    """The blob area beside the store at `url` (memory, a SQLite file's folder): None for
    another URL (a Redis store brings its own: `blobs_of`)."""
    if url is None or url.startswith("memory:"):
        return MemoryBlobs(blob_quota(url or "", DEFAULT_MAX_MEMORY_BLOB_BYTES))
    if url.startswith("sqlite:///"):
        path = local_store_url(url)[len("sqlite:///"):]
        return FolderBlobs(path + ".blobs", blob_quota(url, DEFAULT_MAX_FOLDER_BLOB_BYTES))
    return None
