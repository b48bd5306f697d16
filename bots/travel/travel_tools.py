"""Python handlers of the travel bot (named in the YAML as `travel_tools:FUNCTION`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def make_booking(ctx: Any) -> str:
    """Book the flight in `scope.reservation` and return its confirmation code.

    The code is derived from the reservation, so the same reservation always gets the
    same code (handy in transcripts and tests). A real bot would call a booking API here.
    """
    reservation = dict(ctx.scope["reservation"])
    digest = hashlib.sha256(json.dumps(reservation, sort_keys=True).encode()).hexdigest()
    code = "FL-" + digest[:6].upper()
    # The client can show the booking as structured data next to the chat.
    ctx.emit("Object", {"booking": code, **reservation})
    return code
