"""Attachments: files a user sends are kept by reference in the session's blob area (once),
reach the model as the content parts its endpoint accepts, and go with the session. Through
the real `openai` SDK against a real uvicorn server whose model is the fake OpenAI server."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

import httpx
import openai
import pytest

import chatrun
from chatrun.messages import Attachment, UserMessage, message_from_dict
from chatrun.server import create_app
from chatrun.store.blobs import FolderBlobs, MemoryBlobs, blob_ref
from server_support import ThreadServer, write_travel

# A 1x1 PNG: real image bytes, small enough to read in a failure message.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


# The travel bot's menu takes images and PDFs, two per message, up to 1000 bytes each.
ATTACHMENTS = "    attachments: {kinds: [image/*, application/pdf], max_bytes: 1000, max_count: 3}\n"


@pytest.fixture
def travel(tmp_path):
    path = write_travel(tmp_path / "bots")
    text = path.read_text()
    path.write_text(text.replace("    tools: [book_flight, vip_lounge, remember_name]\n",
                                 "    tools: [book_flight, vip_lounge, remember_name]\n" + ATTACHMENTS, 1))
    return chatrun.load_bot(path)


@pytest.fixture
def server(fake, travel, tmp_path):
    with ThreadServer(create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}")) as s:
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def user_parts(request: dict) -> list[dict]:
    """The content parts of the last user message a model request carried."""
    last = [m for m in request["messages"] if m["role"] == "user"][-1]
    assert isinstance(last["content"], list), last
    return last["content"]


def session_of(completion) -> str:
    return completion.model_extra["chatrun"]["session"]


def test_an_image_reaches_the_model_as_a_content_part_is_stored_once_and_goes_with_the_session(
        client, fake, server, tmp_path):
    fake.queue({"text": "A small picture."}, {"text": "The same picture."})
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    first = client.chat.completions.create(model="travel", messages=messages)
    assert first.choices[0].message.content == "A small picture."
    assert user_parts(fake.requests[0]) == [{"type": "text", "text": "What is this?"}, image]

    messages += [{"role": "assistant", "content": "A small picture."},
                 {"role": "user", "content": [{"type": "text", "text": "And again?"}, image]}]
    second = client.chat.completions.create(model="travel", messages=messages)
    session = session_of(second)
    assert session == session_of(first)
    # The model is sent both turns' images (the memory keeps references, the bytes come from the area) ...
    sent = [p for m in fake.requests[1]["messages"] if m["role"] == "user" for p in m["content"]]
    assert sent.count(image) == 2
    # ... but the bytes are stored once, and never in the snapshot.
    area = FolderBlobs(tmp_path / "chat.db.blobs")
    assert area.refs(session) == [blob_ref(PNG)]
    assert area.read(session, blob_ref(PNG)) == PNG
    snapshot = httpx.get(f"{server.url}/bots/travel/sessions/{session}")
    assert snapshot.status_code == 200 and blob_ref(PNG) in snapshot.text
    assert base64.b64encode(PNG).decode() not in snapshot.text

    assert httpx.delete(f"{server.url}/bots/travel/sessions/{session}").status_code == 204
    assert area.refs(session) == []
    assert not any((tmp_path / "chat.db.blobs").iterdir())


def test_an_http_image_is_passed_on_by_its_url_and_a_pdf_as_a_file_part(client, fake, tmp_path):
    fake.queue({"text": "Seen."})
    url = {"type": "image_url", "image_url": {"url": "https://example.invalid/parcel.jpg"}}
    pdf = {"type": "file", "file": {"filename": "invoice.pdf",
                                    "file_data": "data:application/pdf;base64," + base64.b64encode(PDF).decode()}}
    reply = client.chat.completions.create(model="travel", messages=[
        {"role": "user", "content": [{"type": "text", "text": "My parcel and its invoice"}, url, pdf]}])
    assert user_parts(fake.requests[0]) == [{"type": "text", "text": "My parcel and its invoice"}, url, pdf]
    assert FolderBlobs(tmp_path / "chat.db.blobs").refs(session_of(reply)) == [blob_ref(PDF)]


def test_the_responses_api_takes_input_image_parts(client, fake):
    fake.queue({"text": "Seen."})
    client.responses.create(model="travel", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": PNG_URL}]}])
    assert user_parts(fake.requests[0])[1] == {"type": "image_url", "image_url": {"url": PNG_URL}}


@pytest.mark.parametrize(("part", "message"), [
    ({"type": "input_video", "input_video": {"data": "AAAA"}},
     "messages[0].content[0]: parts of type 'input_video' are not supported"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "flac"}},
     "messages[0].content[0]: input_audio.format must be wav or mp3, not 'flac'"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
     "attachments[0]: route main_menu takes image/*, application/pdf (attachments.kinds), not audio/wav"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
     "messages[0].content[0]: the data URL's base64 is invalid"),
    ({"type": "image_url", "image_url": {"url": "ftp://host/x.png"}},
     "messages[0].content[0]: expected a base64 data URL"),
    ({"type": "file", "file": {"file_id": "file-123"}},
     "messages[0].content[0]: a file part needs file_data"),
])
def test_a_part_chatrun_cannot_take_is_refused_naming_where_it_is(client, fake, part, message):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="travel", messages=[{"role": "user", "content": [part]}])
    assert message in caught.value.message
    assert fake.requests == []


def data_part(media_type: str, data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{base64.b64encode(data).decode()}"}}


@pytest.mark.parametrize(("parts", "limit"), [
    ([data_part("image/png", PNG)] * 4, "route main_menu takes at most 3 attachments per message "
                                        "(attachments.max_count), not 4"),
    ([data_part("image/png", PNG), data_part("text/csv", b"a,b")],
     "attachments[1]: route main_menu takes image/*, application/pdf (attachments.kinds), not text/csv"),
    ([data_part("image/png", bytes(1001))],
     "attachments[0]: 1001 bytes is over route main_menu's limit of 1000 (attachments.max_bytes)"),
])
def test_what_the_route_does_not_take_is_refused_naming_the_limit_and_nothing_is_stored(
        client, fake, tmp_path, parts, limit):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="travel", messages=[{"role": "user", "content": parts}])
    assert limit in caught.value.message
    assert caught.value.code == "attachment_refused"
    assert fake.requests == []
    assert not (tmp_path / "chat.db.blobs").exists() or not any((tmp_path / "chat.db.blobs").iterdir())


# -- audio, and what a model's endpoint accepts ---------------------------------------------------

# A WAV header and four silent samples: real audio bytes.
WAV = (b"RIFF" + (36 + 8).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
       + bytes.fromhex("01000100401f0000803e000002001000") + b"data" + (8).to_bytes(4, "little") + bytes(8))
AUDIO_PART = {"type": "input_audio", "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"}}


def voice_bot(tmp_path, accepts: str | None):
    """The travel bot whose menu takes images and audio; its model's `accepts:` as given."""
    path = write_travel(tmp_path / "voice")
    tools = "    tools: [book_flight, vip_lounge, remember_name]\n"
    text = path.read_text().replace(tools, tools + "    attachments: {kinds: [image/*, audio/*], max_bytes: 1000}\n", 1)
    if accepts is not None:
        text = text.replace("max_retries: 0}", f"max_retries: 0, accepts: {accepts}}}", 1)
    path.write_text(text)
    return chatrun.load_bot(path)


