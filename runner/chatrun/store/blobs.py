"""The blob area: the bytes of the files users attach, kept beside a store, by session.

A memory keeps an `Attachment` (chatrun.messages), whose `ref` is the SHA-256 of the bytes;
the bytes live here, once per session however often they are sent, and go with the session
(`delete_session`). `MemoryBlobs` serves `memory://`, `FolderBlobs` a folder beside a SQLite
file (`<file>.blobs/`), `RedisBlobs` (store/redis_blobs.py) a Redis store. A store object with
a `blob_area` attribute (any object with BlobArea's methods: an external object store, say)
brings its own (`blobs_of`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from chatrun.messages import Attachment


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


class MemoryBlobs:
    """A blob area in this process (for `memory://` stores and tests)."""

    def __init__(self) -> None:
        self._blobs: dict[str, dict[str, bytes]] = {}

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        self._blobs.setdefault(session_id, {}).setdefault(ref, data)
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

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _folder(self, session_id: str) -> Path:
        return self.root / hashlib.sha256(session_id.encode()).hexdigest()[:32]

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        folder = self._folder(session_id)
        target = folder / ref
        if not target.exists():
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
        return MemoryBlobs()
    if url.startswith("sqlite:///"):
        return FolderBlobs(url[len("sqlite:///"):] + ".blobs")
    return None
