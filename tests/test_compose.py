"""docker-compose.yml and the Dockerfile, checked without Docker (this machine has no engine).

Every command is parsed by the real command-line parsers it would meet in the container (the
`tensortune` Typer app, Ray's `ray` click group), so a renamed option or subcommand fails here; the
wiring between services (database URL, Ray address, tokens, ports, GPU) is compared value for value
after the same `${VAR:-default}` interpolation compose does."""
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import typer.main
import yaml
from packaging.requirements import Requirement
from sqlalchemy.engine import make_url

from service.cli import app

os.environ.setdefault("RAY_AUTH_MODE", "token")  # fixed when ray is imported: test_measure_pools' Ray cluster needs it
from ray.scripts.scripts import cli as ray_cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENV = {"TENSORTUNE_TOKEN": "api-secret", "RAY_AUTH_TOKEN": "ray-secret"}  # what `docker compose up` is given
RAY_SERVICES = ["ray-head", "worker-cpu", "worker-gpu"]


def interpolate(value, env: dict):
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}`, applied to every string of the file."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match):
        name, kind, word = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if kind == ":?":
            raise KeyError(f"{name} is required: {word}")
        return word or ""
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", substitute, value)


@pytest.fixture(scope="module")
def compose() -> dict:
    return interpolate(yaml.safe_load((ROOT / "docker-compose.yml").read_text()), ENV)


def commands(service: dict) -> list[list[str]]:
    """The argv of each program a service runs (a `sh -c` line split at `&&`)."""
    command = service["command"]
    if command[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in command[2].split("&&")]
    return [command]


def parse(argv: list[str]) -> tuple[str, dict]:
    """Parse argv with the real CLI it names; an unknown command, option or bad value raises."""
    tool, subcommand, *args = argv[1:] if argv[0] == "exec" else argv
    group = {"tensortune": typer.main.get_command(app), "ray": ray_cli}[tool]
    assert subcommand in group.commands, f"{tool} has no command {subcommand!r}"
    return f"{tool} {subcommand}", group.commands[subcommand].make_context(subcommand, list(args)).params


def program(compose: dict, service: str, name: str) -> dict:
    found = [params for parsed, params in map(parse, commands(compose["services"][service])) if parsed == name]
    assert len(found) == 1, f"{service} runs {name} {len(found)} times"
    return found[0]


def build_args(service: dict) -> dict:
    """The build arguments of a service's image; each image is built from the Dockerfile at the root."""
    build = service["build"] if isinstance(service["build"], dict) else {"context": service["build"]}
    assert build["context"] == "." and "dockerfile" not in build
    return build.get("args", {})


def installed(extras: str | None) -> list[str]:
    """The arguments of the Dockerfile's `pip install`, as the image's /bin/sh expands them for build arg
    EXTRAS (None: its default)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    default = re.search(r'^ARG EXTRAS="(.*)"$', dockerfile, re.M).group(1)
    words = re.search(r"^RUN pip install (.*)$", dockerfile, re.M).group(1)
    shell = subprocess.run(["sh", "-c", f'set -- {words}; printf "%s\\n" "$@"'], capture_output=True, text=True,
                           env={"EXTRAS": default if extras is None else extras}, check=True)
    return shell.stdout.splitlines()


def test_every_command_and_health_check_is_a_real_entry_point(compose):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tensortune"] == "service.cli:main"  # the `tensortune` the image installs is this app
    for name in RAY_SERVICES:
        service = compose["services"][name]
        for argv in commands(service):
            parse(argv)
        health = service["healthcheck"]["test"]
        if health[1] == "ray":
            parse(health[1:])
        build_args(service)
    assert compose["services"]["worker-cpu"]["image"] == compose["services"]["ray-head"]["image"]


def test_the_service_reaches_postgres_with_its_credentials(compose):
    postgres, head = compose["services"]["postgres"], compose["services"]["ray-head"]
    url = make_url(program(compose, "ray-head", "tensortune serve")["db"])
    assert url.drivername == "postgresql+psycopg" and url.host == "postgres" and url.port == 5432
    env = postgres["environment"]
    assert (url.username, url.password, url.database) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"],
                                                           env["POSTGRES_DB"])
    volume = postgres["volumes"][0].split(":")
    assert volume[1] == "/var/lib/postgresql/data" and volume[0] in compose["volumes"]
    assert head["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert "pg_isready" in postgres["healthcheck"]["test"]


def test_workers_join_the_head_and_the_service_drives_it(compose):
    head = program(compose, "ray-head", "ray start")
    assert head["head"] and head["num_cpus"] == 0  # candidates are measured on workers, never beside the API
    serve = program(compose, "ray-head", "tensortune serve")
    assert serve["workers"] == "ray"
    assert compose["services"]["ray-head"]["environment"]["RAY_ADDRESS"] == f"127.0.0.1:{head['port']}"
    for name in ["worker-cpu", "worker-gpu"]:
        worker = program(compose, name, "ray start")
        assert worker["address"] == f"ray-head:{head['port']}" and worker["block"] and not worker["head"]
        assert compose["services"][name]["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    cpu = compose["services"]["worker-cpu"]
    assert "ports" not in cpu and "container_name" not in cpu  # `--scale worker-cpu=N` needs both absent


def test_tokens_come_from_the_environment_and_are_shared(compose):
    for name in RAY_SERVICES:
        env = compose["services"][name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == ENV["RAY_AUTH_TOKEN"]
    assert compose["services"]["ray-head"]["environment"]["TENSORTUNE_TOKEN"] == ENV["TENSORTUNE_TOKEN"]
    with pytest.raises(KeyError, match="TENSORTUNE_TOKEN"):  # serve on 0.0.0.0 refuses to start without it
        interpolate(yaml.safe_load((ROOT / "docker-compose.yml").read_text()), {"RAY_AUTH_TOKEN": "x"})


def test_workers_on_one_machine_share_the_host_timing_lock(compose):
    """`--scale worker-cpu=N` puts N Ray nodes on one machine: their pools must see one lock file."""
    for name in ["worker-cpu", "worker-gpu"]:
        service = compose["services"][name]
        lock_dir = os.path.dirname(service["environment"]["TENSORTUNE_HOST_LOCK"])
        volume, mount = service["volumes"][0].split(":")[:2]
        assert mount == lock_dir and volume in compose["volumes"] and not volume.startswith(("/", "."))


def test_the_gpu_worker_reserves_a_gpu_and_advertises_it(compose):
    devices = compose["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert [(d["driver"], d["count"], d["capabilities"]) for d in devices] == [("nvidia", 1, ["gpu"])]
    assert program(compose, "worker-gpu", "ray start")["num_gpus"] == 1


def test_the_published_port_is_the_one_serve_listens_on(compose):
    serve = program(compose, "ray-head", "tensortune serve")
    head = compose["services"]["ray-head"]
    assert serve["host"] == "0.0.0.0"
    assert [port.split(":")[-1] for port in head["ports"]] == [str(serve["port"])]
    assert f"http://127.0.0.1:{serve['port']}/healthz" in " ".join(head["healthcheck"]["test"])


def test_the_image_installs_the_project():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r"apt-get install .*libgomp1", dockerfile)
    assert re.search(r"^COPY \. \.$", dockerfile, re.M) and installed(None) == ["--no-cache-dir", "."]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and not {"pyproject.toml", "README.md", "service", "workers"} & set(ignored)


def packages_of(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The packages an extra installs, those of the extras it names (`tensortune[nvrtc]`) included."""
    requirements = [Requirement(text) for text in extras[extra]]
    return set().union({r.name for r in requirements if r.name != "tensortune"},
                       *(packages_of(named, extras) for r in requirements if r.name == "tensortune" for named in r.extras))


def test_only_the_gpu_image_installs_the_cuda_extras(compose):
    """The GPU worker's image holds CuPy, NVRTC, cudart and cuBLAS (the benchmark's reference); the head's and the
    CPU workers' hold none of them, and the two images have tags of their own, so neither build overwrites the other."""
    services = compose["services"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu_extras = build_args(services["worker-gpu"])["EXTRAS"]
    assert installed(gpu_extras)[-1] == f".[{gpu_extras}]"
    packages = set().union(*(packages_of(extra, extras) for extra in gpu_extras.split(",")))
    assert {"cupy-cuda12x", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12"} <= packages
    assert all("EXTRAS" not in build_args(services[name]) for name in ["ray-head", "worker-cpu"])
    assert services["worker-gpu"]["image"] != services["ray-head"]["image"]
