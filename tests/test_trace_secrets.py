"""What a trace keeps of a `secret: true` variable's value on a bot without `guardrails:`: the
storage rule redacts it from everything kept (docs/guardrails.md), the model calls' captured
content included. The real openai client against the fake OpenAI server, a Python handler that
returns what its API echoed, the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import json

import pytest

import chatrun
from secret_support import ENCODED, SECRET, basic_bot, basic_handler

pytest.importorskip("opentelemetry.trace", reason="opentelemetry is not installed (pip install 'chatrun[otel]')")


def test_captured_model_content_keeps_no_secret_on_a_bot_without_guardrails(fake, spans, write_bot, monkeypatch):
    monkeypatch.setenv("API_PASSWORD", SECRET)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    bot = chatrun.load_bot(write_bot(basic_bot("echo", "provider: openai, name: gpt-4o-mini", "echo_tools"),
                                     extra={"echo_tools.py": basic_handler(fails=False)}))
    assert not bot.config.guardrails
    fake.queue({"tool_calls": [{"name": "call_api", "arguments": {}}]}, {"text": "The API answered."})
    session = bot.session()
    session.chat("call it")
    # The model read the result as the tool returned it (it is the model's to read) ...
    assert SECRET in json.dumps(fake.requests[-1]["messages"])
    # ... and what is kept of it holds no secret: the history, and every span.
    assert "(password [redacted])" in json.dumps(session.history)
    chats = [s for s in spans.get_finished_spans() if s.name == "chat gpt-4o-mini"]
    assert len(chats) == 2 and "(password [redacted])" in chats[1].attributes["gen_ai.input.messages"]
    recorded = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert SECRET not in recorded and ENCODED[8:24] not in recorded
