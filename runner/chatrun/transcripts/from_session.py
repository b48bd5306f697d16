"""A stored session as a golden transcript (`chatrun record --from-session`).

A turn's history entry holds what replaying it needs: the input, the model's answers
(`model`), the tool calls with the arguments they ran with and their results (`calls`), and,
on turn 1, how the conversation started (`start`: route and state). The transcript's
expectations are what *happened* — each turn's route, stack, the user's events and its tool
calls, as stored — not what a replay gives, so running it (`chatrun test`) checks that the
replay does exactly what the session did; `record_session` runs it once and says where not.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chatrun import events as ev
from chatrun.errors import ChatrunError
from chatrun.store.urls import shown_url
from chatrun.transcripts.expect import item_view

HEADER = ("# yaml-language-server: $schema={schema}\n"
          "# Recorded from session {session} of {store}; run it with: chatrun test {file}\n")


@dataclass
class StoredSession:
    """What a store gives of one session: its bot's name and its history, oldest turn first."""

    session_id: str
    bot: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # ref -> the bytes of each file its turns attached


def attached(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a history entry's message attached from the blob area (not those sent by URL)."""
    given = entry.get("input")
    items = given.get("attachments") if isinstance(given, dict) else None
    return [a for a in items or [] if isinstance(a, dict) and isinstance(a.get("ref"), str)
            and not a["ref"].startswith(("http://", "https://"))]


async def load_stored_session(url: str, session_id: str) -> StoredSession:
    """The session `session_id` of the store at `url` (sqlite:///…, redis://…). ChatrunError
    when there is no such session."""
    from chatrun.store.aio import open_existing_store
    from chatrun.store.record import turns_of

    store = await open_existing_store(url)  # reading: never create an empty store
    try:
        record = await store.load_session(session_id)
        if record is None:
            raise ChatrunError(f"{url} has no session {session_id!r}")
        # The turns: a user's rating (Session.rate) or a notice (Session.notice) is an entry of
        # its own, without `turn`, not a turn to replay.
        history = turns_of(await store.load_history(session_id))
        files = _attached_files(store, session_id, list(history))
    finally:
        await store.close()
    return StoredSession(session_id, record.bot, list(history), files)


def _attached_files(store: Any, session_id: str, history: list[dict[str, Any]]) -> dict[str, bytes]:
    """The bytes of every file the session's turns attached, from the store's blob area; a
    ChatrunError names a file that is gone (the replay could not send it)."""
    from chatrun.store.blobs import blobs_of

    wanted = [(entry.get("turn"), a) for entry in history for a in attached(entry)]
    if not wanted:
        return {}
    blobs = blobs_of(store)
    files: dict[str, bytes] = {}
    try:
        for turn, attachment in wanted:
            data = blobs.read(session_id, attachment["ref"]) if blobs is not None else None
            if data is None:
                raise ChatrunError(f"session {session_id}, turn {turn}: the attached file "
                                   f"{attachment.get('name') or attachment['ref']!r} is no longer in the store's "
                                   "blob area (deleted, or kept elsewhere), so a replay could not send it")
            files[attachment["ref"]] = data
    finally:
        close = getattr(blobs, "close", None)
        if close is not None and blobs is not getattr(store, "blob_area", None):
            close()
    return files


def fixture_paths(stored: StoredSession, folder: str) -> dict[str, str]:
    """Where each attached file goes beside the transcript, by ref: `folder/<its name>` (a
    name two different files share gets the start of its ref in front)."""
    paths: dict[str, str] = {}
    for entry in stored.history:
        for attachment in attached(entry):
            ref = attachment["ref"]
            if ref in paths:
                continue
            name = _file_name(attachment)
            if f"{folder}/{name}" in paths.values():
                name = f"{ref[:8]}-{name}"
            paths[ref] = f"{folder}/{name}"
    return paths


def _file_name(attachment: dict[str, Any]) -> str:
    """A safe file name for an attachment: its own name's last part, else its ref with the
    extension its media type has."""
    import mimetypes

    name = Path(str(attachment.get("name") or "").replace("\\", "/")).name
    if name and name not in (".", "..") and not name.startswith("."):
        return name
    return attachment["ref"][:12] + (mimetypes.guess_extension(str(attachment.get("media_type") or "")) or "")


def write_fixtures(stored: StoredSession, paths: dict[str, str], beside: Path) -> None:
    """The attached files, written where `fixture_paths` put them (relative to `beside`)."""
    for ref, relative in paths.items():
        target = beside / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(stored.files[ref])


def transcript_of(stored: StoredSession, bot_config: Any, bot_ref: str,
                  is_outside: Callable[[str], bool], fixtures: dict[str, str] | None = None) -> dict[str, Any]:
    """The transcript document (plain data) of a stored session. `bot_ref`: the `bot:` value;
    `is_outside(tool)`: whether a tool's result comes from outside the bot (HTTP, MCP), so
    the replay must be given it as a mock (a handler runs again: it is the bot's own code);
    `fixtures`: where each attached file is beside the transcript (`fixture_paths`), so a
    turn that attached files attaches them again (`attach:`)."""
    history = stored.history
    if not history:
        raise ChatrunError(f"session {stored.session_id} has no turns to record")
    start = next((e["start"] for e in history if isinstance(e.get("start"), dict)), None)
    if start is None:
        raise ChatrunError(f"session {stored.session_id} was stored by a chatrun that did not keep how a "
                           "conversation starts (history entries without `start`); it cannot be replayed exactly")
    doc: dict[str, Any] = {"description": f"Recorded from session {stored.session_id}.", "bot": bot_ref}
    if start.get("route") != bot_config.default_route:
        doc["route"] = start["route"]
    changed = {k: v for k, v in (start.get("state") or {}).items() if bot_config.state.get(k) != v}
    if changed:
        doc["state"] = changed
    doc["turns"] = [_turn(entry, is_outside, fixtures or {}) for entry in history]
    return doc


def _turn(entry: dict[str, Any], is_outside: Callable[[str], bool], fixtures: dict[str, str]) -> dict[str, Any]:
    said = entry.get("input")
    turn: dict[str, Any] = {"clock": _instant(entry["at"])} if isinstance(entry.get("at"), int | float) else {}
    files = [a for a in attached(entry) if a["ref"] in fixtures]
    if files:  # sent again from the fixtures: the replay's blob area starts empty
        assert isinstance(said, dict)
        rest = [a for a in said["attachments"] if a not in files]  # files sent by URL stay in the data
        said = {key: value for key, value in said.items() if key != "attachments"} | ({"attachments": rest} if rest else {})
    turn.update({"data": said} if isinstance(said, dict) else {"data": {}} if said is None else {"user": said})
    if files:
        turn["attach"] = [{"file": fixtures[a["ref"]], "media_type": a.get("media_type"),
                           **({"name": a["name"]} if a.get("name") else {})} for a in files]
    model = [dict(answer) for answer in entry.get("model") or []]
    error = entry.get("error")
    if not entry.get("ok") and isinstance(error, str) and error.startswith("the model failed"):
        model.append({"error": error})  # the call that failed: the replay fails it the same way
    turn["model"] = model
    calls = [c for c in entry.get("calls") or [] if isinstance(c, dict)]
    mocks = [_mock(c) for c in calls if "args" in c and is_outside(str(c.get("tool")))]
    if mocks:
        turn["mocks"] = mocks
    turn["expect"] = _what_happened(entry, calls)
    return turn


def _mock(call: dict[str, Any]) -> dict[str, Any]:
    mock: dict[str, Any] = {"tool": call["tool"], "args": call["args"]}
    if "error" in call:
        mock["error"] = call["error"]
    else:
        mock["result"] = call.get("result")
    return mock


def _event_data(event: dict[str, Any]) -> Any:
    """A stored event's data as expectations read it: a Pending event as its item, without
    the runtime's own fields (when it was made, its call id), which differ on a replay."""
    data = event.get("data")
    if event.get("type") == ev.PENDING and isinstance(data, dict):
        return item_view(data)
    return data


def _what_happened(entry: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The turn's expectations, from the history: the user's events, the route and stack it
    ended on (a failed turn: that it failed), and its tool calls with their arguments."""
    events = [{e["type"]: _event_data(e)} for e in entry.get("events") or []
              if isinstance(e, dict) and e.get("type") != ev.STREAM and not e.get("audience")]
    expect: dict[str, Any] = {}
    if entry.get("ok"):
        expect["route"] = entry.get("route")
        expect["stack"] = entry.get("stack")
    else:
        expect["error"] = True
    expect["events"] = events
    if calls:
        expect["calls"] = [_expected_call(c) for c in calls]
    return expect


def _expected_call(call: dict[str, Any]) -> dict[str, Any]:
    """A call as it happened: the tool, the arguments it ran with, what the model read of it."""
    out: dict[str, Any] = {"tool": call.get("tool")}
    out.update({key: call[key] for key in ("args", "reply", "error") if key in call})
    return out


def _instant(at: float) -> str:
    """The turn's start as the instant its pinned clock runs at (templates reading `now` agree)."""
    return datetime.fromtimestamp(at, UTC).isoformat()


def write_transcript(doc: dict[str, Any], path: Path, session_id: str, store_url: str) -> None:
    from chatrun.definition.schemas import schema_path
    from chatrun.transcripts.format import check_replaceable
    from chatrun.transcripts.update import _yaml, to_node

    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    y = _yaml()
    buf = io.StringIO()
    node = to_node(doc)
    node["turns"].fa.set_block_style()
    for turn in node["turns"]:
        turn.fa.set_block_style()
    y.dump(node, buf)
    schema = os.path.relpath(schema_path("transcript.schema.json"), path.parent.resolve())
    header = HEADER.format(schema=schema, session=session_id, store=shown_url(store_url), file=path)
    path.write_text(header + buf.getvalue(), encoding="utf-8")


def bot_reference(bot_path: Path, folder: Path) -> str:
    """`bot:` for a transcript in `folder`: the bot's path relative to it, as the paths read
    (a symlinked folder of bots stays a link, not the place it points at)."""
    bot_path = Path(os.path.abspath(bot_path))
    if bot_path.is_file() and bot_path.name in ("bot.yaml", "bot.yml"):
        bot_path = bot_path.parent
    return Path(os.path.relpath(bot_path, os.path.abspath(folder))).as_posix()
