"""What a Redis error says once it leaves the store: the command and the error's kind, never
Redis's own text.

Redis's error texts may quote what was written (`ERR unknown command 'x', with args beginning
with: ...`), and redis-py's annotation of a failed pipeline command quotes the whole command,
values included (`Command # 1 (SET rec:k {"email": ...}) of pipeline caused error: ...`). A
session's state or a message must reach no log and no HTTP error through them, so the store's
clients (`RedactingRedis`, `RedactingSyncRedis`) turn every error reply into a `ChatrunError`
naming the store, the command (`SET`, `EVALSHA`) and the kind (`OOM`, `WRONGTYPE`, `ERR`), with
what to do. NOSCRIPT passes untouched: redis-py answers it itself by loading the script.
"""

from __future__ import annotations

import re
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.client import Pipeline
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ExecAbortError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

from chatrun.errors import ChatrunError

# The kinds redis-py turns into classes of their own (it drops the code from the text).
_KINDS: tuple[tuple[type[Exception], str], ...] = (
    (OutOfMemoryError, "OOM"), (ReadOnlyError, "READONLY"), (NoPermissionError, "NOPERM"),
    (BusyLoadingError, "LOADING"), (ExecAbortError, "EXECABORT"), (AuthenticationError, "NOAUTH"),
)
_WHAT_TO_DO = {
    "OOM": "Redis is over its maxmemory: raise its maxmemory, or free memory",
    "WRONGTYPE": "a key under the store's prefix holds another kind of value: does another program "
                 "write under the same prefix?",
    "READONLY": "this Redis is a read-only replica: point the store URL at the primary",
    "NOPERM": "the Redis user may not run it: grant the command to the user (ACL)",
    "NOAUTH": "Redis wants a password: put it in the URL or CHATRUN_REDIS_PASSWORD",
    "LOADING": "Redis is loading its data set: try again in a moment",
    "BUSY": "Redis is running a long script: try again in a moment",
}
_CODE = re.compile(r"[A-Z]{2,}")


def error_kind(exc: ResponseError) -> str:
    """`OOM`, `WRONGTYPE`, `ERR`...: the error's code, read from its class or its text's first word."""
    for cls, code in _KINDS:
        if isinstance(exc, cls):
            return code
    first = str(exc.args[0] if exc.args else "").split(" ", 1)[0]
    return first if _CODE.fullmatch(first) else "ERR"


def refused(store: str, command: object, exc: ResponseError) -> ChatrunError:
    """The error a caller sees for Redis's error reply `exc` to `command` (its name only)."""
    name = command.decode() if isinstance(command, bytes) else str(command)
    kind = error_kind(exc)
    advice = _WHAT_TO_DO.get(kind, "Redis's own text is not shown (it may quote the values written): "
                                   "see the Redis server's log")
    return ChatrunError(f"store {store}: Redis refused {name.split(' ', 1)[0].upper()} ({kind}): {advice}")


class _RedactingPipeline(Pipeline):
    """A pipeline whose failure names its failed command, not the command's values."""

    store = ""

    def annotate_exception(self, exception: Exception, number: int, command: Any) -> None:
        exception.chatrun_command = next(iter(command), "MULTI")  # type: ignore[attr-defined]

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except ResponseError as exc:
            raise refused(self.store, getattr(exc, "chatrun_command", "EXEC"), exc) from None


class _OfStore:
    """A client made for a store (`for_store`): its errors name the store."""

    store = ""

    @classmethod
    def for_store(cls, pool: Any, store: str) -> Any:
        """A client of `pool` (closed with it) whose errors name `store`, the URL as shown."""
        client = cls(connection_pool=pool)  # type: ignore[call-arg]
        client.auto_close_connection_pool = True  # type: ignore[attr-defined]
        client.store = store
        return client


# (mypy checks a class of two bases against both: redis.asyncio.Redis's own bases disagree on command_info)
class RedactingRedis(redis.asyncio.Redis, _OfStore):  # type: ignore[misc]
    """The store's asyncio client (`for_store`)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except NoScriptError:
            raise
        except ResponseError as exc:
            raise refused(self.store, args[0], exc) from None

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = _RedactingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.store = self.store
        return pipe


class RedactingSyncRedis(redis.Redis, _OfStore):
    """The attached files' (blocking) client (`for_store`)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except NoScriptError:
            raise
        except ResponseError as exc:
            raise refused(self.store, args[0], exc) from None


__all__ = ["RedactingRedis", "RedactingSyncRedis", "error_kind", "refused"]
