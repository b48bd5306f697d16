"""The route graph (chatrun.definition.graph) and `chatrun graph`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from chatrun.cli import main
from chatrun.definition.config import ActionConfig, BotConfig, RouteConfig, ToolConfig
from chatrun.definition.graph import Edge, RouteGraph
from chatrun.definition.loader import load_config

REPO = Path(__file__).resolve().parents[1]
TRAVEL = REPO / "bots" / "travel"
INVALID = REPO / "tests" / "fixtures" / "invalid"


@pytest.fixture(scope="module")
def travel() -> RouteGraph:
    config, _ = load_config(TRAVEL)
    return RouteGraph.from_config(config)


def bot(routes: dict[str, list[str]], tools: dict[str, dict], default: str | None = None) -> BotConfig:
    """A BotConfig built by hand: routes name their tools, tools give their action keys."""
    first = default or next(iter(routes))
    return BotConfig(
        name="t",
        routes={name: RouteConfig(name, tools=list(ts), default=name == first) for name, ts in routes.items()},
        tools={name: ToolConfig(name, action=ActionConfig(**action)) for name, action in tools.items()},
    )


# -- structure ------------------------------------------------------------------------


def test_travel_nodes_in_config_order_with_default_roles_and_memory(travel):
    # The main file's routes, then the included files' in sorted order (car, flight, hotel, tours).
    assert list(travel.nodes) == ["main_menu", "car", "flight", "hotel", "tours"]
    assert travel.default == "main_menu"
    menu, flight = travel.nodes["main_menu"], travel.nodes["flight"]
    assert menu.default and not flight.default
    assert menu.memory == "message_window"  # the route's own policy
    assert flight.memory == "token_window"  # the bot's default policy
    assert flight.description == "Flight booking wizard"
    assert flight.tools[-1] == "cancel"


def test_travel_edges_kinds_targets_and_flags(travel):
    assert travel.edges == [
        Edge("main_menu", "flight", "push", "book_flight", execute=True, immediate=True),
        Edge("main_menu", "hotel", "push", "book_hotel", execute=True, immediate=True),
        Edge("main_menu", "tours", "push", "search_tours", execute=True, immediate=True),
        Edge("main_menu", "car", "push", "rent_car", execute=True, immediate=True),
        Edge("car", None, "pop", "book_car"),  # its cases both pop: unconditional
        Edge("car", None, "pop", "cancel"),
        Edge("flight", None, "pop", "book"),
        Edge("flight", "hotel", "route", "switch_to_hotel", execute=True, immediate=True),
        Edge("flight", None, "pop", "cancel"),
        Edge("hotel", None, "pop", "book_hotel_room"),
        Edge("hotel", None, "pop", "cancel"),
        Edge("tours", None, "pop", "book_tour"),
        Edge("tours", None, "pop", "cancel"),
    ]
    assert [e.tool for e in travel.edges_from("hotel")] == ["book_hotel_room", "cancel"]
    assert travel.edges_from("nowhere") == []


def test_travel_reachability_nesting_and_pop_targets(travel):
    assert travel.reachable() == {"main_menu", "flight", "hotel", "tours", "car"}
    assert travel.reachable("flight") == {"flight", "hotel"}
    assert travel.reachable("hotel") == {"hotel"}
    assert travel.reachable("nowhere") == set()
    assert travel.pushed_routes() == {"flight", "hotel", "tours", "car"}
    assert travel.can_be_nested("flight") and travel.can_be_nested("hotel")
    assert not travel.can_be_nested("main_menu")
    assert travel.pop_targets("flight") == ["main_menu"]
    assert travel.pop_targets("hotel") == ["main_menu"]
    assert travel.pop_targets("main_menu") == []


def test_route_changes_keep_the_scope_so_pop_returns_to_whoever_pushed_the_first_route():
    graph = RouteGraph.from_config(bot(
        {"root": ["go_a"], "other": ["go_b"], "a": ["to_c"], "b": ["to_c"], "c": ["back"], "island": ["back"]},
        {"go_a": {"push": "a"}, "go_b": {"push": "b"}, "to_c": {"route": "c"}, "back": {"pop": True}},
    ))
    assert graph.reachable() == {"root", "a", "c"}  # `other` (and so `b`) only as a chosen start route
    assert graph.reachable("other") == {"other", "b", "c"}
    assert graph.can_be_nested("c")  # reached by a route change from pushed routes
    assert not graph.can_be_nested("island") and not graph.can_be_nested("root")
    assert graph.pop_targets("c") == ["root", "other"]
    assert graph.pop_targets("island") == []


def test_unknown_tools_and_targets_are_left_out():
    config = bot({"root": ["ghost_tool", "to_ghost", "stay"]},
                 {"to_ghost": {"push": "ghost"}, "stay": {"route": "root", "execute": True}})
    graph = RouteGraph.from_config(config)
    assert graph.edges == [Edge("root", "root", "route", "stay", execute=True)]
    assert graph.reachable() == {"root"}
    for fmt in ("text", "mermaid", "dot"):
        assert "ghost" not in graph.render(fmt)


def test_a_tool_that_pops_and_pushes_gives_both_edges():
    graph = RouteGraph.from_config(bot(
        {"menu": ["open_a"], "a": ["a_to_b"], "b": ["done"]},
        {"open_a": {"push": "a"}, "a_to_b": {"pop": True, "push": "b"}, "done": {"pop": True}},
    ))
    assert [(e.kind, e.target) for e in graph.edges_from("a")] == [("push", "b"), ("pop", None)]
    assert graph.reachable() == {"menu", "a", "b"}
    assert graph.can_be_nested("b")


# -- rendering ------------------------------------------------------------------------


def test_mermaid_is_a_github_flowchart_with_shapes_and_edge_styles(travel):
    text = travel.render("mermaid")
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    assert lines[1:6] == [
        '    n0_main_menu(["main_menu (default)"])',  # stadium: the default route
        '    n1_car["car"]',
        '    n2_flight["flight"]',
        '    n3_hotel["hotel"]',
        '    n4_tours["tours"]',
    ]
    assert lines[6:] == [
        '    n0_main_menu -->|"push: book_flight"| n2_flight',
        '    n0_main_menu -->|"push: book_hotel"| n3_hotel',
        '    n0_main_menu -->|"push: search_tours"| n4_tours',
        '    n0_main_menu -->|"push: rent_car"| n1_car',
        '    n1_car ==>|"pop: book_car, cancel"| n0_main_menu',
        '    n2_flight ==>|"pop: book, cancel"| n0_main_menu',  # parallel pops merged, drawn back to the pusher
        '    n2_flight -.->|"route: switch_to_hotel"| n3_hotel',
        '    n3_hotel ==>|"pop: book_hotel_room, cancel"| n0_main_menu',
        '    n4_tours ==>|"pop: book_tour, cancel"| n0_main_menu',
    ]
    assert text.endswith("\n") and "\t" not in text


def test_mermaid_ids_avoid_keywords_and_labels_escape_quotes():
    config = bot({"end": ["go"], "graph": ["back"]}, {"go": {"push": "graph"}, "back": {"pop": True}})
    config.routes["graph"].roles = ['say "hi"']
    text = RouteGraph.from_config(config).render("mermaid")
    assert text.splitlines() == [
        "flowchart LR",
        '    n0_end(["end (default)"])',
        '    n1_graph["graph [roles: say #quot;hi#quot;]"]',
        '    n0_end -->|"push: go"| n1_graph',
        '    n1_graph ==>|"pop: back"| n0_end',
    ]


def test_mermaid_ids_never_collide():
    """Names that look like generated ids, or differ only in characters ids cannot hold."""
    config = bot({"route1_": ["go"], "end": [], "a-b": [], "a_b": []}, {"go": {"push": "end"}})
    text = RouteGraph.from_config(config).render("mermaid")
    ids = re.findall(r"^    (\w+)[\[(]", text, re.M)
    assert ids == ["n0_route1_", "n1_end", "n2_a_b", "n3_a_b"]
    assert len(set(ids)) == 4
    assert '    n0_route1_ -->|"push: go"| n1_end' in text


def test_dot_is_a_digraph_with_styled_edges(travel):
    text = travel.render("dot")
    assert text.startswith('digraph "travel" {\n') and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}") and text.count("[") == text.count("]")
    assert '"main_menu" [label="main_menu (default)", tooltip="Top-level menu", peripheries=2];' in text
    assert '"main_menu" -> "flight" [label="push: book_flight\\n(execute, immediate)", style=solid];' in text
    assert '"flight" -> "hotel" [label="route: switch_to_hotel\\n(execute, immediate)", style=dashed];' in text
    assert re.search(r'"hotel" -> "main_menu" \[label="pop: book_hotel_room, cancel", style=bold', text)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_dot_output_is_accepted_by_graphviz(travel):
    done = subprocess.run(["dot", "-Tsvg"], input=travel.render("dot"), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "<svg" in done.stdout


def test_text_lists_each_route_with_its_ways_out(travel):
    text = travel.render("text")
    assert text.startswith("travel: Books flights, hotels, tours and rental cars.\n")
    assert "main_menu [default; memory: message_window]  Top-level menu" in text
    assert re.search(r"book_flight +push → flight  \(execute, immediate\)", text)
    assert re.search(r"switch_to_hotel +route → hotel", text)
    assert re.search(r"book_hotel_room +pop → back to main_menu", text)


def test_text_marks_unreachable_routes_and_pops_with_nowhere_to_go():
    graph = RouteGraph.from_config(bot({"root": ["back"], "lost": []}, {"back": {"pop": True}}))
    text = graph.render("text")
    assert "lost [memory: message_window; unreachable from root]" in text
    assert "pop → back to (nothing: never nested)" in text
    assert "(no way out" in text


def test_rendering_is_deterministic_and_unknown_formats_fail(travel):
    config, _ = load_config(TRAVEL)
    for fmt in ("text", "mermaid", "dot"):
        assert RouteGraph.from_config(config).render(fmt) == travel.render(fmt)
    with pytest.raises(ValueError, match="text, mermaid, dot"):
        travel.render("svg")


# -- the command ----------------------------------------------------------------------


def chatrun(*args: str) -> Result:
    """The command run in process (click's CliRunner), from the repository's root."""
    old = os.getcwd()
    os.chdir(REPO)
    try:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.mark.subprocess
def test_cli_runs_as_a_process(travel):
    """One smoke test of the real command line; the others run in process."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    done = subprocess.run([sys.executable, "-m", "chatrun", "graph", str(TRAVEL)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == travel.render("text")
    assert done.stderr == ""


@pytest.mark.subprocess
@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_a_terminal_that_is_not_utf8_shows_the_tree_in_ascii_and_what_it_cannot_print_as_escapes(tmp_path, encoding):
    path = tmp_path / "bot.yaml"
    path.write_text(textwrap.dedent("""\
        name: cafe
        description: Caf\u00e9 \u2014 commandes
        routes:
          main:
            default: true
            description: Men\u00fc \u2192 Bestellung
            system: Hi.
            tools: [order]
          order:
            system: Order.
            tools: [done]
        tools:
          order: {description: Order., action: {push: order}}
          done: {description: Done., action: {pop: true}}
        """), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner"), "PYTHONIOENCODING": encoding}
    done = subprocess.run([sys.executable, "-m", "chatrun", "graph", str(path)], capture_output=True,
                          env=env, cwd=REPO, timeout=60)
    out, err = done.stdout.decode(encoding), done.stderr.decode(encoding)
    assert done.returncode == 0 and "Traceback" not in err, err
    assert "?" not in out, out  # nothing the terminal cannot show reads as a question mark
    assert "cafe: Caf\\xe9 \\u2014 commandes\n" in out if encoding == "ascii" else "cafe: Caf\xe9 \\u2014 commandes\n" in out
    assert "  `- order  push -> order\n" in out and "Men" in out and "\\u2192 Bestellung" in out, out
    assert "cannot show some characters" in err and "PYTHONIOENCODING=utf-8" in err, err
    utf8 = subprocess.run([sys.executable, "-m", "chatrun", "graph", str(path)], capture_output=True,
                          env={**env, "PYTHONIOENCODING": "utf-8"}, cwd=REPO, timeout=60)
    assert utf8.stdout.decode() == RouteGraph.from_config(load_config(path)[0]).render("text") and not utf8.stderr


@pytest.mark.subprocess
def test_a_terminal_that_is_not_utf8_shows_a_graph_it_can_print_in_ascii_lines_and_says_nothing(travel):
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner"), "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "chatrun", "graph", str(TRAVEL)], capture_output=True,
                          env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert done.stdout.decode("ascii") == travel.render("text", ascii_lines=True)
    assert "|- book_hotel" in done.stdout.decode("ascii")


@pytest.mark.parametrize("fmt", ["text", "mermaid", "dot"])
def test_cli_prints_the_graph(travel, fmt):
    done = chatrun("graph", str(TRAVEL), "--format", fmt)
    assert done.exit_code == 0, done.stderr
    assert done.stdout == travel.render(fmt)
    assert done.stderr == ""


def test_cli_defaults_to_text(travel):
    assert chatrun("graph", "bots/travel").stdout == travel.render("text")


def test_cli_invalid_bot_prints_diagnostics_and_exits_1():
    done = chatrun("graph", str(INVALID / "bad_enum.yaml"))
    assert done.exit_code == 1
    assert done.stdout == ""
    assert re.search(r"bad_enum\.yaml:2:9: error: `model\.provider` must be one of", done.stderr)
    assert done.stderr.splitlines()[-1] == f"{INVALID / 'bad_enum.yaml'}: invalid: 3 errors, 0 warnings"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["bad_enum.yaml", "graph_warnings.yaml"])
def test_cli_problems_are_printed_as_by_validate(name):
    """What --help promises: the same lines `chatrun validate` prints, on stderr."""
    path = str(INVALID / name)
    assert chatrun("graph", path).stderr == chatrun("validate", path).stdout


def test_cli_warnings_go_to_stderr_and_the_graph_is_still_drawn():
    done = chatrun("graph", str(INVALID / "graph_warnings.yaml"), "--format", "mermaid")
    assert done.exit_code == 0
    assert done.stdout.startswith("flowchart LR\n")
    assert "warning: route `orphan` is not reachable" in done.stderr


def test_cli_usage_errors_exit_2():
    assert chatrun("graph", "no/such/bot").exit_code == 2
    assert chatrun("graph", "bots/travel", "--format", "svg").exit_code == 2


def test_cli_help_has_an_example():
    done = chatrun("graph", "--help")
    assert done.exit_code == 0
    assert "chatrun graph bots/travel --format mermaid" in done.stdout
