"""`chatrun report` on the stores tests/test_outcomes.py does not build: sessions of two bot
versions, one priced and one not (a figure's unit is the report's, for every group), and
users' text the page must show as text (a client's locale, the command's own outcome names:
no markup of theirs runs). A real SQLite store, the real command."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call
from chatrun.cli.report import report
from chatrun.store.sqlite import SQLiteStore
from test_outcomes import DESK, Cells, run_desk

PRICES = "prices: {gpt-4o-mini: {input: 1.0, output: 2.0}}\n"
CLOSE = [call("close_ticket"), "Closed."]


def write_report(tmp_path, db, *options: str) -> str:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(report, ["--store", f"sqlite:///{db}", "--out", str(out), *options])
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_a_version_without_prices_has_no_cost_per_resolved_where_the_report_counts_cost(write_bot, tmp_path):
    """The first version declared no `prices:`, the second does: the report's unit is cost, so the
    first version's figure is unknown ("–"), not its tokens shown as a cost."""
    assert PRICES in DESK
    unpriced = chatrun.load_bot(write_bot(DESK.replace(PRICES, ""), name="v1.yaml"))
    priced = chatrun.load_bot(write_bot(DESK, name="v2.yaml"))
    assert unpriced.config.content_version != priced.config.content_version
    db = tmp_path / "mixed.db"
    store = SQLiteStore(str(db))
    run_desk(unpriced, store, CLOSE, ["close it"], "en")
    spent = run_desk(priced, store, CLOSE, ["close it"], "en")
    cost = store.load_session(spent.id)["usage"]["cost"]
    assert cost > 0
    cells = Cells()
    cells.feed(write_report(tmp_path, db))
    v = cells.values
    old, new = (f"desk@{b.config.content_version[:8]}" for b in (unpriced, priced))
    assert v[(new, "cost_per_resolved")] == pytest.approx(cost)
    assert v[("all", "cost_per_resolved")] == pytest.approx(cost / 2)  # the group's whole cost over its resolved
    assert v[(old, "cost_per_resolved")] is None


def test_users_text_in_the_report_is_shown_never_run(write_bot, tmp_path):
    desk = chatrun.load_bot(write_bot(DESK))
    db = tmp_path / "hostile.db"
    store = SQLiteStore(str(db))
    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    run_desk(desk, store, CLOSE, ["<script>alert(3)</script> **bold** [x](javascript:alert(4))"], hostile)
    page = write_report(tmp_path, db, "--resolved", '<b onmouseover="alert(5)">resolved</b>')
    assert "<script" not in page and "<img" not in page and "<b " not in page and "javascript:" not in page
    assert "locale &lt;script&gt;alert(1)&lt;/script&gt;" in page  # the locale, as text
    assert "&lt;b onmouseover=&quot;alert(5)&quot;&gt;resolved&lt;/b&gt;" in page
