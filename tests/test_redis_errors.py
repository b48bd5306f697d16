"""An error reply of a real Redis made to fail (out of memory, a key of another type) reaches
callers, logs and HTTP answers as the command and the error's kind, never with a value written
(store/redis_errors.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from chatrun.errors import ChatrunError
from chatrun.store.redis import RedisStore
from chatrun.store.redis_blobs import RedisBlobs

SECRET = "card 4929-1234-5678-9012"


@pytest.fixture
def full(redis_server):
    """A Redis whose maxmemory is 1 byte (no eviction): every write is refused with OOM."""
    admin = redis.Redis(port=redis_server.port)
    before = admin.config_get("maxmemory")["maxmemory"], admin.config_get("maxmemory-policy")["maxmemory-policy"]
    admin.config_set("maxmemory-policy", "noeviction")
    yield lambda: admin.config_set("maxmemory", "1")
    admin.config_set("maxmemory", before[0])
    admin.config_set("maxmemory-policy", before[1])
    admin.close()


async def refusal(coro) -> str:
    with pytest.raises(ChatrunError) as caught:
        await coro
    return str(caught.value)


def test_a_failed_pipeline_write_names_its_command_not_its_value(redis_server, full):
    async def run() -> None:
        store = RedisStore(redis_server.url())
        full()
        text = await refusal(store.put_record_text("k", f'{{"said": "{SECRET}"}}', "s1"))
        assert SECRET not in text and "4929" not in text
        assert "Redis refused SET (OOM)" in text and "maxmemory" in text and store.url in text
        text = await refusal(store.claim_record("k2", {"said": SECRET}))
        assert SECRET not in text and "Redis refused SET (OOM)" in text
        await store.close()

    asyncio.run(run())


def test_a_key_of_another_type_is_named_as_such(redis_server):
    async def run() -> None:
        store = RedisStore(redis_server.url())
        admin = redis.Redis(port=redis_server.port)
        admin.set(f"{store.prefix}recs", SECRET)  # another program's value under the store's prefix
        text = await refusal(store.put_record_text("k", f'{{"said": "{SECRET}"}}', "s1"))
        assert SECRET not in text and "Redis refused ZADD (WRONGTYPE)" in text and "prefix" in text
        admin.set(store._key("s", "s2"), SECRET)
        text = await refusal(store.load_session("s2"))
        assert SECRET not in text and "Redis refused HGETALL (WRONGTYPE)" in text
        admin.close()
        await store.close()

    asyncio.run(run())


def test_an_attached_file_refused_names_the_script_only(redis_server, full):
    url = redis_server.url()
    blobs = RedisBlobs(url.split("?")[0], "b" + url.rsplit("=", 1)[1])
    full()
    with pytest.raises(ChatrunError) as caught:
        blobs.put("s1", SECRET.encode(), "text/plain", "card.txt")
    assert SECRET not in str(caught.value) and "(OOM)" in str(caught.value)
    blobs.close()


@pytest.mark.slow  # a server in process, against its own redis-server's keys
def test_a_turn_redis_refuses_answers_and_logs_no_value(redis_server, full, tmp_path, fake, caplog):
    from fastapi.testclient import TestClient

    import chatrun
    from server_support import app_for_testclient, write_travel

    fake.responder = lambda body: {"text": "ok"}
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], redis_server.url())
    caplog.set_level(logging.DEBUG)
    with TestClient(app) as c:
        assert c.post("/bots/travel/sessions", json={"id": "g"}).status_code == 201
        full()
        r = c.post("/bots/travel/sessions/g/messages", json={"userMessage": f"my {SECRET}"})
        v1 = c.post("/v1/chat/completions", json={"model": "travel", "messages": [
            {"role": "user", "content": f"my {SECRET}"}]})
    assert r.status_code >= 500 and v1.status_code >= 500, (r.text, v1.text)
    assert "OOM" in r.text and SECRET not in r.text and SECRET not in v1.text
    assert SECRET not in caplog.text and "(OOM)" in caplog.text
