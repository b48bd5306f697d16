"""`chatrun test --record`: run a transcript's user turns against the bot's real model
and write what it answered, call by call, into each turn's `model:` list, so later
runs replay the conversation offline."""

from __future__ import annotations

import json
from typing import Any

from chatrun.errors import ChatrunError, ModelError
from chatrun.models import ModelPool
from chatrun.models.base import ChunkCallback, ModelRequest, ModelResponse
from chatrun.transcripts.format import Transcript
from chatrun.transcripts.update import pin_tokenizer, rewrite_turns


class RecordingModel:
    """Passes every call to the real model of the route's provider and keeps its answers."""

    def __init__(self) -> None:
        self._pool = ModelPool()
        self._model = self._pool.model()
        self.responses: list[dict[str, Any]] = []

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        try:
            response = await self._model.complete(request, on_chunk)
        except ModelError as exc:
            self.responses.append({"error": str(exc)})
            raise
        self.responses.append(response_to_script(response))
        return response

    async def aclose(self) -> None:
        await self._model.aclose()
        await self._pool.aclose()


def response_to_script(response: ModelResponse) -> dict[str, Any]:
    """A ModelResponse as a transcript's `model:` item: text, and tool calls with their
    arguments parsed (kept as raw text when they are not JSON, so replay sees the same)."""
    out: dict[str, Any] = {}
    if response.text:
        out["text"] = response.text
    if response.tool_calls:
        calls = []
        for call in response.tool_calls:
            try:
                arguments: Any = json.loads(call.arguments) if call.arguments.strip() else {}
            except json.JSONDecodeError:
                arguments = call.arguments
            calls.append({"name": call.name, "arguments": arguments})
        out["tool_calls"] = calls
    if not out:
        out["text"] = ""
    return out


def record_transcript(transcript: Transcript) -> bool:
    """Re-record every turn's `model:` list, and the results of HTTP tools its mocks do not
    cover (into the turn's `mocks:`). Returns True when the file changed.

    If a model call fails (no credentials, the provider down), nothing is written and a
    ChatrunError says which turn failed: a recording must not replace good answers with errors."""
    from chatrun.engine.bot import load_bot
    from chatrun.transcripts.run import (
        REFUSED_DECISIONS,
        advance_clock,
        send,
        set_turn_clock,
        start_session,
    )

    bot = load_bot(transcript.bot_path)
    recorder = RecordingModel()
    session, _ = start_session(bot, transcript, recorder)
    changes: dict[int, dict[str, Any]] = {}
    try:
        for turn in transcript.turns:
            recorder.responses = []
            session.tool_mocks.next_turn(turn.mocks, turn.mock_lines)
            set_turn_clock(session, turn)
            try:
                send(session, turn)
            except REFUSED_DECISIONS:  # a refused decision runs no turn: nothing to record
                pass
            advance_clock(session)
            failed = [r["error"] for r in recorder.responses if "error" in r]
            if failed:
                raise ChatrunError(f"turn {turn.index} ({transcript.where(turn)}): the model failed while "
                                   f"recording, so nothing was written: {failed[0]}")
            changes[turn.index - 1] = {"model": recorder.responses}
            if session.tool_mocks.recorded:  # real HTTP results (secrets already redacted), so replay is offline
                changes[turn.index - 1]["mocks"] = [*turn.mocks, *session.tool_mocks.recorded]
        tokenizer = session.counting_tokenizer()
    finally:
        session.close()
    changed = rewrite_turns(transcript.file, changes)
    if changed:  # the new answers were recorded with this counter's windows: pin it
        pin_tokenizer(transcript.file, tokenizer)
    return changed


def record_verdicts(transcript: Transcript, bots: dict[str, Any] | None = None) -> bool:
    """Ask the judge about every `judge:` criterion of the (just recorded) transcript and write
    its verdicts into the turns' `judged:` lists. Returns True when the file changed."""
    from chatrun.transcripts.judge import RECORD
    from chatrun.transcripts.run import run_transcript

    if not transcript.judge and not any((t.expect or {}).get("judge") for t in transcript.turns):
        return False
    result = run_transcript(transcript, bots, RECORD)
    if result.error is not None:
        raise ChatrunError(result.error)
    return rewrite_turns(transcript.file, {index: {"judged": verdicts} for index, verdicts in result.verdicts.items()})
