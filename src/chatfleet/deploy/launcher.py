"""One machine: Redis, M engine replicas and N gateways as child processes.

`Launcher.start` starts them in that order and waits for each to answer (Redis's PING, the
replicas' /health, the gateways' /ready), `Launcher.watch` notices a child that dies, and
`Launcher.stop` stops them in reverse order: gateways, replicas, Redis. Every child runs in its
own process group (so that a terminal's Ctrl-C reaches only the launcher, which then stops
them in order, and so that an engine command's own children go with it) and, on Linux, is
told to exit when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG): no orphans.

Nothing here parses the command line or prints: `chatfleet launch` (cli/launch.py) does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chatfleet.core.errors import ChatfleetError
from chatfleet.gateway.config import ConfigError, cap_from_sweep, load_config

ENGINES = ("simserver", "command")
WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
STOP_GRACE_S = 20.0


class LaunchError(ChatfleetError):
    """Input the launcher cannot use (exit 2), with the option named."""


class ChildFailed(RuntimeError):
    """A child that exited, or did not get ready in time (exit 1)."""

    def __init__(self, child: Child, what: str) -> None:
        self.child = child
        self.what = what
        super().__init__(f"{child.name} ({child.role}, pid {child.pid}) {what}")

    def tail(self) -> str:
        return self.child.log_tail()


class Interrupted(Exception):
    """A stop was asked for (SIGINT or SIGTERM) while starting."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    gateways: int = 1
    replicas: int = 1
    engine: str = "simserver"
    engine_cmd: str | None = None
    redis: str = "auto"  # auto | none | redis://HOST:PORT/DB
    cap: int | None = None
    cap_from: Path | None = None
    queue_depth: int | None = None
    host: str = "127.0.0.1"
    port: int = 8080  # first gateway's port; 0: any free ports
    replica_port: int = 8100  # first replica's port; 0: any free ports
    gpu: str = "l4"
    weights: str = "bf16"
    kv_cache: str = "bf16"
    time_scale: float = 1.0
    config: Path | None = None
    log_dir: Path | None = None
    ready_timeout_s: float = 120.0


@dataclass(slots=True)
class Child:
    role: str  # redis | replica | gateway
    name: str
    argv: list[str]
    log: Path
    urls: list[str] = field(default_factory=list)  # what it serves (one per replica it hosts)
    probe: str = "/health"  # path that answers 200 once it is ready ("" for Redis's PING)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, lines: int = 20, max_chars: int = 3000) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])[-max_chars:]


# --- input -------------------------------------------------------------------------------------
def check_redis_url(url: str) -> str:
    parts = urlsplit(url)
    db = parts.path.lstrip("/")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "redis" or not parts.hostname or port is None or not db.isdigit():
        raise LaunchError(f"--redis {url!r}: give auto, none or redis://HOST:PORT/DB")
    return url


def check_spec(spec: LaunchSpec) -> LaunchSpec:
    """Every option checked before anything starts; returns the spec with the cap resolved
    from --cap-from."""
    if spec.gateways < 1:
        raise LaunchError("--gateways must be at least 1")
    if spec.replicas < 1:
        raise LaunchError("--replicas must be at least 1")
    if spec.engine not in ENGINES:
        raise LaunchError(f"--engine {spec.engine!r}: give one of {', '.join(ENGINES)}")
    if spec.engine == "command":
        engine_argv(spec, 0, 0)  # the template must format and name a program
    elif spec.engine_cmd:
        raise LaunchError("--engine-cmd needs --engine command")
    if spec.redis not in ("auto", "none"):
        check_redis_url(spec.redis)
    if spec.redis == "none" and spec.gateways > 1:
        raise LaunchError(f"{spec.gateways} gateways need a shared state: --redis auto or "
                          "redis://HOST:PORT/DB, not none")
    for flag, port, n in (("--port", spec.port, spec.gateways),
                          ("--replica-port", spec.replica_port, spec.replicas)):
        if not 0 <= port <= 65535 or (port and port + n - 1 > 65535):
            raise LaunchError(f"{flag} {port} with {n} processes is outside 0..65535")
    if spec.port and spec.replica_port:
        gw = set(range(spec.port, spec.port + spec.gateways))
        if gw & set(range(spec.replica_port, spec.replica_port + spec.replicas)):
            raise LaunchError(f"--port {spec.port} and --replica-port {spec.replica_port} "
                              "overlap: the gateways and the replicas need their own ports")
    if not (spec.time_scale > 0 and spec.time_scale != float("inf")):
        raise LaunchError("--time-scale must be a positive finite number")
    if not spec.ready_timeout_s > 0:
        raise LaunchError("--ready-timeout must be positive")
    if spec.queue_depth is not None and spec.queue_depth < 0:
        raise LaunchError("--queue-depth must not be negative")
    cap = spec.cap
    if spec.cap_from is not None:
        if cap is not None:
            raise LaunchError("give --cap or --cap-from, not both")
        try:
            cap = cap_from_sweep(spec.cap_from)
        except ConfigError as exc:
            raise LaunchError(str(exc)) from exc
    if cap is not None and cap < 1:
        raise LaunchError("--cap must be at least 1")
    if spec.config is not None:
        try:
            load_config(spec.config)
        except ConfigError as exc:
            raise LaunchError(f"--config: {exc}") from exc
    return LaunchSpec(**{**_fields(spec), "cap": cap, "cap_from": None})


