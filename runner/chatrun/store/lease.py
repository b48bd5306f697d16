"""Leases: the right to run one request on a session, and how long they live and wait.

Kept apart from `chatrun.store.aio` (the protocol and the factory) so the stores that grant
leases (`chatrun.store.redis`) import it without importing the factory that imports them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class Lease:
    """The right to run one request on a session. `version`: the stored version when it was
    granted (None: no such session). `lost`: it expired before the request ended. `usage_read`:
    the store read the session's usage record (store/billing.py) in the same round trip that
    granted the lease, after granting it; `usage_record` is its JSON text (None: no record), which
    the request's first attempt takes instead of reading the store (engine/turn.py `open_attempt`)."""

    session_id: str
    token: str | None
    version: str | None
    lost: bool = False
    renewer: asyncio.Task[None] | None = None
    usage_read: bool = False
    usage_record: str | None = None


@dataclass(frozen=True)
class LeaseSettings:
    ttl: float = 10.0  # seconds a lease lives without renewal (renewed every ttl/3 while held)
    wait: float = 60.0  # seconds a request waits in the session's queue before TooManyRequests
    poll: float = 0.02  # longest pause between two looks at the queue while waiting
