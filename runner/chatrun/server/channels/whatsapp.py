"""WhatsApp (the Cloud API's webhooks): Meta checks the URL once with a GET carrying
hub.mode=subscribe, hub.verify_token (the channel's `verify_token`) and hub.challenge, which
is answered; every POST is signed with the app secret (X-Hub-Signature-256: "sha256=" and the
HMAC-SHA256 of the raw body). `messages` changes carry the user's texts and their presses of
interactive reply buttons and list rows; `statuses` changes (sent, delivered, read) are not
messages. Replies are POST /PHONE_NUMBER_ID/messages: text, or an interactive message with up
to 3 reply buttons (a list of up to 10 rows beyond that).

A conversation is the user's phone number on the business number; the principal is
`whatsapp:<wa_id>`; the delivery is the message's `wamid` (Meta sends a webhook again with the
same one when it was not answered with 200). WhatsApp lets a business write first, or more
than 24 hours after the user's last message, only with a pre-approved template: a route's
`follow_up:` past that window is sent as its `whatsapp_template` (a template message) or refused
(engine/follow_up.py; docs/channels.md)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import httpx

from chatrun.definition.page_texts import page_texts
from chatrun.server.channels.base import (
    ChannelKind,
    FetchFailed,
    Inbound,
    InboundFile,
    Outgoing,
    SendFailed,
    Unauthorized,
    epoch_seconds,
    media_type_of,
)

DEFAULT_API = "https://graph.facebook.com/v21.0"
MAX_BUTTONS = 3  # reply buttons of one interactive message
MAX_ROWS = 10  # rows of one interactive list
MAX_TITLE = 20  # characters of a button's title
MAX_ROW_TITLE = 24  # characters of a list row's title
MAX_TEXT = 4096  # characters of a text message's body (a longer reply is several: ChannelKind.fitted)
MAX_BODY = 1024  # characters of an interactive message's body (the one with buttons)


class WhatsApp(ChannelKind):
    kind = "whatsapp"
    max_text, max_button_text = MAX_TEXT, MAX_BODY

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        sent = headers.get("x-hub-signature-256", "")
        expected = "sha256=" + hmac.new(self.secret("app_secret").encode(), body, hashlib.sha256).hexdigest()
        if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
            raise Unauthorized("whatsapp: the X-Hub-Signature-256 header is missing or wrong")

    def subscribe(self, query: Mapping[str, str]) -> str | None:
        token = query.get("hub.verify_token", "")
        if query.get("hub.mode") == "subscribe" and token and \
                hmac.compare_digest(token.encode(), self.secret("verify_token").encode()):
            return query.get("hub.challenge", "")
        return None

    def inbound(self, payload: Any) -> list[Inbound]:
        out: list[Inbound] = []
        if not isinstance(payload, dict) or payload.get("object") != "whatsapp_business_account":
            return out
        for entry in payload.get("entry") or ():
            for change in (entry or {}).get("changes") or ():
                value = (change or {}).get("value") or {}
                names = {c.get("wa_id"): (c.get("profile") or {}).get("name", "") for c in value.get("contacts") or ()}
                number = (value.get("metadata") or {}).get("phone_number_id")
                for message in value.get("messages") or ():
                    if message.get("type") == "edit" and number:
                        out.extend(_edit(message, number, names))
                        continue
                    text, files = _text(message), _files(message)
                    if files:
                        text = str(message[message["type"]].get("caption") or "")
                    if text is not None and number:
                        user = str(message.get("from"))
                        out.append(Inbound(message.get("id"), f"{number}:{user}", user, text,
                                           {"phone_number_id": number, "to": user}, names.get(user, ""),
                                           files=files, pressed=message.get("type") in ("interactive", "button"),
                                           sent=epoch_seconds(message.get("timestamp"))))
        return out

    async def fetch(self, client: httpx.AsyncClient, file: InboundFile, limit: int) -> bytes:
        """GET /MEDIA_ID names the media's URL (and size); the URL is read with the same token."""
        auth = {"Authorization": f"Bearer {self.secret('token')}"}
        try:
            response = await self.call(client, "GET", f"{self.option('api', DEFAULT_API).rstrip('/')}/{file.ref}",
                                       "whatsapp media", "the Cloud API", headers=auth)
        except SendFailed as exc:
            raise FetchFailed(str(exc)) from None
        found = response.json() if response.status_code == 200 else {}
        if not isinstance(found, dict) or not isinstance(found.get("url"), str):
            raise FetchFailed(f"whatsapp media {file.ref}: the Cloud API answered {response.status_code}: "
                              f"{response.text[:200]}")
        if isinstance(found.get("file_size"), int) and found["file_size"] > limit:
            raise FetchFailed(f"whatsapp media: the file is {found['file_size']} bytes, over {limit}", too_large=True)
        return await self.download(client, found["url"], limit, "media download", auth)

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        body: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": address["to"]}
        text = message.text
        if message.whatsapp_template is not None:
            name, language = message.whatsapp_template
            body |= {"type": "template", "template": {"name": name, "language": {"code": language}}}
        elif not message.buttons:
            body |= {"type": "text", "text": {"body": text}}
        elif len(message.buttons) <= MAX_BUTTONS:
            body |= {"type": "interactive", "interactive": {"type": "button", "body": {"text": text}, "action": {
                "buttons": [{"type": "reply", "reply": {"id": value[:256], "title": label[:MAX_TITLE]}}
                            for label, value in message.buttons]}}}
        else:
            rows = [{"id": value[:200], "title": label[:MAX_ROW_TITLE]} for label, value in message.buttons[:MAX_ROWS]]
            texts = page_texts(self.bot.catalogs, message.locale)  # chatrun's words, in the session's locale
            body |= {"type": "interactive", "interactive": {"type": "list", "body": {"text": text}, "action": {
                "button": texts["channel_list_button"][:MAX_TITLE],
                "sections": [{"title": texts["channel_list_title"][:MAX_ROW_TITLE], "rows": rows}]}}}
        url = f"{self.option('api', DEFAULT_API).rstrip('/')}/{address['phone_number_id']}/messages"
        response = await self.call(client, "POST", url, "whatsapp messages", "the Cloud API", json=body,
                                   headers={"Authorization": f"Bearer {self.secret('token')}"})
        if response.status_code != 200:
            raise SendFailed.answered(f"whatsapp messages: the Cloud API answered {response.status_code}: "
                                      f"{response.text[:200]}", response)


