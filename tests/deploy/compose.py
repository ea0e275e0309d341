"""deploy/compose/compose.yaml (alone, or with an override such as compose.secure.yaml) run without
a container engine: `docker compose config` resolves the files (anchors, variables, defaults,
env_file, the override merged) into the model compose itself would run, and each etcd,
SeaweedFS and neve service of it becomes a local process with the service's command, environment
and health check. Container hostnames become 127.0.0.1 and each port a service listens on (its
`ports` and `expose`) a free loopback port, wherever the file names it: `host:port` pairs, a
setting or flag that is a service's own port, `0.0.0.0` (loopback only here). Named volumes become
directories; a bind mount is its host directory, wherever the file names its target. Services start in depends_on order, each once its dependencies meet their condition
(service_healthy: the dependency's own health check passed, run as compose would run it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.servers import PORT_ATTEMPTS, PORT_TAKEN, remove_weed_sockets, spawn, terminate
from tests.deploy.tools import DEPLOY, ROOT, run, tool
from tests.fixtures import READY_TIMEOUT, _bin, free_port

COMPOSE_FILE = DEPLOY / "compose" / "compose.yaml"
SECURE_FILE = DEPLOY / "compose" / "compose.secure.yaml"
NEVE_DOCKERFILE = "deploy/Dockerfile"
LOOPBACK = "127.0.0.1"
HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9_.-]+):(?P<port>\d+)\b")
FLAG = re.compile(r"(?P<flag>--?[\w.-]+=)(?P<value>.*)")
# the image's ENTRYPOINT (tini -- neve) and the files it puts on PATH, as local commands
NEVE = [sys.executable, "-m", "neve"]
IMAGE_COMMANDS = {"neve-healthcheck": [sys.executable, str(DEPLOY / "docker" / "healthcheck.py")]}
SERVER_BINARIES = ("etcd", "etcdctl", "weed")


def compose_args(*files: Path) -> list[str]:
    """docker compose's arguments naming `files`, the first the base (compose.yaml by default)."""
    return [tool("docker-compose"), *(a for f in (files or (COMPOSE_FILE,)) for a in ("-f", str(f)))]


