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


def hovers(command: list[str], root: Path, document: Path, spots: dict[str, tuple[int, int]]) -> dict:
    """Ask a real language server for the hover at each (line, character) of `document`."""
    text = document.read_text()
    lsp = Lsp(command)
    result: dict = {}

    def talk() -> None:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                   "capabilities": {"textDocument": {"hover": {"contentFormat": ["markdown"]}}}})
        lsp.notify("initialized", {})
        lsp.notify("workspace/didChangeConfiguration", {"settings": {"yaml": {"hover": True, "validate": True}}})
        lsp.notify("textDocument/didOpen", {"textDocument": {"uri": document.as_uri(), "languageId": "yaml",
                                                             "version": 1, "text": text}})
        for word, (line, character) in spots.items():
            answer = lsp.request("textDocument/hover", {"textDocument": {"uri": document.as_uri()},
                                                        "position": {"line": line, "character": character}})
            result[word] = answer.get("result")

    thread = threading.Thread(target=talk, daemon=True)
    thread.start()
    thread.join(60)
    lsp.close()
    assert not thread.is_alive(), "the language server did not answer in 60 s"
    return result


@pytest.mark.subprocess
def test_the_yaml_language_server_shows_the_docs_on_hover(tmp_path):
    command = language_server()
    if command is None:
        pytest.skip("yaml-language-server is not installed (.ci/run installs it into .venv/ylsp)")
    bot = tmp_path / "bot.yaml"
    schema = schema_files()[0]
    bot.write_text(f"# yaml-language-server: $schema={schema}\nname: demo\nmemory: {{type: none}}\n"
                   "routes:\n  main: {default: true}\n")
    result = hovers(command, tmp_path, bot, {"name": (1, 1), "memory": (2, 1)})
    schema_data = json.loads(schema.read_text())
    name_hover = result["name"]["contents"]["value"]
    assert schema_data["properties"]["name"]["description"] in name_hover
    assert "name: travel" in name_hover  # the example, from markdownDescription
    assert "memory" in result["memory"]["contents"]["value"].lower()


@pytest.mark.subprocess
def test_a_bot_made_by_init_shows_the_docs_on_hover_after_it_moved(tmp_path):
    # The modeline `chatrun init` writes points inside the bot, so a clone elsewhere (or a
    # machine without the author's virtualenv) still gets the docs.
    from click.testing import CliRunner

    from chatrun.cli import main

    command = language_server()
    if command is None:
        pytest.skip("yaml-language-server is not installed (.ci/run installs it into .venv/ylsp)")
    assert CliRunner().invoke(main, ["init", str(tmp_path / "made")]).exit_code == 0
    clone = tmp_path / "clone" / "mybot"
    shutil.copytree(tmp_path / "made", clone)
    shutil.rmtree(tmp_path / "made")
    bot = clone / "bot.yaml"
    lines = bot.read_text().splitlines()
    line = next(i for i, text in enumerate(lines) if text.startswith("name:"))
    result = hovers(command, clone, bot, {"name": (line, 1)})
    assert result["name"] is not None, "no hover: the modeline's schema was not found"
    schema_data = json.loads((clone / ".chatrun" / "schemas" / "bot.schema.json").read_text())
    assert schema_data["properties"]["name"]["description"] in result["name"]["contents"]["value"]
