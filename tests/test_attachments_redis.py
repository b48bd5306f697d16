"""Attachments on a Redis store: the blob area is in Redis, so every replica sees a file
another took; each file is kept once per session, within the store's cap, and goes with the
session. Two real uvicorn replicas on one real redis-server; the model is the fake OpenAI server."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
import redis

import chatrun
from chatrun.server import create_app
from chatrun.store.blobs import blob_ref
from server_support import ThreadServer, write_travel
from test_attachments import ATTACHMENTS, PNG, PNG_URL, user_parts

pytestmark = pytest.mark.slow

@pytest.fixture
def travel(tmp_path):
    """The travel bot whose menu takes images (tests/test_attachments.py's)."""
    path = write_travel(tmp_path / "bots")
    tools = "    tools: [book_flight, vip_lounge, remember_name]\n"
    path.write_text(path.read_text().replace(tools, tools + ATTACHMENTS, 1))
    return chatrun.load_bot(path)


UPLOAD = {"media_type": "image/png", "name": "dot.png", "data": base64.b64encode(PNG).decode()}


def blob_keys(url: str, session: str) -> tuple[redis.Redis, str, str]:
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    client = redis.Redis.from_url(url.split("?", 1)[0])
    return client, f"{prefix}b:{session}", f"{prefix}bn:{session}"


def test_a_file_uploaded_on_one_replica_reaches_the_model_from_the_other_once_and_goes_with_the_session(
        fake, travel, redis_server):
    url = redis_server.url()  # one key prefix, shared by both replicas
    fake.queue({"text": "A dot."}, {"text": "Still a dot."})
    with ThreadServer(create_app([travel], url)) as one, ThreadServer(create_app([travel], url)) as two:
        session = httpx.post(f"{one.url}/bots/travel/sessions", json={}).json()["id"]
        uploaded = httpx.post(f"{one.url}/bots/travel/sessions/{session}/attachments", json=UPLOAD)
        assert uploaded.status_code == 201, uploaded.text
        for text in ("What is it?", "And now?"):  # the second sends the same file again: kept once
            reply = httpx.post(f"{two.url}/bots/travel/sessions/{session}/messages",
                               json={"userMessage": text, "attachments": [uploaded.json()]})
            assert reply.status_code == 200, reply.text
        assert user_parts(fake.requests[0]) == [{"type": "text", "text": "What is it?"},
                                                {"type": "image_url", "image_url": {"url": PNG_URL}}]
        client, blobs, size = blob_keys(url, session)
        with client:
            assert client.hkeys(blobs) == [blob_ref(PNG).encode()]
            assert client.hget(blobs, blob_ref(PNG)) == PNG
            assert int(client.get(size)) == len(PNG)
            assert httpx.delete(f"{one.url}/bots/travel/sessions/{session}").status_code == 204
            assert client.exists(blobs, size) == 0


def test_an_image_sent_through_the_openai_sdk_is_kept_in_redis_and_read_by_the_other_replica(
        fake, travel, redis_server):
    url = redis_server.url()
    fake.queue({"text": "A dot."}, {"text": "The same dot."})
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    with ThreadServer(create_app([travel], url)) as one, ThreadServer(create_app([travel], url)) as two:
        with openai.OpenAI(base_url=one.url + "/v1", api_key="x", max_retries=0) as a:
            first = a.chat.completions.create(model="travel", messages=messages)
        messages += [{"role": "assistant", "content": "A dot."}, {"role": "user", "content": "Again?"}]
        with openai.OpenAI(base_url=two.url + "/v1", api_key="x", max_retries=0) as b:
            second = b.chat.completions.create(model="travel", messages=messages)
        session = first.model_extra["chatrun"]["session"]
        assert second.model_extra["chatrun"]["session"] == session
        # Replica two read the bytes of the first turn's image from Redis for its model call.
        sent = [p for m in fake.requests[1]["messages"] if m["role"] == "user" and isinstance(m["content"], list)
                for p in m["content"]]
        assert image in sent
        client, blobs, size = blob_keys(url, session)
        with client:
            assert client.hkeys(blobs) == [blob_ref(PNG).encode()]  # stored once
            assert httpx.delete(f"{two.url}/bots/travel/sessions/{session}").status_code == 204
            assert client.exists(blobs, size) == 0


def test_a_file_over_the_stores_cap_is_refused_naming_the_cap(fake, travel, redis_server):
    url = redis_server.url() + f"&max_blob_bytes={len(PNG) + 10}"
    with ThreadServer(create_app([travel], url)) as server:
        base = f"{server.url}/bots/travel/sessions"
        session = httpx.post(base, json={}).json()["id"]
        assert httpx.post(f"{base}/{session}/attachments", json=UPLOAD).status_code == 201
        assert httpx.post(f"{base}/{session}/attachments", json=UPLOAD).status_code == 201  # the same file: no more bytes
        other = {"media_type": "image/png", "data": base64.b64encode(PNG + b"!!!!!!!!!!!").decode()}
        refused = httpx.post(f"{base}/{session}/attachments", json=other)
    assert refused.status_code == 400
    assert (f"its files would take {2 * len(PNG) + 11} bytes, over the store's limit of {len(PNG) + 10} "
            "bytes per session (max_blob_bytes in the store URL)") in refused.text
    client, blobs, _ = blob_keys(url, session)
    with client:
        assert client.hlen(blobs) == 1


def test_a_sessions_file_count_is_capped_on_redis_too(fake, travel, redis_server):
    url = redis_server.url() + "&max_blob_files=2"
    with ThreadServer(create_app([travel], url)) as server:
        base = f"{server.url}/bots/travel/sessions"
        session = httpx.post(base, json={}).json()["id"]
        for data in (PNG, PNG + b"1", PNG):  # the same bytes again take nothing
            r = httpx.post(f"{base}/{session}/attachments", content=data, headers={"content-type": "image/png"})
            assert r.status_code == 201, r.text
        refused = httpx.post(f"{base}/{session}/attachments", content=PNG + b"2", headers={"content-type": "image/png"})
    assert refused.status_code == 400
    assert (f"session {session}: it holds 2 files, the store's limit per session (max_blob_files=2 in the "
            "store URL)") in refused.json()["message"]
    client, blobs, size = blob_keys(url, session)
    with client:
        assert client.hlen(blobs) == 2 and int(client.get(size)) == 2 * len(PNG) + 1


def test_the_stores_deletion_script_drops_the_sessions_files_with_it(redis_server):
    """The path every deletion of a Redis session takes (not only a live session's close)."""
    import asyncio

    from chatrun.store.redis import RedisStore

    url = redis_server.url()

    async def put_then_delete() -> tuple[list[str], list[str], list[str]]:
        store = RedisStore(url)
        try:
            store.blob_area.put("s1", PNG, "image/png")
            store.blob_area.put("s2", PNG, "image/png")
            before = store.blob_area.refs("s1")
            await store.delete_session("s1", [], None)
            return before, store.blob_area.refs("s1"), store.blob_area.refs("s2")
        finally:
            await store.close()

    before, after, other = asyncio.run(put_then_delete())
    assert before == [blob_ref(PNG)] and after == [] and other == [blob_ref(PNG)]
    client, blobs, size = blob_keys(url, "s1")
    with client:
        assert client.exists(blobs, size) == 0
