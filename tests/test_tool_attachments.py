"""Tools receive the conversation's files: an `http:` tool's `multipart:` body uploads them to
a real HTTP receiver on loopback (which checks the bytes it got), a handler reads them through
its ToolContext, and a transcript mock's `request:` checks which file would be sent."""

from __future__ import annotations

import email.parser
import email.policy
from http.server import BaseHTTPRequestHandler

import pytest

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.messages import ToolResultMessage
from chatrun.store.blobs import MemoryBlobs
from chatrun.transcripts.mocks import TranscriptMocks
from orders_api import LoopbackApi
from test_attachments import PDF, PNG


class ClaimsApi(LoopbackApi):
    """POST /claims/{id}/files takes a multipart body; it keeps each part as it arrived."""

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("content-length") or 0))
        head = f"Content-Type: {h.headers.get('content-type')}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        parts = {}
        for part in message.iter_parts():
            parts[part.get_param("name", header="content-disposition")] = {
                "filename": part.get_filename(), "type": part.get_content_type(),
                "bytes": part.get_payload(decode=True)}
        self.requests.append({"method": h.command, "path": h.path, "multipart": message.is_multipart(),
                              "parts": parts})
        self.reply(h, 201, {"stored": sorted(parts)})


@pytest.fixture
def api(monkeypatch):
    with ClaimsApi() as server:
        monkeypatch.setenv("CLAIMS_API_URL", server.url)
        yield server


BOT = """
name: claims
model: {provider: scripted, name: gpt-4o-mini}
env:
  CLAIMS_API_URL: {description: Where the claims API lives}
routes:
  main:
    default: true
    system: You file damage claims.
    attachments: {kinds: [image/*, application/pdf]}
    tools: [send_newest, send_named, look]
tools:
  send_newest:
    description: Send the newest file of the conversation to the claim
    parameters: {type: object, properties: {claim: {type: string}}, required: [claim]}
    http:
      method: POST
      url: "{{ env.CLAIMS_API_URL }}/claims/{{ args.claim | urlsegment }}/files"
      multipart:
        claim: "{{ args.claim }}"
        photo: {file: "{{ attachments[-1] }}"}
  send_named:
    description: Send a file of the conversation, by its name, to the claim
    parameters: {type: object, properties: {claim: {type: string}, file: {type: string}}, required: [claim, file]}
    http:
      method: POST
      url: "{{ env.CLAIMS_API_URL }}/claims/{{ args.claim | urlsegment }}/files"
      multipart:
        document: {file: "{{ args.file }}", name: "claim-{{ args.claim }}-{{ args.file }}"}
  look:
    description: What files are there
    handler: "claims_tools:look"
"""

HANDLERS = {"claims_tools.py": '''
def look(ctx):
    newest = ctx.attachments[-1]
    return {"names": [a.name for a in ctx.attachments], "current": [a.name for a in ctx.message_attachments],
            "newest_bytes": len(ctx.read_attachment(newest)), "by_name": len(ctx.read_attachment("parcel.png"))}
'''}


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def session_with(write_bot, answers: list) -> tuple[chatrun.Session, MemoryBlobs]:
    area = MemoryBlobs()
    bot = chatrun.load_bot(write_bot(BOT, extra=HANDLERS))
    return bot.session(model=chatrun.ScriptedModel(answers), blobs=area), area


def send(session: chatrun.Session, text: str, data: bytes, media_type: str, name: str) -> list[chatrun.Event]:
    attachment = session.attach(data, media_type, name)
    return session.chat({"userMessage": text, "attachments": [attachment.to_dict()]})


def tool_results(session: chatrun.Session) -> list[str]:
    return [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]


def test_an_http_tool_uploads_the_newest_file_and_the_api_receives_its_bytes(api, write_bot):
    session, _ = session_with(write_bot, [call("send_newest", claim="C-7"), {"text": "Sent."}])
    send(session, "Here is the photo", PNG, "image/png", "parcel.png")
    [request] = api.requests
    assert request["method"] == "POST" and request["path"] == "/claims/C-7/files" and request["multipart"]
    assert request["parts"] == {
        "claim": {"filename": None, "type": "text/plain", "bytes": b"C-7"},
        "photo": {"filename": "parcel.png", "type": "image/png", "bytes": PNG}}
    assert '"stored": ["claim", "photo"]' in tool_results(session)[0]


def test_a_file_of_an_earlier_message_is_named_by_the_model_and_sent(api, write_bot):
    session, _ = session_with(write_bot, [
        {"text": "Got the photo."}, {"text": "Got the invoice."},
        call("send_named", claim="C-8", file="parcel.png"), {"text": "Sent the photo."}])
    send(session, "The photo", PNG, "image/png", "parcel.png")
    send(session, "The invoice", PDF, "application/pdf", "invoice.pdf")
    session.chat("Send the photo to claim C-8")
    [request] = api.requests
    assert request["parts"] == {"document": {"filename": "claim-C-8-parcel.png", "type": "image/png", "bytes": PNG}}


