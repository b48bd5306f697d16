"""Writing a conversation as a golden transcript (the REPL's `/save FILE`).

The user turns and what the model answered are written as they happened; the
expectations come from replaying the file offline (as `chatrun test --update` would),
so the saved transcript passes `chatrun test FILE` by construction.
"""

from __future__ import annotations

import io
import os
import shlex
from pathlib import Path
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.models.base import ModelResponse
from chatrun.transcripts.format import check_replaceable
from chatrun.transcripts.record import response_to_script
from chatrun.transcripts.update import _yaml, to_node, update_from_result

HEADER = "# yaml-language-server: $schema={schema}\n# Saved from `chatrun repl`; run it with: chatrun test {file}\n"


def save_transcript(
    path: str | Path,
    bot_path: str | Path,
    route: str | None = None,
    records: list[dict[str, Any]] | None = None,
    session: Any = None,
    state: dict[str, Any] | None = None,
    roles: list[str] | None = None,
) -> Any:
    """Write `records` (one per turn: {"user": str | dict, "model": [ModelResponse | dict],
    "mocks": [what tools that reach outside the bot really gave, as `mocks:` items, see
    TranscriptMocks.recorded], and optionally events/route/stack, which are not needed:
    expectations come from a replay}) as a transcript at `path`, for the bot at `bot_path` (its directory or its
    bot.yaml) starting on `route` with initial conversation `state`. `session`, when given,
    supplies the roles and is checked to have started with the first record.
    Returns the replay's chatrun.transcripts.run.Result (passed unless the bot is not
    deterministic). Raises ChatrunError when there is nothing to save."""
    from chatrun.transcripts.run import run_transcript

    records = list(records or [])
    if not records:
        raise ChatrunError("there are no turns to save yet")
    if session is not None:
        if roles is None and getattr(session, "roles", None) is not None:
            roles = sorted(session.roles)
        done = getattr(session, "turn", 0)
        succeeded = sum(1 for r in records if not _failed(r))
        if done > succeeded:
            raise ChatrunError(
                f"session {session.id} had {done - succeeded} turn(s) before the ones recorded here (a resumed "
                "session?); a transcript replays a conversation from its start"
            )
    path = Path(path)
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"bot": _relative_bot(Path(bot_path), path.parent)}
    if route:
        doc["route"] = route
    if state:
        doc["state"] = state
    first = records[0]
    if "roles" in first:  # who sent the first turn (the REPL records each turn's sender)
        roles = first["roles"]
    if roles is not None:
        doc["roles"] = list(roles)
    principal = first.get("principal", getattr(session, "principal", None))
    if principal is not None:  # what bound arguments read: the replay signs the same one in
        doc["principal"] = dict(principal)
    tokenizer = session.counting_tokenizer() if hasattr(session, "counting_tokenizer") else None
    if tokenizer:  # the counter the REPL's windows counted with: the replay's windows are the same anywhere
        doc["tokenizer"] = tokenizer
    start = _start_clock(records)
    if start is not None:  # what reads `now` replays the same on any day (items' due times too)
        doc["clock"] = start
    doc["turns"] = [_turn(r, principal, roles) for r in records]
    y = _yaml()
    buf = io.StringIO()
    node = to_node(doc)
    node["turns"].fa.set_block_style()
    for turn in node["turns"]:
        turn.fa.set_block_style()  # --update splices block mappings
    y.dump(node, buf)
    bot_dir = _bot_dir(Path(bot_path))
    header = HEADER.format(schema=schema_reference(path, bot_dir), file=shlex.quote(_run_path(path, bot_dir)))
    path.write_text(header + buf.getvalue(), encoding="utf-8")
    result = run_transcript(str(path))
    if result.error is None and update_from_result(result, accept_errors=True):
        result = run_transcript(str(path))
    return result


def _failed(record: dict[str, Any]) -> bool:
    events = record.get("events") or []
    last = events[-1] if events else None
    return getattr(last, "type", None) == "Error" or (isinstance(last, dict) and last.get("type") == "Error")


