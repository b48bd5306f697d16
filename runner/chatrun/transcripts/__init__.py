"""Golden transcripts: conversations replayed offline against a bot, with expectations.

    from chatrun.transcripts import load_transcript, run_transcript
    result = run_transcript("bots/travel/transcripts/flight_booking.yaml")
    assert result.passed, result.report()
"""

from chatrun.transcripts.format import Transcript, TurnSpec, discover, load_transcript
from chatrun.transcripts.run import Result, run_transcript

__all__ = ["Result", "Transcript", "TurnSpec", "discover", "load_transcript", "run_transcript"]