def test_a_file_the_conversation_does_not_have_is_a_refusal_the_model_reads(api, write_bot):
    session, _ = session_with(write_bot, [call("send_named", claim="C-9", file="nope.png"), {"text": "Sorry."}])
    send(session, "The photo", PNG, "image/png", "parcel.png")
    assert api.requests == []
    assert tool_results(session) == [
        "Error: send_named needs a file for `multipart.document`, and the conversation has no file 'nope.png' "
        "(its files: parcel.png). Ask the user to attach it, or call it again naming one of them."]


def test_the_newest_file_of_a_conversation_without_files_is_a_refusal_too(api, write_bot):
    session, _ = session_with(write_bot, [call("send_newest", claim="C-3"), {"text": "Sorry."}])
    session.chat("Send my photo")
    assert api.requests == [] and session.turn_count == 1
    assert tool_results(session) == [
        "Error: send_newest needs a file for `multipart.photo`, and the conversation has no file (its files: none). "
        "Ask the user to attach it, or call it again naming one of them."]


def test_a_handler_reads_the_conversations_files_through_its_context(write_bot):
    session, _ = session_with(write_bot, [{"text": "Photo."}, call("look"), {"text": "Seen."}])
    send(session, "The photo", PNG, "image/png", "parcel.png")
    send(session, "The invoice", PDF, "application/pdf", "invoice.pdf")
    assert tool_results(session) == [
        f'{{"names": ["parcel.png", "invoice.pdf"], "current": ["invoice.pdf"], "newest_bytes": {len(PDF)}, '
        f'"by_name": {len(PNG)}}}']


def test_a_mocks_request_checks_the_file_that_would_be_sent(write_bot, monkeypatch):
    monkeypatch.setenv("CLAIMS_API_URL", "http://127.0.0.1:9")  # built, never sent: the mock answers

    def replay(size: int) -> chatrun.Session:
        session, _ = session_with(write_bot, [call("send_newest", claim="C-1"), {"text": "Sent."}])
        session.tool_mocks = TranscriptMocks([{"tool": "send_newest", "result": {"status": 201}, "request": {
            "method": "POST", "form": {"claim": "C-1"},
            "files": {"photo": {"name": "parcel.png", "media_type": "image/png", "size": size}}}}],
            file="claims.test.yaml", lines=[12])
        send(session, "The photo", PNG, "image/png", "parcel.png")
        return session

    ok = replay(len(PNG))
    assert ok.turn_count == 1, ok.last_turn.get("error")  # the mock answered: nothing was sent, the turn committed
    failed = replay(len(PNG) + 1)
    assert failed.turn_count == 0
    detail = failed.last_turn["error"]
    assert detail.startswith("claims.test.yaml:12: the request send_newest would send is not the one this mock expects: "
                             "files: expected")
    assert f'"size": {len(PNG)}' in detail


def test_validate_checks_multipart_bodies_at_their_line(write_bot):
    path = write_bot("""
        name: checks
        model: {provider: scripted}
        routes:
          main:
            default: true
            system: s
            tools: [no_files_here, twice, by_get]
        tools:
          no_files_here:
            description: d
            http:
              method: POST
              url: "http://127.0.0.1/up"
              multipart: {f: {file: "{{ attachments[-1] }}"}}
          twice:
            description: d
            http: {method: POST, url: "http://127.0.0.1/", json: {a: 1}, multipart: {b: "2"}}
          by_get:
            description: d
            http: {url: "http://127.0.0.1/", multipart: {b: "{{ attachments | length }}"}}
    """)
    _config, diagnostics = check_bot(path)
    found = {(d.severity, d.message): d.line for d in diagnostics}
    lines = path.read_text().splitlines()
    assert found[("warning", "tool `no_files_here` sends a file (`http.multipart.f`), but no route that offers it "
                  "(main) takes attachments (`attachments:`): its conversations have no file to send")] == \
        next(i for i, t in enumerate(lines, 1) if "multipart: {f:" in t)
    assert ("error", "`http` of tool `twice` has both `json` and `multipart`; a request has one body") in found
    assert ("error", "`http` of tool `by_get` sends a multipart body with GET; use POST, PUT or PATCH") in found
    assert not any("attachments" in m and "undeclared" in m for _, m in found)  # a variable of http templates


def test_a_file_sent_as_a_link_is_not_uploaded_and_the_model_is_told(api, write_bot):
    session, _ = session_with(write_bot, [call("send_newest", claim="C-2"), {"text": "Sorry."}])
    session.chat({"userMessage": "See", "attachments": [
        {"ref": "https://example.invalid/parcel.png", "media_type": "image/png", "name": "parcel.png"}]})
    assert api.requests == []
    assert tool_results(session) == ["Error: send_newest cannot send parcel.png: it was sent as a link, not as a "
                                     "file. Ask the user to attach the file itself."]
