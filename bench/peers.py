"""The servers of the side-by-side suite (bench/suite.py).

Every server runs in its own process group on a free loopback port, is polled until it
answers, and is stopped (SIGTERM to its group, then SIGKILL) when `Fleet` exits. CPU time
and memory are read from /proc for a server's whole process tree (nginx's master and
worker, slotgate's --workers parent and children). Never touches anything but loopback.
The tools the suite installs (LiteLLM, nginx, wrk, matplotlib, py-spy): bench/peer_tools.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from harness import HOST, REPO, free_port, slotgate_command
from peer_configs import MOCK_MODEL, litellm_yaml, nginx_conf
from peer_tools import LITELLM_VENV

BENCH = REPO / "bench"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_STOP_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- /proc


def children_of(pid: int) -> list[int]:
    """`pid` and all its descendants that are alive now."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, []))
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime (fields 14 and 15 of /proc/PID/stat) summed over `pids`."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            raw = Path(f"/proc/{pid}/stat").read_text()
            fields = raw[raw.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / _CLOCK_TICKS


def status_kib(pids: Iterable[int], key: str) -> int:
    """A /proc/PID/status field in KiB (VmRSS, VmHWM) summed over `pids`."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
                    break
    return total


def pin(pids: Iterable[int], cpus: set[int]) -> None:
    """Every thread of every process in `pids` onto `cpus` (as `taskset -a -p`)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cpus)


# ---------------------------------------------------------------- servers