def ask_with_audio(bot, tmp_path, fake) -> list[dict]:
    """One /v1 turn whose message carries an image and a WAV: the parts the model was sent."""
    fake.queue({"text": "Heard you."})
    with ThreadServer(create_app([bot], f"sqlite:///{tmp_path / 'voice.db'}")) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        client.chat.completions.create(model="travel", messages=[{"role": "user", "content": [
            {"type": "text", "text": "Listen"}, {"type": "image_url", "image_url": {"url": PNG_URL}}, AUDIO_PART]}])
    return user_parts(fake.requests[0])


def test_audio_reaches_a_model_whose_endpoint_accepts_it_as_an_input_audio_part(fake, tmp_path):
    parts = ask_with_audio(voice_bot(tmp_path, "[text, image, audio]"), tmp_path, fake)
    assert parts == [{"type": "text", "text": "Listen"}, {"type": "image_url", "image_url": {"url": PNG_URL}},
                     AUDIO_PART]


def test_a_model_that_accepts_only_text_is_sent_descriptions_of_the_files(fake, tmp_path):
    parts = ask_with_audio(voice_bot(tmp_path, "[text]"), tmp_path, fake)
    assert parts == [{"type": "text", "text": "Listen"},
                     {"type": "text", "text": f"[attached: a file (image/png, {len(PNG)} bytes)]"},
                     {"type": "text", "text": f"[attached: audio.wav (audio/wav, {len(WAV)} bytes)]"}]


