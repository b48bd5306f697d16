"""Garbage-collector settings a command may choose for its own process (the loader's pause,
chatrun.definition.collector, which `load_config` now takes itself)."""

from __future__ import annotations

from chatrun.definition.collector import collector_paused

__all__ = ["collector_paused"]
