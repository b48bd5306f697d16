"""Work the validation of a big bot did more than once, now done once, with the same answers (issue 39).

- An action's variants (each case merged over it, and the action itself when no case may match)
  are worked out once: the default effects, the route graph and the checks each asked for them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from chatrun.definition.config import ActionConfig, CaseConfig
from chatrun.definition.loader import check_bot

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_BOTS = sorted(p for p in (REPO / "bots").iterdir() if (p / "bot.yaml").exists())


def _generated(tmp_path: Path, routes: int = 30) -> Path:
    spec = importlib.util.spec_from_file_location("bench_validate", REPO / "bench" / "bench_validate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "bot.yaml"
    path.write_text(module.generate(routes))
    return path


def _expected_variants(action: ActionConfig) -> list:
    """What `variants` means: each case with its merge, then the action itself unless an `else` ends the cases."""
    out: list = [(case, action.with_case(case)) for case in action.cases]
    if not action.cases or action.cases[-1].condition is not None:
        out.append((None, action))
    return out


def test_an_actions_variants_are_worked_out_once_and_are_what_its_cases_say(tmp_path):
    seen = 0
    for path in [*EXAMPLE_BOTS, _generated(tmp_path)]:
        config, _ = check_bot(path)  # the effects, the graph and the checks have asked already
        assert config is not None, path
        for tool in config.tools.values():
            variants = tool.action.variants()
            assert tool.action.variants() is variants  # kept, not built again
            assert list(variants) == _expected_variants(tool.action), (path, tool.name)
            for case, merged in variants:
                if case is not None:
                    assert merged.variants() == ((None, merged),)  # a merge's own, never its action's
            seen += len(tool.action.cases)
    assert seen > 60  # the generated bot's tools decide with cases


def test_a_case_merged_after_the_variants_were_kept_has_variants_of_its_own():
    first = CaseConfig("args.a", ActionConfig(route="r1"))
    action = ActionConfig(push="r0", cases=[first])
    assert action.variants() == ((first, action.with_case(first)), (None, action))
    later = CaseConfig(None, ActionConfig(route="r2"))
    merged = action.with_case(later)
    assert merged.route == "r2" and merged.variants() == ((None, merged),)
