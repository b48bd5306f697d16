"""Issue 32, item 3: consent only from the user. A tool's `confirm:` (the short form of an
approval `by: [user]`) runs the tool only on the user's own yes to the runtime's question, never
on an argument the model filled: through the real openai client against the fake OpenAI server,
the payment going to a real local HTTP receiver, on the library API and on the HTTP API (with
--auth: only the session's user decides). `chatrun validate` warns about a consent-named argument
a case decides a side effect on."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import chatrun
from chat_support import call, kinds
from chatrun.definition.loader import check_bot
from server_support import app_for_testclient
from webhook_support import OPENAI_MODEL, Receiver

BOT = f"""\
name: pay
format: 3
model: {{{OPENAI_MODEL}}}
env:
  PAY_URL: {{}}
routes:
  main: {{default: true, system: You send money., tools: [pay, cancel]}}
tools:
  pay:
    description: Send money
    parameters:
      type: object
      properties: {{to: {{type: string}}, amount: {{type: number}}}}
      required: [to, amount]
    http: {{method: POST, url: "{{{{ env.PAY_URL }}}}/pay", json: {{to: "{{{{ args.to }}}}", amount: "{{{{ args.amount }}}}"}}}}
    confirm: "Send {{{{ args.amount }}}} EUR to {{{{ args.to }}}}?"
    action: {{reply: "Sent {{{{ args.amount }}}} EUR to {{{{ args.to }}}}."}}
  cancel:
    description: Cancel the payment
    action: {{reply: Cancelled.}}
"""
YES_NO = [{"label": "Yes", "value": "yes"}, {"label": "No", "value": "no"}]
WAITING = "Waiting for the user's confirmation: Send 1000 EUR to Maria?"
NOT_RUN = "Not run: an earlier tool call waits for a person; call this again after it is resolved."


@pytest.fixture
def receiver(monkeypatch):
    with Receiver() as r:
        monkeypatch.setenv("PAY_URL", r.url)
        yield r


@pytest.fixture
def bot(tmp_path, receiver):
    (tmp_path / "bot.yaml").write_text(BOT)
    return chatrun.load_bot(tmp_path / "bot.yaml")


def _invented(*names: str) -> dict:
    """One model answer: the named calls, each with a recipient, an amount and a consent flag the
    user never gave."""
    args = {"to": "Maria", "amount": 1000, "confirmed": True}
    return {"tool_calls": [{"name": n, "arguments": args if n == "pay" else {}} for n in names]}


def test_the_model_cannot_consent_send_cancel_send_runs_only_the_first_and_a_yes_sends_once(fake, bot, receiver):
    s = bot.session()
    fake.queue(_invented("pay", "cancel", "pay"))
    events = s.chat("I want to send some money")
    assert receiver.seen() == [] and [item.ask for item in s.pending] == ["Send 1000 EUR to Maria?"]
    (pending,) = [e.data for e in events if e.type == "Pending"]
    assert pending["by"] == ["user"] and pending["choices"] == YES_NO
    assert ("Choices", {"choices": YES_NO}) in kinds(events)
    # ... and the model reads that its consent flag is no argument of pay (issue 32, item 6).
    note = "\n\nNote: `confirmed` is not an argument of pay (it takes `to`, `amount`); the value you sent was ignored."
    assert [m.content for m in s.memory()[-3:]] == [WAITING + note, NOT_RUN, NOT_RUN]
    asked = len(fake.requests)
    fake.queue({"text": "Sent."})
    events = s.chat("Yes")
    assert [e.data["outcome"] for e in events if e.type == "Resolved"] == ["approved"]
    assert len(receiver.seen()) == 1 and receiver.seen()[0].body == {"to": "Maria", "amount": 1000}
    assert fake.requests[asked]["messages"][-3]["content"] == "Sent 1000 EUR to Maria."
    fake.queue({"text": "It is sent already."})
    s.chat("yes")  # nothing waits now: a message for the model, not a second payment
    assert len(receiver.seen()) == 1 and s.pending == []


def test_a_no_runs_nothing_and_the_model_reads_that_the_user_declined(fake, bot, receiver):
    s = bot.session()
    fake.queue(_invented("pay"))
    s.chat("Pay Maria")
    fake.queue({"text": "Alright, nothing was sent."})
    events = s.chat("no.")
    assert [e.data["outcome"] for e in events if e.type == "Resolved"] == ["rejected"]
    assert receiver.seen() == [] and s.pending == []
    assert fake.requests[-1]["messages"][-1]["content"] == (
        'The user declined "Send 1000 EUR to Maria?": pay was not run. Do not call it again unless the user '
        "asks for it again.")


def test_another_message_declines_and_the_model_reads_it_after_the_call(fake, bot, receiver):
    s = bot.session()
    fake.queue(_invented("pay"))
    s.chat("I want to send some money")
    fake.queue(call("pay", to="Ana", amount=50))
    events = s.chat("Yes, but 50 to Ana")  # not a yes: never the 1000 to Maria
    assert receiver.seen() == [] and [item.ask for item in s.pending] == ["Send 50 EUR to Ana?"]
    assert [e.data.get("reason") for e in events if e.type == "Resolved"] == ["the user answered with another message"]
    told, said = fake.requests[-1]["messages"][-2:]
    assert told["role"] == "tool" and told["content"].startswith('The user did not confirm "Send 1000 EUR to Maria?"')
    assert said == {"role": "user", "content": "Yes, but 50 to Ana"}
    fake.queue({"text": "Sent 50 EUR to Ana."})
    s.chat("yes please")
    assert [d.body for d in receiver.seen()] == [{"to": "Ana", "amount": 50}]


def test_the_question_and_its_buttons_speak_the_sessions_locale(fake, write_bot, receiver):
    path = write_bot(BOT.replace("format: 3\n", "format: 3\nlocales: [en, de]\n")
                     .replace('"Send {{ args.amount }} EUR to {{ args.to }}?"', "\"{{ t('ask', n=args.amount) }}\""))
    (path.parent / "locales").mkdir()
    (path.parent / "locales" / "en.yaml").write_text("ask: Send {n} EUR?\n")
    (path.parent / "locales" / "de.yaml").write_text("ask: '{n} EUR senden?'\npage:\n  'no': Nein danke\n")
    s = chatrun.load_bot(path).session()
    s.ask_locale("de-AT")
    fake.queue(_invented("pay"))
    events = s.chat("Schick Maria Geld")
    choices = [{"label": "Ja", "value": "yes"}, {"label": "Nein danke", "value": "no"}]  # `page.no`: the bot's own
    assert ("Choices", {"choices": choices}) in kinds(events)
    assert [item.ask for item in s.pending] == ["1000 EUR senden?"]
    fake.queue({"text": "Gut."})
    events = s.chat("Ja")  # a button's label is its value
    assert [e.data["outcome"] for e in events if e.type == "Resolved"] == ["approved"]
    assert len(receiver.seen()) == 1


AUTH = """
tokens:
  ana-token-123: {principal: ana}
  olga-token-12: {principal: olga, roles: [operators, supervisor]}
