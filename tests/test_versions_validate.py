"""`chatrun validate` of a bot served in several versions (docs/versions.md): what `chatrun
serve` refuses about the folder, validate reports, at the file and line; no command shows a
traceback for a broken versions.yaml."""

from __future__ import annotations

from click.testing import CliRunner

from chatrun.cli import main
from test_versions import shop_copy


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def test_validate_reports_the_versions_yaml_that_serve_refuses(tmp_path):
    root = shop_copy(tmp_path)
    (root / "versions.yaml").write_text('# the canary\nweights: {"3": 10}\n')
    checked = run("validate", str(root))
    assert checked.exit_code == 1, checked.output
    assert (f"{root / 'versions.yaml'}:2:1: error: weights names version '3', which is not in versions/ "
            "(there are: 1, 2)") in checked.output.splitlines()
    (root / "versions.yaml").write_text('weights: {"1": 10, "2": 90}\n')
    assert run("validate", str(root)).exit_code == 0


def test_a_versions_yaml_that_is_not_yaml_is_an_error_at_its_line_on_every_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `serve`'s default store (chatrun.db) is the working folder's: not another test's
    root = shop_copy(tmp_path)
    (root / "versions.yaml").write_text('# the canary\nweights: {"1": 10\n')
    for args in (["validate", str(root)], ["repl", str(root), "--play-model"], ["serve", str(root), "--port", "0"]):
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert f"{root / 'versions.yaml'}:3:1: error: YAML syntax error" in result.output, (args, result.output)
    assert not (tmp_path / "chatrun.db").exists()  # `serve` opened no store for a bot it refused


def test_validate_warns_when_folder_names_order_the_versions_otherwise_than_their_numbers(tmp_path):
    """docs/versions.md: versions are ordered by folder name, whole numbers numerically; `1.9`
    and `1.10` sort by text, so 1.10 is served as the older one (and 1.9 takes new sessions)."""
    root = shop_copy(tmp_path)
    (root / "versions" / "1").rename(root / "versions" / "1.9")
    (root / "versions" / "2").rename(root / "versions" / "1.10")
    checked = run("validate", str(root))
    assert checked.exit_code == 0, checked.output  # a warning: the server serves it as named
    assert (f"{root / 'versions'}: warning: the versions are ordered by folder name, a name that is not a whole "
            "number by its text, so '1.10' is taken to be older than '1.9'") in checked.output, checked.output
    (root / "versions" / "1.9").rename(root / "versions" / "9")
    (root / "versions" / "1.10").rename(root / "versions" / "10")
    assert "ordered by folder name" not in run("validate", str(root)).output