def _fields(spec: LaunchSpec) -> dict[str, Any]:
    return {k: getattr(spec, k) for k in LaunchSpec.__dataclass_fields__}


def engine_argv(spec: LaunchSpec, index: int, port: int) -> list[str]:
    """The engine template with {port}, {host} and {index} filled in, split like a shell
    would (no shell runs it)."""
    template = spec.engine_cmd or ""
    if not template.strip():
        raise LaunchError("--engine command needs --engine-cmd 'PROGRAM ... --port {port}'")
    if "{port}" not in template:
        raise LaunchError("--engine-cmd must contain {port} (each replica gets its own)")
    try:
        text = template.format(port=port, host=spec.host, index=index)
        argv = shlex.split(text)
    except (KeyError, IndexError, ValueError) as exc:
        raise LaunchError(f"--engine-cmd {template!r}: {exc} (placeholders: {{port}}, "
                          "{host}, {index}; write {{ and }} for literal braces)") from exc
    if not argv:
        raise LaunchError("--engine-cmd is empty")
    if shutil.which(argv[0]) is None:
        raise LaunchError(f"--engine-cmd: program {argv[0]!r} not found")
    return argv


# --- ports and commands ------------------------------------------------------------------------
def connect_host(host: str) -> str:
    return WILDCARD.get(host, host)


def http_url(host: str, port: int) -> str:
    h = connect_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, n: int, *, contiguous: bool) -> list[int]:
    """n ports free on `host` now (the OS's choice; contiguous when asked)."""
    for _ in range(200):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as s:
            s.bind((host, 0))
            first = int(s.getsockname()[1])
        ports = list(range(first, first + n)) if contiguous else [first]
        if not contiguous:
            while len(ports) < n:
                with socket.socket(family) as s:
                    s.bind((host, 0))
                    p = int(s.getsockname()[1])
                if p not in ports:
                    ports.append(p)
        if ports[-1] <= 65535 and all(port_free(host, p) for p in ports):
            return ports
    raise LaunchError(f"found no {n} free ports on {host}")


def chatfleet_argv() -> list[str]:
    """How to run `chatfleet` from this interpreter."""
    script = Path(sys.executable).with_name("chatfleet")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from chatfleet.cli import main; "
            "sys.argv[0] = 'chatfleet'; main()"]