def _turn(record: dict[str, Any], principal: Any = None, roles: Any = None) -> dict[str, Any]:
    said = record.get("user", record.get("data"))
    turn: dict[str, Any] = {"clock": record["clock"]} if record.get("clock") else {}  # the REPL's pinned /clock
    acting = _acting(record, principal, roles)
    if acting is not None:
        turn["as"] = acting
    if record.get("decision"):  # a third party's step ({approve: p1}, {operator: take}, ...)
        turn.update(record["decision"])
    else:
        turn.update({"data": said} if isinstance(said, dict) else {"user": said or ""})
    turn["model"] = [response_to_script(r) if isinstance(r, ModelResponse) else dict(r) for r in record.get("model") or []]
    if record.get("mocks"):  # what the HTTP and MCP tools really gave: the replay is offline
        turn["mocks"] = [dict(m) for m in record["mocks"]]
    return turn


def _start_clock(records: list[dict[str, Any]]) -> str | None:
    """The instant the replay's clock is pinned at from its first turn: the first turn's own,
    when `/clock` did not pin it. A turn the system clock ran would replay at another time on
    every run, and a template that reads `now` or `today` (a date's "34 days from today", an
    item's due time) would fail the day after the save."""
    if records[0].get("clock"):
        return None
    return next((r["at"] for r in records if r.get("at")), None)


def _acting(record: dict[str, Any], principal: Any, roles: Any) -> Any:
    """The turn's `as:` when someone other than the first turn's sender sent it: `backend`, or
    the principal with its roles."""
    if record.get("as") == "backend":
        return "backend"
    who = record.get("principal", principal)
    their_roles = record.get("roles", roles)
    if who == principal and their_roles == roles:
        return None
    if who is None:
        who = {"name": "someone"}
    return {**dict(who), "roles": sorted(their_roles or ())}


def _bot_dir(bot_path: Path) -> Path:
    bot_path = bot_path.resolve()
    if bot_path.is_file() and bot_path.name in ("bot.yaml", "bot.yml"):
        return bot_path.parent
    return bot_path


def _relative_bot(bot_path: Path, folder: Path) -> str:
    return Path(os.path.relpath(_bot_dir(bot_path), folder.resolve())).as_posix()


def _inside(path: Path, folder: Path) -> bool:
    return folder == path or folder in path.parents


def schema_reference(path: Path, bot_dir: Path) -> str:
    """How the saved file's modeline names the transcript schema, so it still works when the bot is
    committed, cloned or chatrun reinstalled: the bot's own copy (`chatrun init` writes one into
    .chatrun/schemas/), relatively; else, in a checkout of chatrun, its schemas/ relatively; else
    the schema's `$id` (never a file inside the virtualenv)."""
    from chatrun.definition.schemas import BOT_SCHEMA_DIR, load_schema, schema_path

    folder = path.parent.resolve()
    homes = (bot_dir, *list(bot_dir.parents)[:2])  # a version's folder (versions/N) or the bot's
    own = next((d / BOT_SCHEMA_DIR / "transcript.schema.json" for d in homes
                if (d / BOT_SCHEMA_DIR / "transcript.schema.json").is_file()), None)
    if own is not None:
        return Path(os.path.relpath(own, folder)).as_posix()
    shipped = schema_path("transcript.schema.json").resolve()
    checkout = shipped.parent.parent  # the repository holding schemas/ (a wheel's is chatrun/ itself)
    if shipped.parent.name == "schemas" and (checkout / "runner").is_dir() and _inside(folder, checkout):
        return Path(os.path.relpath(shipped, folder)).as_posix()
    return str(load_schema("transcript.schema.json")["$id"])


def _run_path(path: Path, bot_dir: Path) -> str:
    """The saved file as `chatrun test` is told to run it: from the folder holding the bot
    (`mybot/transcripts/x.yaml`), never an absolute path of this machine."""
    resolved = path.resolve()
    if _inside(resolved, bot_dir.parent):
        return Path(os.path.relpath(resolved, bot_dir.parent)).as_posix()
    return Path(os.path.relpath(resolved, Path.cwd())).as_posix() if _inside(resolved, Path.cwd()) else path.name