def test_a_model_that_declares_nothing_is_sent_images_and_told_of_audio(fake, tmp_path):
    parts = ask_with_audio(voice_bot(tmp_path, None), tmp_path, fake)
    assert parts[1] == {"type": "image_url", "image_url": {"url": PNG_URL}}
    assert parts[2] == {"type": "text", "text": f"[attached: audio.wav (audio/wav, {len(WAV)} bytes)]"}


def test_a_route_can_say_what_its_model_accepts(fake, tmp_path):
    bot = voice_bot(tmp_path, "[text, image, audio]")
    assert bot.config.model.accepts == ("text", "image", "audio")
    assert bot.config.model.merged({"accepts": ["text"]}).accepts == ("text",)


@pytest.mark.parametrize(("accepts", "message"), [
    ("[text, video]", "`model.accepts[1]` must be one of text, image, file, audio (got `video`)"),
    ("[]", "`model.accepts`: [] should be non-empty"),  # an endpoint takes at least text
])
def test_an_unknown_content_kind_is_refused_at_its_line(tmp_path, accepts, message):
    bot_file = write_travel(tmp_path / "bad")
    bot_file.write_text(bot_file.read_text().replace("max_retries: 0}", f"max_retries: 0, accepts: {accepts}}}", 1))
    with pytest.raises(chatrun.ChatrunError) as caught:
        chatrun.load_bot(bot_file)
    line = next(i for i, text in enumerate(bot_file.read_text().splitlines(), 1) if "accepts:" in text)
    assert f"{bot_file}:{line}:" in str(caught.value)
    assert message in str(caught.value)


# -- the engine and the blob area, without a server ----------------------------------------------


def test_a_session_attaches_a_file_and_sends_it_with_a_message(fake, travel):
    fake.queue({"text": "Got it."})
    area = MemoryBlobs()
    session = travel.session(blobs=area)
    attachment = session.attach(PNG, "image/png", "dot.png")
    assert attachment == Attachment(blob_ref(PNG), "image/png", "dot.png", len(PNG))
    session.chat({"userMessage": "Here", "attachments": [attachment.to_dict()]})
    assert user_parts(fake.requests[0])[1] == {"type": "image_url", "image_url": {"url": PNG_URL}}
    session.close()
    assert area.refs(session.id) == []


def test_files_alone_are_a_message(fake, travel):
    fake.queue({"text": "A dot."})
    session = travel.session(blobs=MemoryBlobs())
    attachment = session.attach(PNG, "image/png", "dot.png")
    session.chat({"userMessage": "", "attachments": [attachment.to_dict()]})
    assert user_parts(fake.requests[0]) == [{"type": "image_url", "image_url": {"url": PNG_URL}}]


def test_a_reference_the_session_does_not_hold_is_refused(travel):
    session = travel.session(blobs=MemoryBlobs())
    with pytest.raises(chatrun.SessionError, match=rf"session {session.id}: attachments\[0\]: no upload 'abc'"):
        session.chat({"userMessage": "Here", "attachments": [{"ref": "abc", "media_type": "image/png"}]})