def resolved(*files: Path, variables: dict[str, str] | None = None) -> dict:
    """The compose model as `docker compose config` resolves `files` (compose.yaml by default),
    with `variables` set for its interpolation (e.g. DEV_CERTS_DIR)."""
    env = {**os.environ, **(variables or {})}
    done = run([*compose_args(*files), "config", "--format", "json"], env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def dev_certs(directory: Path) -> dict[str, str]:
    """`make certs` into `directory`; the variables that point compose.secure.yaml at it."""
    done = run([sys.executable, "-m", "neve.dev_certs", str(directory)])
    assert done.returncode == 0, done.stderr
    return {"DEV_CERTS_DIR": str(directory)}


def is_neve(spec: dict) -> bool:
    return (spec.get("build") or {}).get("dockerfile") == NEVE_DOCKERFILE


def container_ports(spec: dict) -> list[int]:
    ports = [int(p["target"]) for p in spec.get("ports", ())]
    return ports + [int(str(p).split("/")[0]) for p in spec.get("expose", ())]


@dataclass
class Service:
    name: str
    spec: dict
    workdir: Path
    ports: dict[int, int] = field(default_factory=dict)  # container port -> loopback port
    volumes: dict[str, Path] = field(default_factory=dict)  # mount target -> local directory
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


class LocalCompose:
    """The services of a compose model as local processes under `workdir`."""

    def __init__(self, model: dict, workdir: Path, names: list[str]) -> None:
        self.model = model
        self.workdir = workdir
        self.services: dict[str, Service] = {}
        for name in names:
            spec = model["services"][name]
            service = Service(name, spec, workdir / name, {p: free_port() for p in container_ports(spec)})
            for mount in spec.get("volumes", ()):
                if mount["type"] == "volume":
                    service.volumes[mount["target"]] = workdir / "volumes" / mount["source"]
                    service.volumes[mount["target"]].mkdir(parents=True, exist_ok=True)
                elif mount["type"] == "bind":
                    service.volumes[mount["target"]] = Path(mount["source"])
            self.services[name] = service

    # -- the file's words as local ones --------------------------------------------------------------

    def localize(self, text: str, own: Service, argument: bool = False) -> str:
        """`text` (a setting's value, an argument) with hostnames, ports and volume paths made local.
        A whole value that is a service name is a hostname, unless it is a command's `argument`
        (`neve registry` runs in the service named registry)."""
        if (text in self.services and not argument) or text in ("0.0.0.0", "::"):
            return LOOPBACK
        if text.isdigit() and int(text) in own.ports:
            return str(own.ports[int(text)])
        for target, local in own.volumes.items():
            if text == target or text.startswith(target + "/"):
                return str(local) + text[len(target) :]
        if flag := FLAG.fullmatch(text):
            return flag["flag"] + self.localize(flag["value"], own)
        return self.localize_addresses(text, own)

    def localize_addresses(self, text: str, own: Service) -> str:
        def local(m: re.Match) -> str:
            host, port = m["host"], int(m["port"])
            service = self.services.get(host) or (own if host in ("0.0.0.0", LOOPBACK, "localhost") else None)
            if service is None or port not in service.ports:
                return m[0]
            return f"{LOOPBACK}:{service.ports[port]}"

        return HOST_PORT.sub(local, text)

    def environment(self, service: Service) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEVE_", "AWS_"))}
        if is_neve(service.spec):
            env |= {"PYTHONUNBUFFERED": "1", "NEVE_DATA_DIR": str(service.workdir / "data")}  # the image's ENV
        for key, value in (service.spec.get("environment") or {}).items():
            env[key] = self.localize(value or "", service)
        return env

    def command(self, service: Service) -> list[str]:
        spec = service.spec
        args = [*(spec.get("entrypoint") or ()), *(spec.get("command") or ())]
        if is_neve(spec) and not spec.get("entrypoint"):
            return [*NEVE, *(self.localize(a, service, argument=True) for a in args)]
        return [*self.executable(args[0]), *(self.localize(a, service, argument=True) for a in args[1:])]

    @staticmethod
    def executable(name: str) -> list[str]:
        base = Path(name).name
        if base in IMAGE_COMMANDS:
            return IMAGE_COMMANDS[base]
        if base in SERVER_BINARIES:
            return [_bin(base)]
        found = shutil.which(base)
        assert found, f"{name}: no local stand-in for the image's command"
        return [found]

    def health_command(self, service: Service) -> list[str] | None:
        test = (service.spec.get("healthcheck") or {}).get("test")
        if not test or test[0] == "NONE":
            return None
        if test[0] == "CMD-SHELL":
            return ["/bin/sh", "-c", self.localize_addresses(test[1], service)]
        assert test[0] == "CMD", test
        return [*self.executable(test[1]), *(self.localize(a, service, argument=True) for a in test[2:])]

    # -- running ---------------------------------------------------------------------------------------

    def start(self, name: str) -> None:
        service = self.services[name]
        service.workdir.mkdir(parents=True, exist_ok=True)
        service.process = spawn(self.command(service), service.log_path, env=self.environment(service), cwd=service.workdir)

    def healthy(self, name: str) -> bool:
        service = self.services[name]
        command = self.health_command(service)
        assert command is not None, f"{name} has no health check"
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=self.environment(service), cwd=service.workdir)
        return done.returncode == 0

    def wait_healthy(self, name: str, timeout: float = READY_TIMEOUT) -> None:
        """Until the service's health check passes. A service that exits because another process
        took one of its ports first is started again on new ones (PORT_ATTEMPTS starts in all):
        nothing that names its ports has started yet, as dependents wait for it to be healthy."""
        service = self.services[name]
        deadline = time.monotonic() + timeout
        starts = 1
        while not self.healthy(name):
            if service.process.poll() is not None:
                if starts < PORT_ATTEMPTS and any(taken in service.log_tail() for taken in PORT_TAKEN):
                    starts += 1
                    self.stopped(service)
                    service.ports = {p: free_port() for p in service.ports}
                    self.start(name)
                    continue
                raise AssertionError(f"{name} exited with {service.process.returncode}; log {service.log_path}:\n{service.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not healthy after {timeout:.0f}s; log {service.log_path}:\n{service.log_tail()}")
            time.sleep(0.5)

    def order(self) -> list[str]:
        """The services, each after what it depends on."""
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            assert name not in path, f"depends_on cycle: {' -> '.join((*path, name))}"
            if name in done:
                return
            for dep in self.services[name].spec.get("depends_on") or {}:
                if dep in self.services:
                    visit(dep, (*path, name))
            done.append(name)

        for name in self.services:
            visit(name, ())
        return done

    def up(self) -> None:
        """Start every service in order, each once its dependencies meet their conditions; return
        when every service with a health check is healthy."""
        healthy: set[str] = set()
        for name in self.order():
            for dep, rule in (self.services[name].spec.get("depends_on") or {}).items():
                if rule["condition"] == "service_healthy" and dep not in healthy:
                    self.wait_healthy(dep)
                    healthy.add(dep)
            self.start(name)
        for name, service in self.services.items():
            if name not in healthy and self.health_command(service) is not None:
                self.wait_healthy(name)

    def down(self) -> dict[str, int | None]:
        """SIGTERM (what `docker compose down` sends) in reverse order; each process's exit code."""
        codes: dict[str, int | None] = {}
        for name in reversed(self.order()):
            service = self.services[name]
            terminate(service.process, timeout=60.0)
            codes[name] = service.process.returncode if service.process is not None else None
            self.stopped(service)
        return codes

    def stopped(self, service: Service) -> None:
        """Clean up after a stopped process: `weed mini` leaves unix sockets named by its ports in /tmp."""
        if Path(self.command(service)[0]).name == "weed":
            remove_weed_sockets({str(p): p for p in service.ports.values()})

    def published(self, name: str, port: int) -> str:
        """The loopback address standing in for a service's port."""
        return f"{LOOPBACK}:{self.services[name].ports[port]}"


def neve_env_names() -> set[str]:
    """Every variable `neve config` prints."""
    done = subprocess.run([*NEVE, "config"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return set(re.findall(r"\b(NEVE_[A-Z0-9_]+)\b", done.stdout))