def plan_children(spec: LaunchSpec, *, log_dir: Path, gateway_ports: list[int],
                  replica_ports: list[int], state: str, redis: Child | None) -> list[Child]:
    """The children in start order (Redis, replicas, gateways); nothing starts here."""
    children: list[Child] = [] if redis is None else [redis]
    cf = chatfleet_argv()
    py_env = {"PYTHONUNBUFFERED": "1"}
    replica_urls = [http_url(spec.host, p) for p in replica_ports]
    if spec.engine == "simserver":
        children.append(Child(
            "replica", "simserver", [*cf, "simserver", "--gpu", spec.gpu, "--weights",
                                     spec.weights, "--kv-cache", spec.kv_cache, "--host",
                                     spec.host, "--port", str(replica_ports[0]), "--replicas",
                                     str(spec.replicas), "--time-scale", f"{spec.time_scale:g}"],
            log_dir / "simserver.log", replica_urls, env=py_env))
    else:
        for i, (port, url) in enumerate(zip(replica_ports, replica_urls, strict=True)):
            children.append(Child("replica", f"replica-{i}", engine_argv(spec, i, port),
                                  log_dir / f"replica-{i}.log", [url]))
    replica_flags = [a for i, url in enumerate(replica_urls)
                     for a in ("--replica", f"replica-{i}={url}")]
    limits = [] if spec.cap is None else ["--cap", str(spec.cap)]
    if spec.queue_depth is not None:
        limits += ["--queue-depth", str(spec.queue_depth)]
    if spec.config is not None:
        limits += ["--config", str(spec.config.resolve())]
    if state != "memory":  # the shares protocol counts on knowing how many gateways there are
        limits += ["--gateways", str(spec.gateways)]
    for i, port in enumerate(gateway_ports):
        children.append(Child(
            "gateway", f"gateway-{i}", [*cf, "gateway", *replica_flags, *limits, "--state",
                                        state, "--host", spec.host, "--port", str(port)],
            log_dir / f"gateway-{i}.log", [http_url(spec.host, port)], probe="/ready",
            env=py_env))
    return children


# --- probes ------------------------------------------------------------------------------------
def http_ready(url: str, timeout_s: float = 1.0) -> str | None:
    """None when GET url answers 200, else what it answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason)


def redis_ping(host: str, port: int, timeout_s: float = 1.0) -> str | None:
    """None when Redis answers PING with PONG (or asks for a password: it is up)."""
    try:
        with socket.create_connection((host, port), timeout_s) as s:
            s.sendall(b"PING\r\n")
            answer = s.recv(64)
    except OSError as exc:
        return str(exc)
    if answer.startswith(b"+PONG") or b"NOAUTH" in answer:
        return None
    return f"answered {answer[:40]!r}"


# --- processes ---------------------------------------------------------------------------------
def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start_child(child: Child) -> None:
    child.log.parent.mkdir(parents=True, exist_ok=True)
    with open(child.log, "ab") as log:
        try:
            child.proc = subprocess.Popen(
                child.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **child.env}, start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()))
        except OSError as exc:
            raise LaunchError(f"cannot start {child.name}: {exc}") from exc


def stop_child(child: Child, grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM to its process group, SIGKILL after `grace_s`; its exit status."""
    proc = child.proc
    if proc is None:
        return None
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # anything the child left in its group (an engine wrapper's own children) goes too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