def test_a_route_without_attachments_takes_none(fake, tmp_path):
    session = chatrun.load_bot(write_travel(tmp_path / "plain")).session(blobs=MemoryBlobs())
    with pytest.raises(chatrun.SessionError, match="route main_menu takes no attachments"):
        session.attach(PNG, "image/png")
    assert fake.requests == []


def test_a_memory_keeps_the_reference_and_describes_what_it_cannot_send():
    message = UserMessage("see", (Attachment(blob_ref(PNG), "image/png", "dot.png", len(PNG)),
                                  Attachment("f" * 64, "text/csv", "rows.csv", 12)))
    assert message_from_dict(message.to_dict()) == message
    assert message.to_openai()["content"][1:] == [  # no bytes to read: a text description
        {"type": "text", "text": f"[attached: dot.png (image/png, {len(PNG)} bytes)]"},
        {"type": "text", "text": "[attached: rows.csv (text/csv, 12 bytes)]"}]
    assert "rows.csv" in message.text()  # what token budgets count


def test_a_folder_keeps_each_blob_once_and_no_reference_leaves_its_session(tmp_path):
    area = FolderBlobs(tmp_path / "blobs")
    area.put("s1", PNG, "image/png")
    area.put("s1", PNG, "image/png")
    area.put("s2", PDF, "application/pdf")
    assert area.refs("s1") == [blob_ref(PNG)]
    assert area.read("s2", blob_ref(PNG)) is None
    assert area.read("s1", "../s2/" + blob_ref(PDF)) is None
    area.delete_session("s1")
    assert area.refs("s1") == [] and area.refs("s2") == [blob_ref(PDF)]


# -- the HTTP API: an upload endpoint, a reference in a message -------------------------------------


def test_a_file_uploaded_over_http_is_sent_by_its_reference(server, fake, tmp_path):
    fake.queue({"text": "A dot."})
    base = f"{server.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    uploaded = httpx.post(f"{base}/{session}/attachments", json={
        "media_type": "image/png", "name": "dot.png", "data": base64.b64encode(PNG).decode()})
    assert uploaded.status_code == 201, uploaded.text
    assert uploaded.json() == {"ref": blob_ref(PNG), "media_type": "image/png", "name": "dot.png", "size": len(PNG)}
    reply = httpx.post(f"{base}/{session}/messages", json={"userMessage": "What is it?",
                                                           "attachments": [uploaded.json()]})
    assert reply.status_code == 200, reply.text
    assert user_parts(fake.requests[0]) == [{"type": "text", "text": "What is it?"},
                                            {"type": "image_url", "image_url": {"url": PNG_URL}}]
    assert FolderBlobs(tmp_path / "chat.db.blobs").refs(session) == [blob_ref(PNG)]


def test_an_upload_or_reference_the_route_does_not_take_is_a_bad_request(server, fake):
    base = f"{server.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    csv = httpx.post(f"{base}/{session}/attachments", json={"media_type": "text/csv", "data": "YSxi"})
    assert csv.status_code == 400
    assert "route main_menu takes image/*, application/pdf (attachments.kinds), not text/csv" in csv.text
    big = httpx.post(f"{base}/{session}/attachments", json={
        "media_type": "image/png", "data": base64.b64encode(bytes(1001)).decode()})
    assert big.status_code == 413 and "route main_menu takes files of at most 1000 bytes (attachments.max_bytes)" in big.text
    unknown = httpx.post(f"{base}/{session}/messages", json={
        "userMessage": "Here", "attachments": [{"ref": "0" * 64, "media_type": "image/png"}]})
    assert unknown.status_code == 400
    assert f"attachments[0]: no upload '{'0' * 64}' in this session" in unknown.text
    assert fake.requests == []


