"""A token window sized to the model's context (`max_tokens: {context_size, reply_reserve}`) keeps
the request the model is sent within that context, whatever the conversation holds: an image a
user attached costs the model far more tokens than the line describing it. Through a real
session and the real `openai` SDK against the fake OpenAI server; the images are real PNGs whose
cost is computed from their size by OpenAI's rule for `detail: high` (what `auto` gives a large
image)."""

from __future__ import annotations

import json
import math
import struct
import zlib

import pytest
import tiktoken

import chatrun
from chatrun.memory.tokens import IMAGE_TOKENS, estimate_counter, tiktoken_counter
from chatrun.messages import Attachment, UserMessage
from chatrun.store.blobs import MemoryBlobs

pytestmark = pytest.mark.needs_encodings

CONTEXT, RESERVE = 8000, 1000

BOT = f"""
name: gallery
model: {{provider: openai, name: gpt-4o, max_retries: 0}}
routes:
  main:
    default: true
    system: Describe the pictures.
    attachments: {{kinds: [image/*], max_bytes: 100000, max_count: 3}}
    memory: {{type: token_window, max_tokens: {{context_size: {CONTEXT}, reply_reserve: {RESERVE}}}}}
"""


def png(width: int, height: int, grey: int) -> bytes:
    """A real PNG of that size, one shade of grey (small once compressed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([grey]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def openai_image_tokens(width: int, height: int) -> int:
    """What gpt-4o spends on an image at `detail: high`: fit in 2048x2048, shortest side scaled to
    768, then 170 per 512-pixel tile plus 85."""
    scale = min(1.0, 2048 / max(width, height))
    width, height = width * scale, height * scale
    scale = 768 / min(width, height)
    width, height = width * scale, height * scale
    return 85 + 170 * math.ceil(width / 512) * math.ceil(height / 512)


def request_tokens(request: dict, image_tokens: int) -> int:
    """The tokens of a Chat Completions request's messages: their text (o200k_base, 4 a message),
    each image part at `image_tokens`."""
    enc = tiktoken.get_encoding("o200k_base")
    total = 0
    for message in request["messages"]:
        content = message.get("content") or ""
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            total += image_tokens if part["type"] == "image_url" else len(enc.encode(part.get("text", "")))
        total += 4
    return total


def test_a_context_sized_window_keeps_a_conversation_of_images_within_the_context(fake, write_bot):
    session = chatrun.load_bot(write_bot(BOT)).session(blobs=MemoryBlobs())
    cost = openai_image_tokens(768, 2048)  # 2 x 4 tiles: the most one image costs gpt-4o
    assert (cost, openai_image_tokens(1024, 1024), openai_image_tokens(2048, 4096)) == (1445, 765, 1105)  # OpenAI's examples
    for turn in range(6):
        fake.queue({"text": f"Three grey pictures, turn {turn}."})
        refs = [session.attach(png(768, 2048, 3 * turn + i), "image/png", f"p{turn}{i}.png") for i in range(3)]
        session.chat({"userMessage": f"What is in these, turn {turn}?", "attachments": [a.to_dict() for a in refs]})
    sent = fake.requests[-1]
    assert sum(part["type"] == "image_url" for m in sent["messages"] if isinstance(m["content"], list)
               for part in m["content"]) >= 3  # the last turn's pictures are sent
    assert request_tokens(sent, cost) <= CONTEXT - RESERVE


def test_an_image_counts_its_cost_with_tiktoken_and_with_the_estimate_a_pdf_its_description():
    image = Attachment("a" * 64, "image/png", "p.png", 1234)
    pdf = Attachment("b" * 64, "application/pdf", "menu.pdf", 1234)
    for count in (tiktoken_counter("o200k_base"), estimate_counter):
        text = count(UserMessage("look", (pdf,)))
        assert count(UserMessage("look", (image, image))) >= 2 * IMAGE_TOKENS
        assert text < 50  # a PDF: its description only


WORDS = " ".join(f"word{i}" for i in range(400))  # ~1,200 tokens of o200k_base

TOOLS_BOT = f"""
name: helpdesk
model: {{provider: openai, name: gpt-4o, max_retries: 0}}
routes:
  main:
    default: true
    system: Help.
    context: "Reference for this call: {WORDS}"
    tools: [lookup]
    memory: {{type: token_window, max_tokens: {{context_size: {CONTEXT}, reply_reserve: {RESERVE}}}}}
tools:
  lookup:
    description: "Looks a ticket up. {WORDS}"
    parameters: {{type: object, properties: {{ticket: {{type: string, description: "{WORDS}"}}}}}}
    action: {{reply: found}}
"""


def test_a_context_sized_window_leaves_room_for_the_tools_and_the_context_it_is_sent_with(fake, write_bot):
    """The request is the memory and, beside it, the offered tools' schemas and the route's
    `context:`: the window holds what is left of the context once they are counted."""
    session = chatrun.load_bot(write_bot(TOOLS_BOT)).session()
    for turn in range(20):
        fake.queue({"text": f"Answer {turn}: " + " ".join(["fine"] * 300)})
        session.chat(f"Question {turn}: " + " ".join(["why"] * 300))
    sent = fake.requests[-1]
    enc = tiktoken.get_encoding("o200k_base")
    tools = len(enc.encode(json.dumps(sent["tools"])))
    assert tools > 1500  # what the window must leave room for
    assert request_tokens(sent, 0) + tools <= CONTEXT - RESERVE
    assert "Question 19" in sent["messages"][-2]["content"]  # the turn's own message is sent