@dataclass
class Server:
    """One running server (and its child processes)."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    log_path: Path
    chat_url: str = ""  # where chat completions go
    auth: str = ""  # the Authorization header value it needs, if any

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tree(self) -> list[int]:
        return children_of(self.pid)

    def cpu_s(self) -> float:
        return cpu_seconds(self.tree())

    def rss_mib(self) -> float:
        return status_kib(self.tree(), "VmRSS") / 1024

    def hwm_mib(self) -> float:
        """Peak RSS (VmHWM), summed over the processes of the tree."""
        return status_kib(self.tree(), "VmHWM") / 1024

    def pin(self, cpus: set[int]) -> None:
        pin(self.tree(), cpus)

    def log_tail(self, limit: int = 3000) -> str:
        with contextlib.suppress(OSError), self.log_path.open("rb") as log:
            log.seek(max(0, self.log_path.stat().st_size - limit))
            return log.read().decode(errors="replace")
        return ""


def http_ok(url: str, headers: Mapping[str, str] | None = None) -> bool:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=2.0) as resp:  # loopback only
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def stop(server: Server) -> None:
    popen = server.popen
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(_STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):  # stragglers of its group (nginx workers)
        os.killpg(popen.pid, signal.SIGKILL)


@dataclass
class Fleet:
    """Starts servers, and stops every one of them on exit whatever happened."""

    servers: list[Server] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] = field(
        default_factory=lambda: tempfile.TemporaryDirectory(prefix="slotgate-suite-"))

    @property
    def dir(self) -> Path:
        return Path(self._tmp.name)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for server in reversed(self.servers):
            stop(server)
        self.servers.clear()
        self._tmp.cleanup()

    def start(self, name: str, argv: Sequence[str], url: str, probe: str, *,
              env: Mapping[str, str] | None = None, unset: Sequence[str] = (),
              timeout_s: float = 30.0,
              probe_headers: Mapping[str, str] | None = None) -> Server:
        log_path = self.dir / f"{name}.log"
        environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
        with log_path.open("wb") as log:
            popen = subprocess.Popen(list(argv), cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     env=environment, start_new_session=True)
        server = Server(name, popen, url, log_path)
        self.servers.append(server)
        deadline = time.monotonic() + timeout_s
        while not http_ok(url + probe, probe_headers):
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{server.log_tail()}")
            time.sleep(0.1)
        return server

    def retire(self, server: Server) -> None:
        stop(server)
        self.servers.remove(server)

    def redis(self) -> str:
        """A private redis-server on a free loopback port (no persistence): its URL."""
        program = shutil.which("redis-server")
        if program is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = free_port()
        log_path = self.dir / "redis.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen([program, "--port", str(port), "--bind", HOST, "--save",
                                      "", "--appendonly", "no"], cwd=self.dir,
                                     stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        server = Server("redis", popen, f"redis://{HOST}:{port}/0", log_path)
        self.servers.append(server)
        deadline = time.monotonic() + 10.0
        while b"Ready to accept connections" not in log_path.read_bytes():
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {server.log_tail(500)}")
            time.sleep(0.05)
        return server.url

    # ------------------------------------------------------------ the servers

    def mock(self) -> Server:
        port = free_port()
        server = self.start("mock", [sys.executable, str(BENCH / "mock_backend.py"),
                                     "--host", HOST, "--port", str(port)],
                            f"http://{HOST}:{port}", "/health")
        server.chat_url = server.url + "/v1/chat/completions"
        return server

    def simulator(self) -> Server:
        """slotgate's own simulated engine at zero think time: it keeps per-request records
        (GET /sim/requests) and can hold every generation (POST /sim/hold)."""
        port = free_port()
        args = ["simulate", "--host", HOST, "--port", str(port), "--slots", "4096",
                "--ttft-s", "0", "--tokens-per-s", "0", "--output-tokens", "16",
                "--model", MOCK_MODEL]
        server = self.start("simulator", [*slotgate_command(), *args], f"http://{HOST}:{port}",
                            "/sim/stats")
        server.chat_url = server.url + "/v1/chat/completions"
        return server

    def slotgate(self, name: str, config_yaml: str, port: int, key: str,
                 workers: int = 1, command: list[str] | None = None) -> Server:
        """`command`: what runs `slotgate` (default: this environment's console script)."""
        config = self.dir / f"{name}.yaml"
        config.write_text(config_yaml)
        args = ["serve", "--config", str(config), "--log-level", "INFO"]
        if workers > 1:
            args += ["--workers", str(workers)]
        server = self.start(name, [*(command or slotgate_command()), *args],
                            f"http://{HOST}:{port}", "/readyz", timeout_s=60.0)
        server.chat_url = server.url + "/v1/chat/completions"
        server.auth = f"Bearer {key}"
        return server

    def passthrough(self, mock_url: str) -> Server:
        """bench/passthrough.py: bare aiohttp + uvloop, the floor of an aiohttp gateway."""
        port = free_port()
        server = self.start("aiohttp", [sys.executable, str(BENCH / "passthrough.py"),
                                        "--upstream", mock_url, "--host", HOST,
                                        "--port", str(port)],
                            f"http://{HOST}:{port}", "/health")
        server.chat_url = server.url + "/v1/chat/completions"
        return server

    def litellm(self, mock_url: str, key: str) -> Server:
        port = free_port()
        config = self.dir / "litellm.yaml"
        config.write_text(litellm_yaml(mock_url, key))
        env = {  # no telemetry, no cost map download, no .env, no database
            "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_MODE": "PRODUCTION", "DISABLE_SCHEMA_UPDATE": "True",
            "NO_DOCS": "True", "DO_NOT_TRACK": "1",
        }
        argv = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(config),
                "--host", HOST, "--port", str(port), "--num_workers", "1"]
        server = self.start("litellm", argv, f"http://{HOST}:{port}", "/health/liveliness",
                            env=env, unset=("DATABASE_URL",), timeout_s=120.0)
        server.chat_url = server.url + "/v1/chat/completions"
        server.auth = f"Bearer {key}"
        return server

    def nginx(self, nginx: str, mock_url: str) -> Server:
        port = free_port()
        root = self.dir / "nginx"
        root.mkdir(exist_ok=True)
        root.chmod(0o777)  # the worker runs as nobody when we are root
        config = root / "nginx.conf"
        config.write_text(nginx_conf(port, mock_url, root))
        argv = [nginx, "-p", str(root), "-c", str(config), "-e", str(root / "error.log")]
        server = self.start("nginx", argv, f"http://{HOST}:{port}", "/health")
        server.chat_url = server.url + "/v1/chat/completions"
        return server
