"""The OpenAI API of `chatrun serve` driven by the official `openai` npm package in Node:
a whole flight booking streamed through chat.completions, then through responses with
previous_response_id. The package is installed with npm into a temporary folder; without
node, npm or a reachable registry the test is skipped with one line saying so."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import pytest

import chatrun
from chatrun.server import create_app
from server_support import ThreadServer, call, write_travel

SCRIPT = textwrap.dedent("""
    import OpenAI from "openai";

    const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });

    async function streamChat(messages) {
      const stream = await client.chat.completions.create({
        model: "travel", messages, stream: true, stream_options: { include_usage: true },
      });
      let text = "", usage = null, chatrun = null;
      for await (const chunk of stream) {
        if (chunk.choices.length) text += chunk.choices[0].delta.content ?? "";
        if (chunk.chatrun) chatrun = chunk.chatrun;
        if (chunk.usage) usage = chunk.usage;
      }
      return { text, usage, chatrun };
    }

    async function streamResponse(input, previous_response_id) {
      const stream = await client.responses.create({ model: "travel", input, previous_response_id, stream: true });
      let deltas = [], final = null;
      for await (const event of stream) {
        if (event.type === "response.output_text.delta") deltas.push(event.delta);
        if (event.type === "response.completed") final = event.response;
      }
      return { text: deltas.join(""), id: final.id, session: final.chatrun.session, stack: final.chatrun.stack };
    }

    const messages = [{ role: "user", content: "I want to fly to Dublin" }];
    const first = await streamChat(messages);
    messages.push({ role: "assistant", content: first.text }, { role: "user", content: "July 1st" });
    const second = await streamChat(messages);
    const r1 = await streamResponse("I want to fly to Dublin");
    const r2 = await streamResponse("July 1st", r1.id);
    let notFound = null;
    try {
      await client.chat.completions.create({ model: "nope", messages });
    } catch (err) {
      notFound = { name: err.constructor.name, status: err.status, code: err.code };
    }
    console.log(JSON.stringify({ first, second, r1, r2, notFound }));
""")


@pytest.fixture(scope="module")
def node_openai(tmp_path_factory):
    """A folder where `import "openai"` resolves, or a skip saying why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed for the Node client test")
    folder = tmp_path_factory.mktemp("node-openai")
    (folder / "package.json").write_text('{"type": "module", "private": true}')
    try:
        done = subprocess.run([npm, "install", "openai", "--no-audit", "--no-fund", "--silent"], cwd=folder,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install openai took over 5 minutes (registry unreachable?)")
    if done.returncode != 0:
        pytest.skip(f"npm install openai failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    (folder / "book.mjs").write_text(SCRIPT)
    return folder


@pytest.mark.subprocess  # npm and node
def test_a_booking_streamed_by_the_openai_npm_package(node_openai, fake, tmp_path):
    booking = [call("book_flight"), call("set_destination", destination="Dublin"),
               {"chunks": ["When do ", "you leave?"]}, call("set_departure", date="2026-07-01"), call("book")]
    fake.queue(*booking, *booking)
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    with ThreadServer(create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}")) as server:
        done = subprocess.run(["node", "book.mjs", server.url + "/v1"], cwd=node_openai,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    booked = "Your flight to Dublin on 2026-07-01 is booked."
    assert result["first"]["text"] == "When do you leave?"
    assert result["first"]["chatrun"]["stack"] == ["main_menu", "flight"]
    assert result["second"]["text"] == booked
    assert result["second"]["chatrun"]["how"] == "continued"
    assert result["second"]["chatrun"]["session"] == result["first"]["chatrun"]["session"]
    assert result["second"]["usage"]["total_tokens"] > 0
    assert result["r1"]["text"] == "When do you leave?"
    assert result["r2"]["text"] == booked and result["r2"]["stack"] == ["main_menu"]
    assert result["r2"]["session"] == result["r1"]["session"] != result["first"]["chatrun"]["session"]
    assert result["notFound"] == {"name": "NotFoundError", "status": 404, "code": "model_not_found"}
