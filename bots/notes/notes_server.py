"""A small MCP server for bots/notes, built with the official `mcp` SDK.

    python notes_server.py                 # stdio (how bot.yaml starts it)
    python notes_server.py --http 8931     # streamable HTTP on 127.0.0.1:8931/mcp

Notes live in memory, per server process.
"""

from __future__ import annotations

import argparse
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
NOTES: dict[str, str] = {}


@server.tool()
def add_note(title: str, text: str) -> dict:
    """Save a note under a title (replacing a note of the same title)."""
    NOTES[title] = text
    return {"saved": title, "count": len(NOTES)}


@server.tool()
def search_notes(query: str) -> dict:
    """Find notes whose title or text contains the query (case-insensitive)."""
    q = query.lower()
    found = [{"title": t, "text": x} for t, x in NOTES.items() if q in t.lower() or q in x.lower()]
    return {"query": query, "found": found}


@server.tool()
def crash() -> str:
    """Stop the server at once (for testing how chatrun restarts it)."""
    os._exit(3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT instead of stdio")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")
