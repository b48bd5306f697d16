"""docs/security.md: text a user or the model sends is data, never a template. A user message
and a model's tool arguments that look like Jinja reach the user template, the context, `set:`
and `reply:` and stay those characters (rendered once, as values), whatever the template reads."""

from __future__ import annotations

import chatrun
from chat_support import call
from chatrun.models.scripted import ScriptedModel

BOT = """
name: echo
format: 3
model: {provider: scripted}
state: {note: null}
routes:
  main:
    default: true
    system: You keep notes.
    user: "Said: {{ user_message }}"
    context: "Last note: {{ state.note }}"
    tools: [note]
tools:
  note:
    description: Keep a note
    parameters: {type: object, properties: {text: {type: string}}, required: [text]}
    action:
      set: {state.note: "{{ args.text }}"}
      reply: "Noted: {{ args.text }}"
      message: "You wrote {{ args.text }}"
"""

SAID = "{{ 7*7 }} {% for x in range(3) %}x{% endfor %} {{ state }}"
WROTE = "{{ 6*7 }}{{ ''.__class__ }}"


def test_what_a_user_and_a_model_send_is_never_rendered_as_a_template(write_bot):
    model = ScriptedModel([call("note", text=WROTE), {"text": "Done."}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    events = session.chat(SAID)
    assert session.state["note"] == WROTE
    assert [e.data for e in events if e.type == "Message"] == [f"You wrote {WROTE}", "Done."]
    first, second = (request.messages for request in model.requests)
    assert first[1].content == f"Said: {SAID}"
    assert second[-1].content == f"Last note: {WROTE}"  # the context, rendered after the tool's set
    assert [m.content for m in second if m.role == "tool"] == [f"Noted: {WROTE}"]
    sent = " ".join(str(m.content) for m in second)
    assert "49" not in sent and "42" not in sent and "xxx" not in sent and "<class" not in sent