MEDIA = ("image", "document", "audio", "video")  # media a message may carry (a sticker is not a file to read)


def _files(message: dict[str, Any]) -> tuple[InboundFile, ...]:
    kind = message.get("type")
    media = message.get(kind) if kind in MEDIA else None
    if not isinstance(media, dict) or not media.get("id"):
        return ()
    return (InboundFile(str(media["id"]), media_type_of(media.get("mime_type")), str(media.get("filename") or "")),)


def _text(message: dict[str, Any]) -> str | None:
    """What the user said: a text's body, or the id of the reply button or list row pressed."""
    kind = message.get("type")
    if kind == "text":
        return str((message.get("text") or {}).get("body") or "")
    if kind == "interactive":
        interactive = message.get("interactive") or {}
        chosen = interactive.get("button_reply") or interactive.get("list_reply") or {}
        return str(chosen.get("id") or "") or None
    if kind == "button":  # a template's quick reply
        return str((message.get("button") or {}).get("payload") or "") or None
    return None  # a location, a reaction, a sticker: not answered (docs/channels.md)


def _edit(message: dict[str, Any], number: str, names: dict[Any, Any]) -> list[Inbound]:
    """An `edit` message (a user's edit of a message sent before; the Cloud API sends it to a
    number on the WhatsApp Business app too): an Inbound `edited`, its delivery the edited
    message's wamid (`edit.original_message_id`), so each edited message is told once."""
    edit = message.get("edit")
    original = edit.get("original_message_id") if isinstance(edit, dict) else None
    if not isinstance(edit, dict) or not isinstance(original, str) or not original:
        return []
    user = str(message.get("from"))
    text = _text(edit["message"]) if isinstance(edit.get("message"), dict) else None
    return [Inbound(f"{original}:edited", f"{number}:{user}", user, text or "", {"phone_number_id": number, "to": user},
                    names.get(user, ""), sent=epoch_seconds(message.get("timestamp")), edited=True)]
