"""A bot whose Python handler builds an HTTP Basic credential from a `secret: true` variable and
says it back, as an API's error or echo would: the secret, as written and base64-encoded, in what
the turn keeps (tests/test_guardrails.py, tests/test_trace_secrets.py)."""

from __future__ import annotations

import base64

SECRET = "pa55-w0rd-of-the-service"
ENCODED = base64.b64encode(f"svc:{SECRET}".encode()).decode()  # the Basic credential the handler builds


def basic_bot(name: str, model: str, module: str) -> str:
    """The bot `name` (model: the YAML mapping's inside) whose `call_api` tool is `module`'s handler."""
    return f"""
name: {name}
model: {{{model}}}
env:
  API_PASSWORD: {{secret: true}}
routes:
  main: {{default: true, system: You help., tools: [call_api]}}
tools:
  call_api:
    description: Call the API
    handler: {module}:call_api
"""


def basic_handler(fails: bool) -> str:
    """The handler module: `call_api` raises the credential and the password in its error (`fails`)
    or returns them as its result."""
    said = "the API refused" if fails else "the API echoed"
    text = f'f"{said} Authorization: Basic {{credential}} (password {{os.environ[\'API_PASSWORD\']}})"'
    return f"""
import base64, os

def call_api(ctx):
    credential = base64.b64encode(("svc:" + os.environ["API_PASSWORD"]).encode()).decode()
    {f"raise RuntimeError({text})" if fails else f"return {text}"}
"""