"""


def test_over_the_http_api_only_the_sessions_user_confirms(fake, bot, receiver, tmp_path):
    (tmp_path / "auth.yaml").write_text(AUTH)
    ana, olga = {"Authorization": "Bearer ana-token-123"}, {"Authorization": "Bearer olga-token-12"}
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml"))
    with TestClient(app) as client:
        assert client.post("/bots/pay/sessions", json={"id": "h1"}, headers=ana).status_code == 201
        fake.queue(_invented("pay"))
        reply = client.post("/bots/pay/sessions/h1/messages", json={"userMessage": "send money"}, headers=ana).json()
        types = [e["type"] for e in reply["events"]]
        assert "Pending" in types and "Choices" in types and receiver.seen() == []
        refused = client.post("/bots/pay/sessions/h1/pending/p1", json={"decision": "approve"}, headers=olga)
        assert refused.status_code == 403 and receiver.seen() == []  # an operator cannot consent for the user
        fake.queue({"text": "Sent."})
        decided = client.post("/bots/pay/sessions/h1/messages", json={"userMessage": "yes"}, headers=ana).json()
        assert [e["data"]["outcome"] for e in decided["events"] if e["type"] == "Resolved"] == ["approved"]
        assert len(receiver.seen()) == 1
        # /v1 (a client without buttons) reads the question and how to answer it.
        fake.queue(_invented("pay"))
        body = client.post("/v1/chat/completions", headers=dict(ana, **{"X-Chatrun-Session": "o1"}),
                           json={"model": "pay", "messages": [{"role": "user", "content": "pay"}]}).json()
        assert body["choices"][0]["message"]["content"].endswith("Send 1000 EUR to Maria?\n\nReply with one of: Yes, No.")
        assert len(receiver.seen()) == 1


# -- the validator -------------------------------------------------------------------------------

CONSENT_ARG = """\
name: bank
format: 3
state: {balance: 100}
routes:
  main: {default: true, system: Bank., tools: [confirm_transfer, lookup]}
tools:
  confirm_transfer:
    description: The user's answer
    parameters:
      type: object
      properties: {confirmed: {type: boolean}}
      required: [confirmed]
    action:
      cases:
        - if: args.confirmed
          then: {set: {state.balance: "{{ state.balance - 10 }}"}}
        - else: {message: Cancelled.}
  lookup:
    description: Answer yes or no about an order (a read, no side effect)
    parameters: {type: object, properties: {'yes': {type: boolean}}}
    action:
      cases:
        - if: args.yes
          then: {reply: Found.}
"""


def _diagnostics(write_bot, text: str) -> list[tuple[str, int, str]]:
    _, found = check_bot(write_bot(text))
    return [(d.severity, d.line, d.message) for d in found]


def test_validate_warns_about_a_consent_argument_a_case_decides_a_side_effect_on(write_bot):
    found = _diagnostics(write_bot, CONSENT_ARG)
    assert ("warning", 15, "tool `confirm_transfer` decides what it does on `args.confirmed`, an argument the model "
            "fills: the model can consent for the user. Ask the user with `confirm:` on the tool that acts, and "
            "drop the argument (docs/tools.md, \"Consent from the user\")") in found
    assert not [f for f in found if "lookup" in f[2]]  # its case has no side effect
    confirmed = CONSENT_ARG.replace("    action:\n      cases:\n        - if: args.confirmed",
                                    "    confirm: Send 10?\n    action:\n      cases:\n        - if: args.confirmed")
    assert not [f for f in _diagnostics(write_bot, confirmed) if "consent" in f[2]]


def test_validate_refuses_confirm_with_approval_and_checks_its_template_at_its_line(write_bot):
    found = _diagnostics(write_bot, """\
        name: v
        format: 3
        routes:
          main: {default: true, system: Hi., tools: [pay, send]}
        tools:
          pay:
            confirm: "Pay {{ args.amount | roundd }}?"
          send:
            confirm: Send it?
            approval: {by: [supervisor]}
        """.replace("        ", ""))
    assert ("error", 7, "template error in `confirm` of tool `pay`: no filter named `roundd`; did you mean "
            "`round`?") in found
    assert ("error", 9, "tool `send` has both `confirm` and `approval`: `confirm: TEXT` is `approval: {by: [user], "
            "ask: TEXT}`; give one (the approval's `ask` says what the user is asked)") in found
