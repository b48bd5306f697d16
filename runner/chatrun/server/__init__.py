"""`chatrun serve`: the WebSocket and HTTP API, the JavaScript client and the web chat page."""

from chatrun.server.app import create_app
from chatrun.server.wire import ServerLimits

__all__ = ["ServerLimits", "create_app"]