def test_a_malformed_upload_or_reference_is_a_bad_request_naming_what_is_wrong(server, fake):
    base = f"{server.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    for media_type in ("", "not a type"):
        r = httpx.post(f"{base}/{session}/attachments", json={"media_type": media_type, "data": "YQ=="})
        assert r.status_code == 400 and f"attachments[0]: {media_type!r} is not a media type (type/subtype" in r.text
    upload = httpx.post(f"{base}/{session}/attachments", json={
        "media_type": "image/png", "data": base64.b64encode(PNG).decode()}).json()
    for reference, problem in (({"media_type": "image/png"}, "a reference needs ref"),
                               ({"ref": 5, "media_type": "image/png"}, "ref must be a string, not int"),
                               ({**upload, "size": "big"}, "size must be an integer, not str"),
                               ({**upload, "sha": "x"}, "a reference has no field 'sha'")):
        r = httpx.post(f"{base}/{session}/messages", json={"userMessage": "Here", "attachments": [reference]})
        assert r.status_code == 400 and f"attachments[0]: {problem}" in r.text, (reference, r.text)
    assert fake.requests == []
    # The limits (1000 bytes here) apply to the upload's own size, whatever the client says it is.
    fake.queue({"text": "A dot."})
    r = httpx.post(f"{base}/{session}/messages", json={"userMessage": "Here", "attachments": [{**upload, "size": 10**9}]})
    assert r.status_code == 200 and len(fake.requests) == 1, r.text


# -- issue 33: an upload is checked against its route before its body is read -------------------

# A second bot whose route takes far larger files: the travel bot's uploads keep their own limit.
ARCHIVE = """\
name: archive
format: 3
routes:
  chat:
    default: true
    description: Files
    system: Keep the files.
    attachments: {kinds: ["*/*"], max_bytes: 50000000, max_count: 1}
"""


@pytest.fixture
def two_bots(fake, travel, tmp_path):
    archive = tmp_path / "archive.yaml"
    archive.write_text(ARCHIVE)
    with ThreadServer(create_app([travel, chatrun.load_bot(archive)], "memory://")) as s:
        yield s