class Launcher:
    """The processes of one `chatfleet launch`: start in order, watch, stop in reverse."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = check_spec(spec)
        self.children: list[Child] = []
        self.state = "memory"
        self.redis_url: str | None = None
        self._redis_dir: Path | None = None
        self.notes: list[str] = []
        self._redis_binary = shutil.which("redis-server") if spec.redis == "auto" else None
        if spec.redis == "auto" and self._redis_binary is None and spec.gateways > 1:
            raise LaunchError(f"{spec.gateways} gateways share their state in Redis, and "
                              "redis-server is not installed (Debian: apt-get install "
                              "redis-server); or pass --redis redis://HOST:PORT/DB")
        self.log_dir = spec.log_dir or Path(tempfile.mkdtemp(prefix="chatfleet-launch-"))

    # -- plan --
    def _ports(self) -> tuple[list[int], list[int]]:
        s = self.spec
        gw = (list(range(s.port, s.port + s.gateways)) if s.port
              else free_ports(s.host, s.gateways, contiguous=False))
        contiguous = s.engine == "simserver"  # one process serves P..P+M-1
        if s.replica_port:
            rp = list(range(s.replica_port, s.replica_port + s.replicas))
        else:
            for _ in range(20):
                rp = free_ports(s.host, s.replicas, contiguous=contiguous)
                if not set(rp) & set(gw):
                    break
        for role, ports in (("gateway", gw), ("replica", rp)):
            for i, p in enumerate(ports):
                if not port_free(s.host, p):
                    flag = "--port" if role == "gateway" else "--replica-port"
                    raise LaunchError(f"port {p} ({role} {i}) is in use on {s.host}: pick "
                                      f"another {flag}, or 0 for any free ports")
        return gw, rp

    def _redis(self) -> Child | None:
        s = self.spec
        if s.redis == "none":
            return None
        if s.redis != "auto":
            host, port = urlsplit(s.redis).hostname or "", urlsplit(s.redis).port or 6379
            why = redis_ping(host, port, 2.0)
            if why is not None:
                raise LaunchError(f"--redis {s.redis}: no Redis answers there ({why})")
            self.state = self.redis_url = s.redis
            return None
        binary = self._redis_binary
        if binary is None:
            self.notes.append("redis-server is not installed: the one gateway keeps its "
                              "state in memory")
            return None
        [port] = free_ports("127.0.0.1", 1, contiguous=False)
        self._redis_dir = Path(tempfile.mkdtemp(prefix="chatfleet-redis-"))
        self.state = self.redis_url = f"redis://127.0.0.1:{port}/0"
        return Child("redis", "redis", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                        "--save", "", "--appendonly", "no", "--dir",
                                        str(self._redis_dir)],
                     self.log_dir / "redis.log", [self.redis_url], probe="")

    # -- run --
    def start(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Start every child in order and wait until each answers. Raises ChildFailed (one
        exited or was not ready in time: the ones started are left for `stop`), Interrupted
        or LaunchError."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        gw_ports, rep_ports = self._ports()
        redis = self._redis()
        self.children = plan_children(self.spec, log_dir=self.log_dir, gateway_ports=gw_ports,
                                      replica_ports=rep_ports, state=self.state, redis=redis)
        for role in ("redis", "replica", "gateway"):  # each group starts together
            group = [c for c in self.children if c.role == role]
            for child in group:
                start_child(child)
            for child in group:
                self._wait_ready(child, stopping)

    def _wait_ready(self, child: Child, stopping: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout_s
        pending = list(child.urls)
        last = "no answer yet"
        while pending:
            if stopping():
                raise Interrupted
            assert child.proc is not None
            status = child.proc.poll()
            if status is not None:
                raise ChildFailed(child, f"exited with status {status} before it was ready")
            url = pending[0]
            if child.role == "redis":
                parts = urlsplit(url)
                why = redis_ping(parts.hostname or "", parts.port or 6379)
            else:
                why = http_ready(url + child.probe)
            if why is None:
                pending.pop(0)
                continue
            last = why
            if time.monotonic() > deadline:
                raise ChildFailed(child, f"not ready after {self.spec.ready_timeout_s:g} s "
                                  f"({url}{child.probe} answered: {last})")
            time.sleep(0.1)

    def watch(self, stopping: Callable[[], bool], poll_s: float = 0.2) -> Child | None:
        """Block until a stop is asked (None) or a child exits (that child)."""
        while not stopping():
            for child in self.children:
                if child.proc is not None and child.proc.poll() is not None:
                    return child
            time.sleep(poll_s)
        return None

    def stop(self) -> list[tuple[Child, int | None]]:
        """Gateways, then replicas, then Redis (reverse start order); each one's status."""
        done = [(c, stop_child(c)) for c in reversed(self.children)]
        if self._redis_dir is not None:
            shutil.rmtree(self._redis_dir, ignore_errors=True)
        return done

    def endpoints(self) -> dict[str, Any]:
        def row(c: Child, url: str) -> dict[str, Any]:
            return {"name": c.name, "url": url, "pid": c.pid, "log": str(c.log)}

        gateways = [row(c, c.urls[0]) for c in self.children if c.role == "gateway"]
        replicas = []
        for c in self.children:
            if c.role == "replica":
                for i, url in enumerate(c.urls):
                    r = row(c, url)
                    if len(c.urls) > 1 or c.name == "simserver":
                        r["name"] = f"replica-{i}"
                        r["process"] = c.name
                    replicas.append(r)
        redis = next((c for c in self.children if c.role == "redis"), None)
        return {"gateways": gateways, "replicas": replicas,
                "redis": (None if self.redis_url is None else
                          {"url": self.redis_url, "managed": redis is not None,
                           "pid": redis.pid if redis else None,
                           "log": str(redis.log) if redis else None}),
                "state": self.state, "engine": self.spec.engine, "log_dir": str(self.log_dir)}
