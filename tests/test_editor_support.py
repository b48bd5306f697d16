"""Editor support (issue 15): every schema description has hover text (markdownDescription,
with the examples), checked here and shown by a real yaml-language-server on hover."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from chatrun.definition.schema_docs import (
    _descriptions,
    add_markdown,
    markdown,
    missing,
    schema_files,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", schema_files(), ids=lambda p: p.name)
def test_every_description_has_hover_text_and_it_is_up_to_date(path):
    text = path.read_text(encoding="utf-8")
    assert missing(text) == []  # else: python -m chatrun.definition.schema_docs
    assert add_markdown(text) == text
    for node, _key, annotation in _descriptions(json.loads(text)):
        if annotation:
            assert node["markdownDescription"].startswith(node["description"])


def test_examples_are_shown_as_yaml_under_their_key():
    node = {"description": "The bot's name.", "examples": ["travel", "hello"]}
    assert markdown(node, "name") == "The bot's name.\n\n**Examples**\n\n```yaml\nname: travel\nname: hello\n```"
    bot = json.loads(schema_files()[0].read_text())
    assert "```yaml\nname: travel" in bot["properties"]["name"]["markdownDescription"]


def test_a_missing_one_is_found_and_added_without_touching_the_layout():
    text = '{\n  "type": "object",\n  "properties": {\n    "a": {"type": "string", "description": "A thing.", "examples": ["x"]}\n  }\n}\n'
    assert missing(text) == ["A thing."]
    added = add_markdown(text)
    assert added.splitlines()[:3] == text.splitlines()[:3] and len(added.splitlines()) == len(text.splitlines())
    assert json.loads(added)["properties"]["a"]["markdownDescription"] == "A thing.\n\n**Example**\n\n```yaml\na: x\n```"
    assert missing(added) == []


# -- a real language server --------------------------------------------------------------------------


def language_server() -> list[str] | None:
    local = REPO / ".venv" / "ylsp" / "node_modules" / "yaml-language-server" / "bin" / "yaml-language-server"
    if local.exists() and shutil.which("node"):
        return ["node", str(local), "--stdio"]
    found = shutil.which("yaml-language-server")
    return [found, "--stdio"] if found else None


class Lsp:
    """A minimal LSP client over stdio: Content-Length framed JSON-RPC."""

    def __init__(self, command: list[str]) -> None:
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0

    def send(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.proc.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        self.proc.stdin.flush()

    def read(self) -> dict:
        length = 0
        while (line := self.proc.stdout.readline().strip()):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(self.proc.stdout.read(length))

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self.read()
            if message.get("id") == self.next_id and "method" not in message:
                return message
            if "method" in message and "id" in message:  # the server asks (configuration): answer
                result = [{"hover": True, "validate": True, "schemas": {}}] * len(message["params"].get("items", [1])) \
                    if message["method"] == "workspace/configuration" else None
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})

    def notify(self, method: str, params: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.mark.subprocess
def test_the_yaml_language_server_shows_the_docs_on_hover(tmp_path):
    command = language_server()
    if command is None:
        pytest.skip("yaml-language-server is not installed (.ci/run installs it into .venv/ylsp)")
    bot = tmp_path / "bot.yaml"
    schema = schema_files()[0]
    text = f"# yaml-language-server: $schema={schema}\nname: demo\nmemory: {{type: none}}\nroutes:\n  main: {{default: true}}\n"
    bot.write_text(text)
    lsp = Lsp(command)
    result: dict = {}

    def talk() -> None:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": tmp_path.as_uri(),
                                   "capabilities": {"textDocument": {"hover": {"contentFormat": ["markdown"]}}}})
        lsp.notify("initialized", {})
        lsp.notify("workspace/didChangeConfiguration", {"settings": {"yaml": {"hover": True, "validate": True}}})
        lsp.notify("textDocument/didOpen", {"textDocument": {"uri": bot.as_uri(), "languageId": "yaml",
                                                             "version": 1, "text": text}})
        for line, word in ((1, "name"), (2, "memory")):
            answer = lsp.request("textDocument/hover", {"textDocument": {"uri": bot.as_uri()},
                                                        "position": {"line": line, "character": 1}})
            result[word] = answer.get("result")

    thread = threading.Thread(target=talk, daemon=True)
    thread.start()
    thread.join(60)
    lsp.close()
    assert not thread.is_alive(), "the language server did not answer in 60 s"
    schema_data = json.loads(schema.read_text())
    name_hover = result["name"]["contents"]["value"]
    assert schema_data["properties"]["name"]["description"] in name_hover
    assert "name: travel" in name_hover  # the example, from markdownDescription
    assert "memory" in result["memory"]["contents"]["value"].lower()