def announced(server, path: str, content_type: str, length: int) -> bytes:
    """The answer to a POST whose headers announce `length` bytes, none of which is sent:
    what the server says before it reads a body (a server that waits for it times out here)."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode())
        sock.settimeout(10)
        return sock.recv(65536)


def test_an_upload_is_refused_from_its_headers_by_its_own_route_before_its_body_is_read(two_bots):
    base = f"{two_bots.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    lounge = httpx.post(base, json={"route": "lounge"}).json()["id"]
    # The lounge takes no files: refused at once, whatever the body would have been.
    answer = announced(two_bots, f"/bots/travel/sessions/{lounge}/attachments", "application/json", 2000)
    assert answer.startswith(b"HTTP/1.1 400") and b"route lounge takes no attachments" in answer, answer
    # Over the menu's 1000 bytes by its Content-Length (the archive bot takes 50 MB: not this route's limit).
    answer = announced(two_bots, f"/bots/travel/sessions/{session}/attachments", "application/json", 5_000_000)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"route main_menu takes files of at most 1000 bytes (attachments.max_bytes)" in answer
    # The file itself as the body: its kind is its Content-Type, refused before it is read.
    answer = announced(two_bots, f"/bots/travel/sessions/{session}/attachments", "text/csv", 10)
    assert answer.startswith(b"HTTP/1.1 415"), answer
    assert b"route main_menu takes image/*, application/pdf (attachments.kinds), not text/csv" in answer


def test_an_upload_without_a_length_is_refused_as_soon_as_it_passes_its_routes_limit(two_bots):
    base = f"{two_bots.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]

    def chunks():
        for _ in range(200):  # 3.2 MB, no Content-Length; the route takes 1000 bytes
            yield b"A" * 16384

    for content_type in ("application/json", "image/png"):
        r = httpx.post(f"{base}/{session}/attachments", content=chunks(), headers={"content-type": content_type})
        assert r.status_code == 413, r.text
        assert "route main_menu takes files of at most 1000 bytes (attachments.max_bytes)" in r.json()["message"]
    assert httpx.get(f"{two_bots.url}/bots/travel/sessions/{session}").status_code == 200  # the session is served on


def test_a_file_can_be_uploaded_as_the_body_itself_in_its_own_type(server, fake, tmp_path):
    base = f"{server.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    r = httpx.post(f"{base}/{session}/attachments", params={"name": "dot.png"}, content=PNG,
                   headers={"content-type": "image/png"})
    assert r.status_code == 201, r.text
    assert r.json() == {"ref": blob_ref(PNG), "media_type": "image/png", "name": "dot.png", "size": len(PNG)}
    assert FolderBlobs(tmp_path / "chat.db.blobs").read(session, blob_ref(PNG)) == PNG
    # Never a type a page of another site can POST without asking (a form, text/plain).
    for simple in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(f"{base}/{session}/attachments", content=b"a,b", headers={"content-type": simple})
        assert r.status_code == 415 and r.json()["error"] == "UnsupportedMediaType", (simple, r.text)


# -- issue 33: what one session's files may take, on every store ----------------------------------


@pytest.mark.parametrize("store", ["memory://?max_blob_files=2&max_blob_bytes=500",
                                   "sqlite:///{tmp}/chat.db?max_blob_files=2&max_blob_bytes=500"])
def test_a_sessions_files_are_capped_on_every_store_naming_the_cap(fake, travel, tmp_path, store):
    with ThreadServer(create_app([travel], store.format(tmp=tmp_path))) as srv:
        base = f"{srv.url}/bots/travel/sessions"
        session = httpx.post(base, json={}).json()["id"]

        def upload(data: bytes) -> httpx.Response:
            return httpx.post(f"{base}/{session}/attachments", content=data, headers={"content-type": "image/png"})

        assert upload(bytes(100)).status_code == 201 and upload(bytes(101)).status_code == 201
        assert upload(bytes(100)).status_code == 201  # the same bytes again take nothing
        third = upload(bytes(102))
        assert third.status_code == 400
        assert (f"session {session}: it holds 2 files, the store's limit per session "
                "(max_blob_files=2 in the store URL)") in third.json()["message"]
        other = httpx.post(base, json={}).json()["id"]
        r = httpx.post(f"{base}/{other}/attachments", content=bytes(400), headers={"content-type": "image/png"})
        assert r.status_code == 201
        r = httpx.post(f"{base}/{other}/attachments", content=bytes(101), headers={"content-type": "image/png"})
        assert r.status_code == 400 and ("its files would take 501 bytes, over the store's limit of 500 bytes "
                                         "per session (max_blob_bytes in the store URL)") in r.json()["message"]
    if store.startswith("sqlite"):
        assert len(FolderBlobs(tmp_path / "chat.db.blobs").refs(session)) == 2
        assert not [p for p in tmp_path.iterdir() if "?" in p.name], "the URL's query is no part of a file's name"


def test_the_openai_api_keeps_files_within_the_stores_cap(fake, travel, tmp_path):
    with ThreadServer(create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}?max_blob_files=1")) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
        fake.queue({"text": "A dot."})
        parts = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": PNG_URL}}]
        first = client.chat.completions.create(model="travel", messages=[{"role": "user", "content": parts}])
        other = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
        parts = [{"type": "text", "text": "And this?"}, {"type": "file", "file": {"file_data": other, "filename": "a.pdf"}}]
        with pytest.raises(openai.BadRequestError, match=r"it holds 1 files, the store's limit per session "
                                                         r"\(max_blob_files=1 in the store URL\)"):
            client.chat.completions.create(model="travel", messages=[{"role": "user", "content": parts}],
                                           extra_headers={"x-chatrun-session": session_of(first)})


def test_the_default_caps_and_a_bad_parameter_are_said(tmp_path):
    from chatrun.store import open_store
    from chatrun.store.blobs import DEFAULT_MAX_BLOB_FILES, blobs_for_url

    blobs = blobs_for_url(f"sqlite:///{tmp_path / 'chat.db'}")
    assert isinstance(blobs, FolderBlobs) and blobs.quota.max_bytes == 256 * 2**20
    for i in range(DEFAULT_MAX_BLOB_FILES):
        blobs.put("s", i.to_bytes(2, "big"), "image/png")
    with pytest.raises(chatrun.AttachmentRefused, match="it holds 100 files, the store's limit per session"):
        blobs.put("s", b"one more", "image/png")
    assert MemoryBlobs().quota.max_bytes == 32 * 2**20
    with pytest.raises(chatrun.ChatrunError, match="max_blob_files must be a positive number, not 'many'"):
        open_store(f"sqlite:///{tmp_path / 'x.db'}?max_blob_files=many")
    with pytest.raises(chatrun.ChatrunError, match="unknown URL parameter `max_files`"):
        open_store("memory://?max_files=3")


# -- the WebSocket: a reference in a frame, never the bytes ---------------------------------------


def test_a_websocket_message_carries_a_reference_to_an_upload(fake, travel, tmp_path):
    from starlette.testclient import TestClient

    from server_support import app_for_testclient, until_done

    fake.queue({"text": "A dot."})
    with TestClient(app_for_testclient([travel], f"sqlite:///{tmp_path / 'chat.db'}")) as client:
        with client.websocket_connect("/_chat/routes") as ws:
            ws.send_json({"type": "Connect", "chatId": "c1", "extensions": True})
            until_done(ws)
            uploaded = client.post("/bots/travel/sessions/c1/attachments", json={
                "media_type": "image/png", "data": base64.b64encode(PNG).decode()}).json()
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c1",
                          "data": {"userMessage": "Look", "attachments": [uploaded]}})
            assert [f["type"] for f in until_done(ws)][-1] == "Completed"
            assert user_parts(fake.requests[0])[1] == {"type": "image_url", "image_url": {"url": PNG_URL}}
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c1",
                          "data": {"userMessage": "Look", "attachments": [{"ref": "f" * 64, "media_type": "image/png"}]}})
            frames = until_done(ws)
            assert frames[-1] == {"chatId": "c1", "type": "Failed", "data": "BadRequest"}
            assert "attachments[0]: no upload" in json.dumps(frames), frames


# -- what the web page reads: the routes' limits, an upload read back ------------------------------


def test_the_bot_graph_names_each_routes_attachment_limits(server):
    nodes = {n["name"]: n for n in httpx.get(f"{server.url}/bots/travel").json()["graph"]["nodes"]}
    assert nodes["main_menu"]["attachments"] == {"kinds": ["image/*", "application/pdf"], "max_bytes": 1000,
                                                 "max_count": 3}
    assert nodes["flight"]["attachments"] is None


def test_an_upload_is_read_back_by_its_session_as_an_opaque_download(server):
    base = f"{server.url}/bots/travel/sessions"
    session, other = (httpx.post(base, json={}).json()["id"] for _ in range(2))
    ref = httpx.post(f"{base}/{session}/attachments", json={
        "media_type": "image/png", "data": base64.b64encode(PNG).decode()}).json()["ref"]
    read = httpx.get(f"{base}/{session}/attachments/{ref}")
    assert read.status_code == 200 and read.content == PNG
    # Not rendered by a browser as whatever the uploader said it was: the page types it itself.
    assert read.headers["content-type"] == "application/octet-stream"
    assert read.headers["x-content-type-options"] == "nosniff"
    assert read.headers["content-disposition"] == "attachment"
    missing = httpx.get(f"{base}/{other}/attachments/{ref}")
    assert missing.status_code == 404 and f"session {other} has no upload" in missing.json()["message"]
    assert httpx.get(f"{base}/{session}/attachments/{'0' * 64}").status_code == 404


# -- transcripts: `attach:` fixture files ----------------------------------------------------------

CLAIMS = Path(__file__).resolve().parents[1] / "bots" / "claims"


def run_claims_transcript(tmp_path, turns: str):
    from chatrun.transcripts.run import run_transcript

    (tmp_path / "photo.png").write_bytes(PNG)
    (tmp_path / "files").mkdir(exist_ok=True)
    path = tmp_path / "t.yaml"
    path.write_text(f"bot: {CLAIMS}\nturns:\n{turns}")
    return run_transcript(str(path))


def test_a_transcript_turn_attaches_a_file_and_sent_shows_the_part_the_model_received(tmp_path):
    result = run_claims_transcript(tmp_path, """\
  - user: Look
    attach: [photo.png]
    model: [{text: A dot.}]
    expect:
      sent: [{messages: [{user: "Look\\n[image_url: photo.png (image/png, 1 bytes)]"}]}]
