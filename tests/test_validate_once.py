"""Work the validation of a big bot did more than once, now done once, with the same answers (issue 39).

- Which scope keys a route sees is a flow over the route graph's strongly connected components:
  the two flows along route edges (a route's own keys, its shared keys) share one search for them.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from chatrun.definition import checks
from chatrun.definition.graph import RouteGraph
from chatrun.definition.loader import check_bot

REPO = Path(__file__).resolve().parents[1]


def _generated(tmp_path: Path, routes: int = 30) -> Path:
    spec = importlib.util.spec_from_file_location("bench_validate", REPO / "bench" / "bench_validate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "bot.yaml"
    path.write_text(module.generate(routes))
    return path


def _fixpoint(nodes: list[str], edges: list, base: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """The least sets of `checks._flow`'s definition, by iterating until nothing changes."""
    value = {n: set(base[n]) for n in nodes}
    changed = True
    while changed:
        changed = False
        for a, b, extra in edges:
            grown = value[b] | value[a] | extra
            if grown != value[b]:
                value[b], changed = grown, True
    return {n: frozenset(v) for n, v in value.items()}


@pytest.mark.parametrize("seed", range(40))
def test_the_flows_over_one_search_for_components_are_each_the_least_sets(seed):
    rng = random.Random(seed)
    nodes = [f"r{i}" for i in range(rng.randint(1, 14))]
    edges = [(rng.choice(nodes), rng.choice(nodes), frozenset(rng.sample("xyz", rng.randint(0, 2))))
             for _ in range(rng.randint(0, 25))]
    bases = [{n: set(rng.sample("abcdef", rng.randint(0, 3))) for n in nodes} for _ in range(3)]
    assert checks._flow(nodes, edges, *bases) == [_fixpoint(nodes, edges, base) for base in bases]


def test_scope_visibility_searches_the_route_graph_for_components_twice(tmp_path, monkeypatch):
    config, _ = check_bot(_generated(tmp_path))
    assert config is not None
    graph = RouteGraph.from_config(config)
    calls: list[int] = []
    original = checks._components

    def counting(nodes, succ):  # type: ignore[no-untyped-def]
        calls.append(len(nodes))
        return original(nodes, succ)

    monkeypatch.setattr(checks, "_components", counting)
    visibility = checks.ScopeVisibility(config, graph)
    assert calls == [30, 30]  # route edges (own and shared keys), then route and push edges (below)
    assert visibility.sees("r3", "form_3") and not visibility.sees("r3", "form_4")
