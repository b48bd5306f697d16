"""The REPL's side of MCP servers' stderr: each stdio server the REPL starts writes its stderr
to a log file of its own, $XDG_STATE_HOME/chatrun/mcp/BOTDIR.SERVER.log (beside the REPL's
history), instead of over the prompt; the REPL says where once, when the bot has such servers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from chatrun.definition.config import BotConfig
from chatrun.toolkinds.mcp import servers_of
from chatrun.toolkinds.mcp_servers import McpServerConfig, send_stderr_to


def log_path(state_dir: Path, root: str, server: str) -> Path:
    return state_dir / "mcp" / f"{Path(root).resolve().name}.{server}.log"


def send_mcp_stderr_to_logs(state_dir: Path) -> None:
    """From now on, every stdio MCP server started in this process logs its stderr under `state_dir`."""

    def open_log(server: McpServerConfig, root: str) -> TextIO:
        path = log_path(state_dir, root, server.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        log = path.open("a", encoding="utf-8", buffering=1)
        # Appended across starts and sessions: a line says where each start begins.
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started: {' '.join(server.command)}\n")
        return log

    send_stderr_to(open_log)


def where_mcp_logs_go(config: BotConfig, state_dir: Path) -> str | None:
    """The note the REPL prints: which files the bot's stdio servers log to (None: it has none)."""
    stdio = [name for name, server in servers_of(config).items() if server.command]
    if not stdio:
        return None
    root = config.root or "."
    files = ", ".join(str(log_path(state_dir, root, name)) for name in stdio)
    return f"(MCP servers' stderr goes to {files})"
