"""The `webhook:` sink: one backend event POSTed as JSON, signed with HMAC-SHA256.

    POST <url>
    Content-Type: application/json
    Chatrun-Event-Id: evt_...          the idempotency key (also Idempotency-Key)
    Chatrun-Event-Type: Detractor
    Chatrun-Timestamp: 1764032400      Unix seconds when this attempt was signed
    Chatrun-Signature: v1=<hex>        HMAC-SHA256(secret, f"{timestamp}.{raw body}"), hex
    Chatrun-Attempt: 1

    {"id": "evt_...", "type": "Detractor", "data": ..., "turn": 3, "session": "...",
     "bot": "survey", "created": 1764032399.5}

A receiver verifies the signature over the raw body bytes, rejects an old timestamp (replays)
and de-duplicates on the event id (docs/deploy.md, "Webhook delivery", has a tested example).
Any 2xx answer is a delivery; anything else (another status, a timeout, no connection) is a
failed attempt, retried by the outbox worker (chatrun.server.outbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from chatrun import __version__
from chatrun.definition.config import BotConfig, WebhookConfig
from chatrun.definition.templates import ENV
from chatrun.errors import ChatrunError
from chatrun.toolkinds.http import Environment, redact_text, retry_after

SIGNATURE_VERSION = "v1"
DRAIN_BYTES = 64 * 1024  # of a receiver's answer, read only to keep its connection (the status is the answer)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `Chatrun-Signature` header's value for a body signed at `timestamp`."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


def encode_body(body: dict[str, Any]) -> bytes:
    """The request body: compact JSON, UTF-8 (the bytes the signature covers)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class Attempt:
    """How one delivery attempt went: delivered (a 2xx), else why not (for the dead letter)."""

    delivered: bool
    error: str | None = None
    status: int | None = None
    retry_after: float | None = None  # seconds the receiver asked to wait (a 429's or 503's Retry-After), or None


class WebhookSender:
    """POSTs events to the webhooks of the served bots, one HTTP client for all of them."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def send(self, config: BotConfig, hook: WebhookConfig, body: dict[str, Any], attempt: int) -> Attempt:
        try:
            url, headers = _request(config, hook, body, attempt)
            raw = encode_body(body)
            if hook.secret is not None:
                timestamp = int(headers["Chatrun-Timestamp"])
                headers["Chatrun-Signature"] = signature(_secret(config, hook.secret), timestamp, raw)
        except ChatrunError as exc:  # an unset variable: the error names it, never a value
            return Attempt(False, str(exc))
        shown = _shown(url, Environment(config.env).secrets())
        try:
            response = await self._post(url, raw, headers, hook.timeout)
        except (httpx.TimeoutException, TimeoutError):
            return Attempt(False, f"{shown}: no answer within {hook.timeout:g} s (the webhook's `timeout`)")
        except httpx.HTTPError as exc:
            return Attempt(False, f"{shown}: cannot connect ({type(exc).__name__})")
        except (httpx.InvalidURL, ValueError) as exc:  # an env value made the URL or a header unusable
            return Attempt(False, f"{shown}: the request cannot be made ({unusable(exc)})")
        status = response.status_code
        if 200 <= status < 300:
            return Attempt(True, status=status)
        # a receiver's `Retry-After` (a 429, a 503) is waited, as a channel's is (outbox.next_attempt)
        return Attempt(False, f"{shown} answered {status}", status, retry_after(response))

    async def _post(self, url: str, raw: bytes, headers: dict[str, str], timeout: float) -> httpx.Response:
        """POST the body; the receiver's answer (closed: its status and headers), which must come
        within `timeout` seconds in all (httpx's timeout is per read: a receiver trickling its
        headers in would hold the attempt past its claim, and another replica would send the event
        again meanwhile). The answer's
        body means nothing: at most DRAIN_BYTES of it are read, in what is left of the time, so
        that the connection can serve the next attempt; a bigger or slower one closes it."""
        client = self.client()
        request = client.build_request("POST", url, content=raw, headers=headers, timeout=timeout)
        async with asyncio.timeout(timeout) as limit:
            response = await client.send(request, stream=True)
        try:
            with contextlib.suppress(TimeoutError, httpx.HTTPError):
                async with asyncio.timeout_at(limit.when()):
                    drained = 0
                    async for chunk in response.aiter_raw():
                        drained += len(chunk)
                        if drained > DRAIN_BYTES:
                            break
        finally:
            await response.aclose()
        return response


def _request(config: BotConfig, hook: WebhookConfig, body: dict[str, Any], attempt: int) -> tuple[str, dict[str, str]]:
    """The URL and headers of an attempt (templates over `env`); ChatrunError names an unset variable."""
    env = {"env": Environment(config.env)}
    url = ENV.from_string(hook.url).render(env)
    headers = {name: ENV.from_string(value).render(env) for name, value in hook.headers.items()}
    headers = {name: value for name, value in headers.items() if value and value != "None"}
    headers.update({
        "Content-Type": "application/json",
        "User-Agent": f"chatrun/{__version__}",
        "Chatrun-Event-Id": body["id"],
        "Idempotency-Key": body["id"],
        "Chatrun-Event-Type": str(body["type"]),
        "Chatrun-Timestamp": str(int(time.time())),
        "Chatrun-Attempt": str(attempt),
    })
    return url, headers


def _secret(config: BotConfig, name: str) -> str:
    var = config.env.get(name)
    secret = os.environ.get(name, var.default if var is not None else None)
    if not secret:
        raise ChatrunError(f"the webhook's secret `env.{name}` is not set (and has no `default`); "
                           "nothing is sent unsigned")
    return secret


def unusable(exc: Exception) -> str:
    """Why httpx would not make a request: an invalid URL's reason, or only the kind of a value
    error (a header's character HTTP cannot carry: its message would show part of a secret)."""
    if isinstance(exc, (httpx.InvalidURL, httpx.UnsupportedProtocol)):  # (names the scheme, no more of the URL)
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: a header or the URL holds a character HTTP cannot carry"


def _shown(url: str, secrets: tuple[str, ...]) -> str:
    """The URL for an error message (a dead letter's, the log's): no query (it may carry a
    token), and the values of `secret: true` variables redacted (a URL that is itself the
    secret, as a chat platform's incoming webhook is)."""
    return redact_text(url.split("?", 1)[0], secrets)
