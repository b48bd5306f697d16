"""Embeddings for hybrid search: passages and queries embedded through the bot's endpoint.

A source with `embeddings: MODEL` has each passage (its title and text) embedded through the
OpenAI-compatible `/embeddings` of the bot's endpoint (the bot's `model:` base URL and key),
in batches, when the index is refreshed. Vectors are stored, normalised, as float32 blobs in
the index file, keyed by the model and the passage's digest (a hash of its title and text): a
passage whose text did not change is never embedded again, even when its file changed.

A search embeds the query and ranks the passages by cosine (a dot product of unit vectors)
over one model's vectors held in memory (`VectorTable`, read once from the index file and read
again only when its vectors changed). With numpy installed (the `knowledge` extra) they are one
float32 matrix and a query is one matrix-vector product: the ranking costs ~0.6 ms at 1,000
passages of 1,536 dimensions, ~32 ms at 100,000 (CPU; bench/bench_knowledge.py --vectors).
Without it, the cosine runs in pure Python (~50 ms at 1,000, 5 s at 100,000), and the log says
once how to get the fast one. Both give the same ranking, the nearest first, ties to the later passage. sqlite-vec is
not used: this Python's sqlite3 is built without `enable_load_extension`, so it cannot load it.
An ANN index (hnswlib, usearch) would make a query ~1 ms, but building one for 100,000 vectors of
1,536 dimensions took more than 9 minutes on 2 busy cores, and its results are approximate.
`fuse` merges the cosine ranking with BM25's by reciprocal rank fusion.

An endpoint without embeddings (404, 400, no connection, no key) is never a failed turn: the
search uses BM25 alone, one warning is logged, and embeddings are tried again RETRY_AFTER later.
A replayed golden transcript turns them off (`enabled`): it reaches nothing outside the bot, so
its searches rank with BM25 alone, as with a `scripted` model.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import os
import threading
import time
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from chatrun.definition.config import ModelConfig

log = logging.getLogger("chatrun.knowledge")

BATCH = 64  # texts per /embeddings request
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009)
RETRY_AFTER = 300.0  # seconds an endpoint that failed is left alone
DEFAULT_BASE_URL = "https://api.openai.com/v1"
FAST_HOW = "pip install 'chatrun[knowledge]'"  # what installs the fast ranking (numpy)


class EmbeddingsUnavailable(Exception):
    """The endpoint gave no embeddings (the reason is the message)."""


def passage_digest(title: str, text: str) -> str:
    """What a stored vector is keyed by: the embedded text's hash."""
    return hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:32]


def embedded_text(title: str, text: str) -> str:
    """What is embedded of a passage: its title (its headings give context) and its text."""
    return f"{title}\n{text}" if title else text


def unit(vector: Sequence[float]) -> array:
    """`vector` scaled to length 1, as float32 (so a dot product is the cosine)."""
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return array("f", (x / norm for x in vector))


def to_blob(vector: array) -> bytes:
    return vector.tobytes()


def from_blob(blob: bytes) -> array:
    out = array("f")
    out.frombytes(blob)
    return out


def dot(a: array, b: array) -> float:
    return sum(map(operator.mul, a, b))


