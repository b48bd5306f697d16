"""A webhook receiver that misbehaves, served for real on loopback: one that trickles its
answer's headers in (the attempt must end within the webhook's `timeout`, or it outlives its
outbox claim and another replica sends the event again meanwhile), and one that answers 2xx
with a huge body (its status is the answer: the body is not read); and a webhook URL that is a
secret."""

from __future__ import annotations

import asyncio
import socket
import threading

import chatrun
from chatrun.definition.config import BotConfig, RetryPolicy
from chatrun.server.outbox import next_attempt
from chatrun.server.webhook import Attempt, WebhookSender
from webhook_support import SECRET, Receiver, survey_bot

BODY = {"id": "evt_1", "type": "Detractor", "data": 1, "turn": 1, "session": "s", "bot": "survey", "created": 1.0}
HUGE = 40_000_000  # bytes of the huge answer's body


class RawReceiver:
    """Answers each connection with `answer(connection)` after reading the request's headers
    and body; counts the bytes of the answer it could write."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.written = 0
        self.done = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self._read_request(conn)
                try:
                    self._answer(conn)
                except OSError:  # the sender hung up: what it did not read is not written
                    pass

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += conn.recv(65536)

    def _answer(self, conn: socket.socket) -> None:
        if self.mode == "trickle":  # the status line, then a header a byte at a time for 8 s
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for byte in b"X-Slow: " + b"y" * 32 + b"\r\nContent-Length: 0\r\n\r\n":
                if self.done.wait(0.2):
                    return
                conn.sendall(bytes([byte]))
            return
        if self.mode == "busy":
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n")
            return
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE}\r\n\r\n".encode())
        chunk = b"x" * 1_000_000
        for _ in range(HUGE // len(chunk)):
            conn.sendall(chunk)
            self.written += len(chunk)

    def __enter__(self) -> RawReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.sock.close()


def attempt(receiver: RawReceiver, tmp_path, monkeypatch, timeout: float) -> Attempt:
    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(survey_bot("provider: scripted", timeout=timeout))
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    return asyncio.run(send(chatrun.load_bot(bot_file).config))


async def send(config: BotConfig) -> Attempt:
    sender = WebhookSender()
    try:
        return await sender.send(config, config.sinks["crm"].webhook, BODY, 1)
    finally:
        await sender.aclose()


def test_a_receiver_trickling_its_answer_in_fails_the_attempt_within_the_timeout(tmp_path, monkeypatch):
    with RawReceiver("trickle") as receiver:
        failed = attempt(receiver, tmp_path, monkeypatch, timeout=0.5)
    assert not failed.delivered
    assert failed.error == f"{receiver.url}/hooks/chatrun: no answer within 0.5 s (the webhook's `timeout`)"


def test_a_2xx_with_a_huge_body_is_a_delivery_and_the_body_is_not_read(tmp_path, monkeypatch):
    with RawReceiver("huge") as receiver:
        delivered = attempt(receiver, tmp_path, monkeypatch, timeout=20)
    assert delivered.delivered and delivered.status == 200
    assert receiver.written < HUGE  # the sender hung up: it did not take 40 MB in


def test_a_webhook_url_that_is_a_secret_is_redacted_from_the_failed_attempts_error(tmp_path, monkeypatch):
    """An incoming webhook of a chat platform is a URL that is itself the secret: a failed
    attempt's error (a dead letter's in GET /outbox, the log's) names it redacted."""
    with Receiver(status=500) as receiver:
        bot_file = tmp_path / "bot.yaml"
        bot_file.write_text(survey_bot("provider: scripted").replace("HOOK_URL: {}", "HOOK_URL: {secret: true}"))
        monkeypatch.setenv("HOOK_URL", receiver.url)
        monkeypatch.setenv("HOOK_SECRET", SECRET)
        config = chatrun.load_bot(bot_file).config
        failed = asyncio.run(send(config))
        assert len(receiver.seen()) == 1
    assert failed.error == "[redacted]/hooks/chatrun answered 500" and receiver.url not in failed.error


def test_a_receivers_retry_after_is_carried_to_the_outbox(tmp_path, monkeypatch):
    """A 503 with `Retry-After: 7`: the attempt carries the 7 s, which outbox.next_attempt waits
    at least (capped at max_backoff), as it does for a channel's platform."""
    with RawReceiver("busy") as receiver:
        failed = attempt(receiver, tmp_path, monkeypatch, timeout=5)
    assert not failed.delivered and failed.status == 503 and failed.retry_after == 7.0
    policy = RetryPolicy(backoff=0.01, max_backoff=60)
    assert next_attempt(policy, 1, 1000.0, failed.retry_after) >= 1007.0