""")
    assert not result.passed
    report = result.report()
    assert "turn 1 (" in report and "sent differs" in report
    assert f"+      [image_url: photo.png (image/png, {len(PNG)} bytes)]" in report


def test_a_file_the_route_does_not_take_fails_the_turn_naming_the_limit_unless_expected(tmp_path):
    turn = "  - user: Look\n    attach: [{file: photo.png, media_type: text/csv}]\n"
    refused = run_claims_transcript(tmp_path, turn)
    assert "takes image/png, image/jpeg, application/pdf (attachments.kinds), not text/csv" in refused.report()
    expected = run_claims_transcript(tmp_path, turn + "    expect: {error: {contains: attachments.kinds}}\n")
    assert expected.passed, expected.report()


@pytest.mark.parametrize(("turn", "message"), [
    ("  - user: Look\n    attach: [nowhere.png]\n", "t.yaml:4:14: error: `turns[0].attach[0]`: no file nowhere.png beside the transcript"),
    ("  - user: Look\n    attach: [photo.png, {file: photo.png, name: x}]\n    model: [{text: ok}]\n", None),
    ("  - user: Look\n    attach: [{file: photo.png, name: scan}]\n    model: [{text: ok}]\n", None),
    ("  - approve: p1\n    attach: [photo.png]\n", "t.yaml:4:5: error: `attach:` goes with a message"),
    ("  - user: Look\n    attach: [files]\n", "t.yaml:4:14: error: `turns[0].attach[0]`: files is a folder"),
    ("  - user: Look\n    attach: [{file: photo.png, media_type: 5}]\n",
     "t.yaml:4:32: error: `turns[0].attach[0].media_type` must be text, but YAML read 5"),
    ("  - user: Look\n    attach: [{fil: photo.png}]\n",
     "t.yaml:4:15: error: unknown key `fil` in `turns[0].attach[0]`; allowed: file, media_type, name"),
    ("  - user: Look\n    attach: photo.png\n", "t.yaml:4:5: error: `turns[0].attach` must be a list, not a string"),
])
def test_attach_files_are_checked_at_their_lines(tmp_path, turn, message):
    result = run_claims_transcript(tmp_path, turn)
    if message is None:
        assert result.passed, result.report()
    else:
        assert message in (result.error or ""), result.error
def test_a_redis_stores_blob_cap_is_a_url_parameter_chatrun_keeps_to_itself():
    from chatrun.store.redis import RedisStore, redis_url_parts

    assert redis_url_parts("redis://h:1/0?prefix=x:&max_blob_bytes=9&ssl_cert_reqs=none") == (
        "redis://h:1/0?ssl_cert_reqs=none", "x:")
    assert RedisStore("redis://127.0.0.1:1/0?max_blob_bytes=9").blob_area.max_bytes == 9  # nothing connects yet
    assert RedisStore("redis://127.0.0.1:1/0?max_blob_files=3").blob_area.quota.max_files == 3
    with pytest.raises(chatrun.ChatrunError, match="max_blob_bytes must be a positive number of bytes, not 'lots'"):
        RedisStore("redis://127.0.0.1:1/0?max_blob_bytes=lots")
