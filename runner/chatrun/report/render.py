"""The report as ONE self-contained HTML file: inline CSS, charts as inline SVG drawn here, no
script and nothing fetched, so it opens from a mail attachment or an air-gapped disk.

Why SVG by hand rather than a plotting library: every chart is a set of horizontal bars (rates,
counts, times per group), a few dozen lines of SVG; a library (matplotlib and its numpy) would
be a large install for those, and its import alone would cost more than the report's figures
on a small store. Each figure is also written in a table cell with `data-figure` and
`data-group` attributes: the numbers stay readable (and testable) without the pictures.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence

from chatrun.report.figures import PERCENTILES, Figures, Group, Meanings

COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")  # Okabe-Ito: colour-blind safe
BAR, GAP, LABEL_WIDTH, PLOT_WIDTH = 14, 10, 220, 420
MAX_ROUTES = 20  # routes shown in the funnel (the rest summed as "other routes")

Format = Callable[[float], str]


def percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def number(value: float) -> str:
    return f"{value:,.4g}" if value < 1000 else f"{value:,.0f}"


def millis(value: float) -> str:
    return f"{value * 1000:,.0f} ms"


def bars(title: str, rows: Sequence[tuple[str, Sequence[float | None]]], series: Sequence[str],
         fmt: Format, top: float | None = None) -> str:
    """A horizontal grouped bar chart: one group of bars per row, one bar per series."""
    values = [v for _, vs in rows for v in vs if v is not None]
    scale = top if top is not None else max(values, default=0.0) or 1.0
    per_row = len(series) * BAR + GAP
    legend = 22 if len(series) > 1 else 0
    height = legend + len(rows) * per_row + 10
    width = LABEL_WIDTH + PLOT_WIDTH + 90
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}"><title>{_e(title)}</title>']
    if legend:
        for i, name in enumerate(series):
            x = LABEL_WIDTH + i * 130
            out.append(f'<rect x="{x}" y="4" width="12" height="12" fill="{COLOURS[i % len(COLOURS)]}"/>'
                       f'<text x="{x + 16}" y="14">{_e(name)}</text>')
    for r, (label, row_values) in enumerate(rows):
        y0 = legend + r * per_row
        mid = y0 + len(series) * BAR / 2 + 4
        out.append(f'<text x="{LABEL_WIDTH - 8}" y="{mid:.0f}" text-anchor="end">{_e(_short(label))}</text>')
        for i, value in enumerate(row_values):
            y = y0 + i * BAR
            if value is None:
                out.append(f'<text x="{LABEL_WIDTH + 4}" y="{y + BAR - 3}" class="none">no data</text>')
                continue
            w = max(1.0, PLOT_WIDTH * min(value, scale) / scale)
            out.append(f'<rect x="{LABEL_WIDTH}" y="{y}" width="{w:.1f}" height="{BAR - 2}" '
                       f'fill="{COLOURS[i % len(COLOURS)]}"><title>{_e(label)} {_e(series[i])}: '
                       f'{_e(fmt(value))}</title></rect>'
                       f'<text x="{LABEL_WIDTH + w + 4:.1f}" y="{y + BAR - 3}">{_e(fmt(value))}</text>')
    out.append("</svg>")
    return "".join(out)


def stacked(title: str, rows: Sequence[tuple[str, Sequence[float]]], series: Sequence[str], fmt: Format) -> str:
    """A horizontal stacked bar chart: one bar per row, one segment per series, the total after it."""
    scale = max((sum(vs) for _, vs in rows), default=0.0) or 1.0
    per_row = BAR + GAP
    legend = 22
    height = legend * (1 + (len(series) - 1) // 4) + len(rows) * per_row + 10
    width = LABEL_WIDTH + PLOT_WIDTH + 90
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}"><title>{_e(title)}</title>']
    for i, name in enumerate(series):
        lx, ly = LABEL_WIDTH + (i % 4) * 130, 4 + (i // 4) * legend
        out.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{COLOURS[i % len(COLOURS)]}"/>'
                   f'<text x="{lx + 16}" y="{ly + 10}">{_e(name)}</text>')
    top = legend * (1 + (len(series) - 1) // 4)
    for r, (label, values) in enumerate(rows):
        y = top + r * per_row
        out.append(f'<text x="{LABEL_WIDTH - 8}" y="{y + BAR - 3}" text-anchor="end">{_e(_short(label))}</text>')
        x = float(LABEL_WIDTH)
        for i, value in enumerate(values):
            if not value:
                continue
            w = PLOT_WIDTH * value / scale
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{BAR - 2}" '
                       f'fill="{COLOURS[i % len(COLOURS)]}"><title>{_e(label)} {_e(series[i])}: '
                       f'{_e(fmt(value))}</title></rect>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + BAR - 3}">{_e(fmt(sum(values)))}</text>')
    out.append("</svg>")
    return "".join(out)


def report_html(figures: Figures, meanings: Meanings, store: str, since: str | None) -> str:
    groups = figures.groups
    rates = {g.name: g.rates(meanings) for g in groups}
    kinds = ("containment", "escalation", "abandonment")
    unit = "cost" if figures.total.priced else "tokens"
    cost = {g.name: g.cost_per_resolved(meanings, unit == "cost") for g in groups}
    sections = [
        _section("Containment, escalation and abandonment",
                 bars("Rates by group", [(g.name, [rates[g.name][k] for k in kinds]) for g in groups], kinds,
                      percent, top=1.0)),
        _section("Outcomes", bars("Outcomes of all conversations", _outcome_rows(figures.total), ["conversations"],
                                  number)),
        _section("Where conversations end, and how", _funnel(figures.total)),
        _section(f"{'Cost' if unit == 'cost' else 'Tokens'} per resolved conversation",
                 bars(f"{unit} per resolved conversation", [(g.name, [cost[g.name]]) for g in groups], [unit],
                      number)),
        _section("User feedback (CSAT: thumbs up of all rated replies)",
                 bars("CSAT by group", [(g.name, [g.csat]) for g in groups], ["CSAT"], percent, top=1.0)),
        _section("Latency of the users' turns",
                 bars("Latency percentiles by group", [(g.name, list(g.latency().values())) for g in groups],
                      [f"p{p}" for p in PERCENTILES], millis)),
    ]
    title = "chatrun report"
    scope = f"{figures.total.conversations:,} conversations in {store}" + (f" since {since}" if since else "")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{STYLE}</style></head>"
            f"<body><h1>{title}</h1><p class=\"scope\">{_e(scope)} — made {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
            f"</p>{''.join(sections)}<h2>Every figure</h2>{_table(groups, meanings, unit)}"
            f"<p class=\"note\">Containment: conversations without the outcome {_names(meanings.escalated)}; "
            f"escalation and abandonment: with {_names(meanings.escalated)} and {_names(meanings.abandoned)}; "
            f"resolved: {_names(meanings.resolved)}. Latency: nearest-rank percentiles of each user turn's time, "
            "commit included; the sweeper's turns are not counted.</p></body></html>\n")


def _outcome_rows(total: Group) -> list[tuple[str, Sequence[float | None]]]:
    return [(name or "(none yet)", [float(n)]) for name, n in total.outcomes.most_common()]


def _funnel(total: Group) -> str:
    """The route each conversation is on (the commonest MAX_ROUTES, the rest summed), split by outcome."""
    names = [name for name, _ in total.outcomes.most_common()]
    ranked = [route for route, _ in total.ends.most_common()]
    shown, rest = ranked[:MAX_ROUTES], ranked[MAX_ROUTES:]
    rows: list[tuple[str, Sequence[float]]] = [
        (route, [float(total.ends_by_outcome[(route, name)]) for name in names]) for route in shown]
    if rest:
        rows.append(("other routes", [float(sum(total.ends_by_outcome[(r, n)] for r in rest)) for n in names]))
    return stacked("Conversations by the route they are on, split by outcome", rows,
                   [name or "(none yet)" for name in names], number)


def _table(groups: list[Group], meanings: Meanings, unit: str) -> str:
    head = ["group", "conversations", "containment", "escalation", "abandonment", "resolution",
            f"{unit} per resolved", "unfinished attempts", "CSAT", "ratings", "user turns",
            *(f"p{p}" for p in PERCENTILES)]
    lines = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for g in groups:
        rates = g.rates(meanings)
        cost = g.cost_per_resolved(meanings, unit == "cost")
        cells: list[tuple[str, float | None, Format]] = [
            ("conversations", g.conversations, number), *((k, rates[k], percent) for k in rates),
            ("cost_per_resolved", cost, number), ("unfinished", g.unfinished, number), ("csat", g.csat, percent), ("ratings", g.up + g.down, number),
            ("turns", len(g.seconds), number),
            *((f"p{p}", v, millis) for p, v in g.latency().items())]
        lines.append(f"<tr><th scope=\"row\">{_e(g.name)}</th>")
        lines.extend(_cell(g.name, key, value, fmt) for key, value, fmt in cells)
        lines.append("</tr>")
    lines.append("</tbody></table>")
    return "".join(lines)


def _cell(group: str, key: str, value: float | None, fmt: Format) -> str:
    raw = "" if value is None else repr(float(value))
    shown = "–" if value is None else fmt(value)
    return f'<td data-group="{_e(group)}" data-figure="{key}" data-value="{raw}">{_e(shown)}</td>'


def _section(title: str, body: str) -> str:
    return f"<section><h2>{_e(title)}</h2>{body}</section>"


def _names(names: frozenset[str]) -> str:
    return " or ".join(f"<code>{_e(n)}</code>" for n in sorted(names))


def _short(label: str) -> str:
    return label if len(label) <= 30 else label[:29] + "…"


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem auto;max-width:60rem;padding:0 1rem;color:#222}
h1{font-size:1.6rem}h2{font-size:1.15rem;margin-top:2rem}.scope,.note{color:#555}
svg{max-width:100%;height:auto;font:12px system-ui,sans-serif}svg text{fill:#222}svg .none{fill:#888}
table{border-collapse:collapse;font-size:12px;display:block;overflow-x:auto}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right;white-space:nowrap}
th[scope=row]{text-align:left}
"""
