"""Telegram (the Bot API): a webhook set with a `secret_token`, which Telegram sends back in
the X-Telegram-Bot-Api-Secret-Token header; `message` updates with text, `callback_query`
updates for inline-keyboard presses; replies by sendMessage with an inline keyboard.

A private chat or a group: the conversation is the chat and the sender (each member of a
group has their own); the principal is `telegram:<user id>`; an update's `update_id` is the
delivery (Telegram sends an unacknowledged update again with the same id)."""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Mapping
from typing import Any

import httpx

from chatrun.server.channels.base import (
    ChannelKind,
    FetchFailed,
    Inbound,
    InboundFile,
    Outgoing,
    SendFailed,
    Unauthorized,
    media_type_of,
)

DEFAULT_API = "https://api.telegram.org"
SECRET_HEADER = "x-telegram-bot-api-secret-token"
MAX_CALLBACK_BYTES = 64  # Telegram's limit on a button's callback_data
MAX_TEXT = 4096  # Telegram's limit on a message's text (a longer reply is several messages: ChannelKind.fitted)


class Telegram(ChannelKind):
    kind = "telegram"
    max_text = MAX_TEXT

    def text_size(self, text: str) -> int:
        return len(text.encode("utf-16-le")) // 2  # the Bot API counts UTF-16 code units (an emoji: 2)

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        sent = headers.get(SECRET_HEADER, "")
        if not sent or not hmac.compare_digest(sent.encode(), self.secret("secret").encode()):
            raise Unauthorized(f"telegram: the {SECRET_HEADER} header is missing or wrong")

    def sequence_scope(self) -> str:
        """The Telegram bot (its id, the token's part before the colon): update_ids increase per bot."""
        return f"{self.kind}:{self.secret('token').partition(':')[0]}"

    def inbound(self, payload: Any) -> list[Inbound]:
        return [dataclasses.replace(message, sequence=payload["update_id"]) for message in self._messages(payload)]

    def _messages(self, payload: Any) -> list[Inbound]:
        if not isinstance(payload, dict) or not isinstance(payload.get("update_id"), int):
            return []
        delivery = str(payload["update_id"])
        message, query = payload.get("message"), payload.get("callback_query")
        if isinstance(message, dict) and isinstance(message.get("text"), str):
            return [_inbound(delivery, message, message.get("from"), message["text"])]
        if isinstance(message, dict) and (files := _files(message)):  # a photo or a document, its caption the text
            return [_inbound(delivery, message, message.get("from"), str(message.get("caption") or ""), files=files)]
        if isinstance(query, dict) and isinstance(query.get("message"), dict) and isinstance(query.get("data"), str):
            return [_inbound(delivery, query["message"], query.get("from"), query["data"],
                             {"callback_query_id": query.get("id")}, pressed=True)]
        edit = payload.get("edited_message")
        if isinstance(edit, dict) and isinstance(edit.get("text") or edit.get("caption"), str):
            # Told once per edited message (its chat and message_id), however often it is edited.
            chat = (edit.get("chat") or {}).get("id")
            return [dataclasses.replace(_inbound(f"edited:{chat}:{edit.get('message_id')}", edit, edit.get("from"),
                                                 str(edit.get("text") or edit.get("caption"))), edited=True)]
        return []  # a join, a sticker, a channel's post or its edit...: nothing for the bot to answer

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        body: dict[str, Any] = {"chat_id": address["chat_id"], "text": message.text}
        if message.buttons:
            body["reply_markup"] = {"inline_keyboard": [[{"text": label, "callback_data": _callback(label, value)}]
                                                        for label, value in message.buttons]}
        await self._call(client, "sendMessage", body)

    async def after(self, client: httpx.AsyncClient, inbound: Inbound) -> None:
        query = inbound.extra.get("callback_query_id")
        if query:  # stops the button's spinner
            await self._call(client, "answerCallbackQuery", {"callback_query_id": query})

    async def fetch(self, client: httpx.AsyncClient, file: InboundFile, limit: int) -> bytes:
        """getFile names the file's path; its bytes are at /file/bot<token>/<path>."""
        try:
            found = (await self._call(client, "getFile", {"file_id": file.ref})).get("result") or {}
        except SendFailed as exc:
            raise FetchFailed(str(exc)) from None
        if isinstance(found.get("file_size"), int) and found["file_size"] > limit:
            raise FetchFailed(f"telegram getFile: the file is {found['file_size']} bytes, over {limit}", too_large=True)
        if not isinstance(found.get("file_path"), str):
            raise FetchFailed("telegram getFile: no file_path (a file over the Bot API's 20 MB is not downloadable)")
        url = f"{self.option('api', DEFAULT_API).rstrip('/')}/file/bot{self.secret('token')}/{found['file_path']}"
        return await self.download(client, url, limit, "file download")

    async def _call(self, client: httpx.AsyncClient, method: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.option('api', DEFAULT_API).rstrip('/')}/bot{self.secret('token')}/{method}"
        response = await self.call(client, "POST", url, f"telegram {method}", "the Bot API", json=body)
        if response.status_code != 200:
            raise SendFailed.answered(f"telegram {method}: the Bot API answered {response.status_code}: "
                                      f"{response.text[:200]}", response)
        try:
            answer = response.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}


def _inbound(delivery: str, message: dict[str, Any], sender: Any, text: str,
             extra: dict[str, Any] | None = None, files: tuple[InboundFile, ...] = (), pressed: bool = False) -> Inbound:
    chat = message.get("chat") or {}
    sender = sender if isinstance(sender, dict) else {}
    user = str(sender.get("id", chat.get("id")))
    name = " ".join(str(sender[k]) for k in ("first_name", "last_name") if sender.get(k))
    return Inbound(delivery, f"{chat.get('id')}:{user}", user, text, {"chat_id": chat.get("id")}, name,
                   sender.get("language_code"), extra or {}, files, pressed)


# The media a message may carry, and the media type of each when Telegram names none.
MEDIA = {"document": "application/octet-stream", "audio": "audio/mpeg", "voice": "audio/ogg", "video": "video/mp4"}


def _files(message: dict[str, Any]) -> tuple[InboundFile, ...]:
    """A message's photo (its largest size: Telegram sends photos as JPEG) or document, audio, voice, video."""
    photo = message.get("photo")
    if isinstance(photo, list) and photo and isinstance(photo[-1], dict):
        size = photo[-1].get("file_size")
        return (InboundFile(str(photo[-1].get("file_id")), "image/jpeg", "photo.jpg",
                            size if isinstance(size, int) else None),)
    for key, default in MEDIA.items():
        media = message.get(key)
        if isinstance(media, dict) and media.get("file_id"):
            size = media.get("file_size")
            return (InboundFile(str(media["file_id"]), media_type_of(media.get("mime_type"), default),
                                str(media.get("file_name") or ""), size if isinstance(size, int) else None),)
    return ()


def _callback(label: str, value: str) -> str:
    """A button's callback_data: what a press sends as the user's message. The value, or its
    label when the value is over Telegram's 64 bytes (a question's labels are answers too)."""
    for text in (value, label):
        if len(text.encode()) <= MAX_CALLBACK_BYTES:
            return text
    return value.encode()[:MAX_CALLBACK_BYTES].decode(errors="ignore")
