"""Golden transcripts across bot versions (issue 23): a transcript starts on an older version
(`version:`) and a turn's `upgrade:` moves the session to a newer one by that version's
`on_change:`, as the server moves it; later turns check what the migration did."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from chatrun.cli import test as cli_test_module
from chatrun.errors import BotError
from chatrun.transcripts import load_transcript, run_transcript

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "bots" / "shop"


def shop_copy(tmp_path: Path, on_change: str | None = None) -> Path:
    """bots/shop (with its transcripts) in tmp_path; version 2's `on_change:` replaced."""
    root = tmp_path / "shop"
    shutil.copytree(SHOP, root)
    if on_change is not None:
        v2 = root / "versions" / "2" / "bot.yaml"
        v2.write_text(v2.read_text().replace("on_change: migrate", f"on_change: {on_change}"))
    return root


def transcript(root: Path, body: str, name: str = "t.yaml") -> Path:
    path = root / "transcripts" / name
    path.write_text("bot: ..\n" + textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    return path


def test_the_shop_transcripts_run_through_the_migration(tmp_path):
    root = shop_copy(tmp_path)
    for name in ("migrated_checkout.yaml", "migrated_basket.yaml"):
        result = run_transcript(str(root / "transcripts" / name))
        assert result.passed, result.report()
        assert [t.observed.route for t in result.turns][:3] in (["browse", "checkout", "payment"],
                                                                ["browse", "gift_wrap", "browse"])


@pytest.mark.parametrize(("policy", "route"), [("pin", "checkout"), ("restart_scope", "browse")])
def test_the_upgrade_follows_the_new_versions_policy(tmp_path, policy, route):
    """Under `pin` the session stays on version 1 (its route `checkout` is still there); under
    `restart_scope` no migration runs and the gone route restarts on the default one. Either
    way the transcript written for `migrate` fails at the upgrade turn, saying where it is."""
    root = shop_copy(tmp_path, policy)
    result = run_transcript(str(root / "transcripts" / "migrated_checkout.yaml"))
    assert not result.passed
    failed = result.failed_turns[0]
    assert failed.turn.index == 3 and failed.observed.route == route
    assert "route" in result.report() and "migrated_checkout.yaml:24" in result.report()
    state = failed.observed.visible["state"]
    if policy == "pin":
        assert state["email"] == "ana@example.com" and "currency" not in state
    else:  # moved without the migration: the new keys get their defaults, the old key stays
        assert state["contact"] == {"email": None} and state["currency"] == "EUR"


def test_without_the_upgrade_the_session_stays_on_its_version(tmp_path):
    root = shop_copy(tmp_path)
    path = root / "transcripts" / "migrated_checkout.yaml"
    path.write_text(path.read_text().replace("  - upgrade: 2\n    user:", "  - user:"))
    result = run_transcript(str(path))
    assert result.failed_turns[0].turn.index == 3 and result.failed_turns[0].observed.route == "checkout"


def test_a_version_the_bot_lacks_is_refused_at_its_line(tmp_path):
    root = shop_copy(tmp_path)
    path = transcript(root, """
        version: 3
        turns:
          - user: hi
            model: [{text: hello}]
        """)
    result = run_transcript(str(path))
    assert result.error is not None and result.error.startswith(f"{path}:2: `version:` bot .. has no version '3'")
    assert "it has: 1 (" in result.error and ", 2 (" in result.error
    code = CliRunner().invoke(cli_test_module.test, [str(path)], catch_exceptions=False)
    assert code.exit_code == 1 and f"{path}:2:" in code.output and "Traceback" not in code.output


def test_an_upgrade_to_an_older_version_is_refused(tmp_path):
    root = shop_copy(tmp_path)
    path = transcript(root, """
        version: 2
        turns:
          - user: hi
            model: [{text: hello}]
          - upgrade: 1
            user: again
            model: [{text: hello}]
        """)
    result = run_transcript(str(path))
    assert result.error is not None and result.error.startswith(f"{path}:6: `upgrade: 1` is not newer than version 2")


def test_an_upgrade_needs_the_starting_version(tmp_path):
    root = shop_copy(tmp_path)
    path = transcript(root, """
        turns:
          - upgrade: 2
            user: hi
            model: [{text: hello}]
        """)
    with pytest.raises(BotError) as raised:
        load_transcript(path)
    [diagnostic] = raised.value.diagnostics
    assert diagnostic.line == 3 and "needs the transcript's top-level `version:`" in diagnostic.message


def test_a_single_folder_bot_is_its_own_version(tmp_path):
    """`version:` on a bot without versions/ names its content hash (or its `version:`)."""
    import chatrun

    bot = tmp_path / "shop1"
    shutil.copytree(SHOP / "versions" / "1", bot)
    content = chatrun.load_bot(bot).config.content_version
    (bot / "transcripts").mkdir(exist_ok=True)  # versions/1 has transcripts of its own
    for wanted in (content, '"1"'):
        path = transcript(bot, f"""
            version: {wanted}
            turns:
              - user: hi
                model: [{{text: hello}}]
                expect: {{route: browse}}
            """)
        result = run_transcript(str(path))
        assert result.passed, result.report()