def numpy_or_none() -> Any:
    """numpy, for the fast ranking, or None when it is not installed."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


_said: set[str] = set()  # what was logged once per process


def _say_once(key: str, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


def _chunks(rows: Iterable[Any], size: int) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class VectorTable:
    """One model's passage vectors, held in memory for ranking: (passage id, source, vector) rows
    as read from the index. `fast` (the default) keeps them as one float32 numpy matrix when numpy
    is installed; else (or `fast=False`) as arrays ranked in pure Python, the same ranking."""

    def __init__(self, model: str, rows: Iterable[tuple[int, str, bytes]], count: int, fast: bool = True):
        self.model = model
        self.dimensions = 0  # the vectors' length (from the first; a row of another length is left out)
        self.size = 0
        np = numpy_or_none() if fast else None
        self.fast = np is not None
        if np is not None:
            self._load_matrix(np, rows, count)
        else:
            self._load_arrays(rows)
            if fast:  # wanted fast, and numpy is missing
                _say_once("pure", "knowledge: ranking the vectors of embeddings (model %s, %d passages) in pure "
                          "Python, ~50 ms a query per 1,000 passages; for the fast ranking (numpy: 100x faster) "
                          "install it: %s", model, self.size, FAST_HOW)

    def _load_matrix(self, np: Any, rows: Iterable[tuple[int, str, bytes]], count: int) -> None:
        """The rows into a float32 matrix allocated once (`count` rows at most: a copy of 100,000
        vectors of 1,536 dimensions would cost 600 MB more), a thousand rows at a time (one numpy
        call per row made loading 100,000 take 3.5 s, not 1.2 s)."""
        codes: dict[str, int] = {}
        ids = np.empty(count, dtype=np.int64)
        sources = np.empty(count, dtype=np.int32)
        matrix = np.empty((count, 0), dtype=np.float32)
        for chunk in _chunks(rows, 1000):
            if self.dimensions == 0:
                self.dimensions = len(chunk[0][2]) // 4
                matrix = np.empty((count, self.dimensions), dtype=np.float32)
            chunk = [row for row in chunk if len(row[2]) == self.dimensions * 4 or self._odd(len(row[2]) // 4)]
            chunk = chunk[:count - self.size]  # more rows than counted: not one read transaction (KnowledgeIndex.vectors)
            end = self.size + len(chunk)
            matrix[self.size:end] = np.frombuffer(b"".join(row[2] for row in chunk), dtype=np.float32).reshape(
                len(chunk), self.dimensions)
            ids[self.size:end] = [row[0] for row in chunk]
            sources[self.size:end] = [codes.setdefault(row[1], len(codes)) for row in chunk]
            self.size = end
        self._names = list(codes)
        self._np, self._matrix, self._ids, self._sources = np, matrix[:self.size], ids[:self.size], sources[:self.size]

    def _load_arrays(self, rows: Iterable[tuple[int, str, bytes]]) -> None:
        self._rows: list[tuple[int, str, array]] = []
        for pid, source, blob in rows:
            if self.dimensions == 0:
                self.dimensions = len(blob) // 4
            if len(blob) != self.dimensions * 4:
                self._odd(len(blob) // 4)
                continue
            self._rows.append((pid, source, from_blob(blob)))
        self.size = len(self._rows)

    def _odd(self, length: int) -> bool:
        """Said once: a vector of another length than the first (left out: False)."""
        _say_once(f"odd {self.model}", "knowledge: model %s gave vectors of %d and of %d dimensions; those of %d are "
                  "left out until `chatrun index` embeds them again", self.model, self.dimensions, length, length)
        return False

    def nearest(self, query: array, sources: Sequence[str], n: int) -> list[tuple[float, int]]:
        """(cosine, passage id) of the `n` passages of `sources` nearest `query` (a unit vector),
        nearest first; of equal ones, the later passage (higher id) first."""
        if len(query) != self.dimensions:
            if self.size:
                _say_once(f"query {self.model}", "knowledge: model %s embedded the query in %d dimensions, its "
                          "passages in %d; searching with BM25 alone until `chatrun index` embeds them again",
                          self.model, len(query), self.dimensions)
            return []
        if not self.fast:
            wanted = set(sources)
            return sorted(((dot(query, v), pid) for pid, source, v in self._rows if source in wanted), reverse=True)[:n]
        return self._nearest_matrix(query, sources, n)

    def _nearest_matrix(self, query: array, sources: Sequence[str], n: int) -> list[tuple[float, int]]:
        np = self._np
        codes = [code for code, name in enumerate(self._names) if name in set(sources)]
        if not codes or n <= 0:
            return []
        # einsum's own loop, not BLAS (`@`): BLAS's threads spin for a matrix-vector product, 50x the
        # CPU at 1,000 passages on a busy machine, and einsum is as fast on one core at 100,000.
        scores = np.einsum("ij,j->i", self._matrix, np.frombuffer(query, dtype=np.float32))
        if len(codes) < len(self._names):  # a route reading some of the model's sources only
            scores[~np.isin(self._sources, codes)] = -np.inf
        n = min(n, int(np.count_nonzero(scores > -np.inf)))
        if n == 0:
            return []
        if n < len(scores):  # the n best, and every one equal to the n-th (ties go to the later passage)
            least = np.partition(scores, len(scores) - n)[len(scores) - n]
            candidates = np.flatnonzero(scores >= least)
        else:
            candidates = np.arange(len(scores))
        best = candidates[np.lexsort((-self._ids[candidates], -scores[candidates]))][:n]
        return [(float(scores[i]), int(self._ids[i])) for i in best]


class Embedder:
    """The bot's endpoint, asked for embeddings (the real `openai` client, synchronous: the
    index is refreshed and searched off the event loop)."""

    def __init__(self, model: ModelConfig | None):
        self.model = model
        self.requests = 0  # /embeddings requests sent (tests and the bench count them)
        self.enabled = True  # False: no request (a replayed transcript reaches nothing outside the bot)
        self._client: Any = None
        self._down_until = 0.0
        self.down: str | None = None  # why the last request for embeddings failed (None: it answered); /health
        self._lock = threading.Lock()

    def endpoint(self) -> tuple[str, str]:
        """(base URL, API key), or EmbeddingsUnavailable saying what is missing."""
        model = self.model
        if model is None or model.provider != "openai":
            raise EmbeddingsUnavailable(f"the bot's model provider is `{model.provider if model else 'none'}`, "
                                        "not an OpenAI-compatible endpoint")
        base_url = model.base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = os.environ.get(model.api_key_env or "OPENAI_API_KEY") or None
        if api_key is None and base_url is None:
            raise EmbeddingsUnavailable(f"no credentials: {model.api_key_env or 'OPENAI_API_KEY'} is not set")
        return (base_url or DEFAULT_BASE_URL).rstrip("/"), api_key or "chatrun-no-key"

    def client(self) -> Any:
        if self._client is None:
            import openai

            base_url, api_key = self.endpoint()
            timeout = self.model.timeout if self.model else 60.0
            self._client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=1, timeout=timeout)
        return self._client

    def embed(self, name: str, texts: Sequence[str]) -> list[array]:
        """Unit vectors of `texts` from model `name`, in order (EmbeddingsUnavailable: none)."""
        if not self.enabled:
            raise EmbeddingsUnavailable("embeddings are off in a replayed transcript")
        if time.monotonic() < self._down_until:
            raise EmbeddingsUnavailable("the endpoint failed lately")
        out: list[array] = []
        try:
            for start in range(0, len(texts), BATCH):
                out += self._batch(name, list(texts[start:start + BATCH]))
        except EmbeddingsUnavailable as exc:
            self._went_down(name, str(exc))
            raise
        self.down = None
        return out

    def _batch(self, name: str, texts: list[str]) -> list[array]:
        import openai

        with self._lock:
            self.requests += 1
        try:
            answer = self.client().embeddings.create(model=name, input=texts)
        except openai.APIStatusError as exc:
            raise EmbeddingsUnavailable(f"HTTP {exc.status_code}: {exc.message}") from None
        except openai.APIError as exc:  # no connection, a timeout, a body that is not JSON
            raise EmbeddingsUnavailable(f"{type(exc).__name__}: {exc}") from None
        data = sorted(answer.data, key=lambda item: item.index)
        if len(data) != len(texts):
            raise EmbeddingsUnavailable(f"{len(data)} embeddings for {len(texts)} texts")
        return [unit(item.embedding) for item in data]

    def _went_down(self, name: str, reason: str) -> None:
        """One warning per outage; no request for RETRY_AFTER seconds."""
        with self._lock:
            self._down_until = time.monotonic() + RETRY_AFTER
            self.down = f"model {name}: {reason}"
        where = self.model.base_url if self.model and self.model.base_url else "the bot's endpoint"
        log.warning("knowledge: no embeddings from %s for model %s (%s); searching with BM25 alone, trying again "
                    "in %d s", where, name, reason, RETRY_AFTER)


def fuse(rankings: Sequence[Sequence[Any]], k: int, key: Any) -> list[tuple[Any, float]]:
    """Reciprocal rank fusion: each item scores the sum of 1 / (RRF_K + rank) over the rankings
    it is in (rank from 1); the `k` best, with their scores. `key(item)` says which are the same."""
    scores: dict[Any, float] = {}
    items: dict[Any, Any] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            ident = key(item)
            items.setdefault(ident, item)
            scores[ident] = scores.get(ident, 0.0) + 1.0 / (RRF_K + rank)
    best = sorted(scores, key=lambda ident: -scores[ident])[:k]
    return [(items[ident], scores[ident]) for ident in best]
