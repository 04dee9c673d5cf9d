"""The processes a benchmark runs against: a standalone simulated engine and a gateway.

Each runs in its own OS process on a free loopback port, is polled until it answers,
and is stopped (SIGTERM, then SIGKILL) when the `Processes` context exits. Also reads
per-process CPU time and RSS from /proc. Never touches anything but loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
_READY_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 5.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """One running server process."""

    name: str
    popen: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT
    log: IO[bytes]  # stdout+stderr go to a temp file: a full pipe would block the server

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def log_tail(self, limit: int = 2000) -> str:
        self.log.flush()
        self.log.seek(0, os.SEEK_END)
        size = self.log.tell()
        self.log.seek(max(0, size - limit))
        return self.log.read().decode(errors="replace")


def free_port() -> int:
    # A small race (the port could be taken before the server binds) is acceptable here.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by `pid` (fields 14 and 15 of /proc/PID/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def slotgate_command() -> list[str]:
    """The `slotgate` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "slotgate"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from router.cli import main; sys.exit(main())"]


def simulator_args(port: int, seqs: int, output_tokens: int) -> list[str]:
    return ["simulate", "--host", HOST, "--port", str(port), "--slots", str(seqs),
            "--ttft-s", "0", "--tokens-per-s", "0", "--output-tokens", str(output_tokens),
            "--model", "sim"]


@dataclass(frozen=True)
class BackendSpec:
    """One gateway backend (and a route of the same name) over the simulator."""

    name: str
    slots: int
    queue_limit: int


def gateway_yaml(port: int, sim_url: str, backends: Sequence[BackendSpec]) -> str:
    lines = ["server:", f"  host: {HOST}", f"  port: {port}", "  shutdown_timeout_s: 2",
             "backends:"]
    for b in backends:
        lines += [f"  {b.name}:", f"    url: {sim_url}/v1", "    model: sim",
                  f"    slots: {b.slots}", f"    queue_limit: {b.queue_limit}",
                  "    queue_timeout_s: 120"]
    lines.append("routes:")
    for b in backends:
        lines += [f"  {b.name}:", f"    primary: {b.name}", "    overflow: reject"]
    return "\n".join(lines) + "\n"


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:  # loopback only
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


class Processes:
    """Starts servers and stops every one of them on exit, whatever happened."""

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="slotgate-bench-")

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for server in reversed(self.servers):
            stop(server)
        self._tmp.cleanup()

    def start_simulator(self, seqs: int, output_tokens: int) -> Server:
        port = free_port()
        args = simulator_args(port, seqs, output_tokens)
        return self._start("simulator", args, f"http://{HOST}:{port}", "/sim/stats")

    def start_gateway(self, sim_url: str, backends: Sequence[BackendSpec],
                      log_level: str) -> Server:
        port = free_port()
        config = Path(self._tmp.name) / "gateway.yaml"
        config.write_text(gateway_yaml(port, sim_url, backends))
        args = ["serve", "--config", str(config), "--log-level", log_level]
        return self._start("gateway", args, f"http://{HOST}:{port}", "/readyz")

    def serve(self, config: dict[str, Any], name: str = "gateway") -> Server:
        """A gateway on `config` (its `server.host` and `port` are set here)."""
        port = free_port()
        config = {**config, "server": {**config.get("server", {}), "host": HOST,
                                       "port": port, "shutdown_timeout_s": 2}}
        path = Path(self._tmp.name) / f"{name}.yaml"
        path.write_text(json.dumps(config))  # YAML reads JSON
        return self._start(name, ["serve", "--config", str(path), "--log-level", "warning"],
                           f"http://{HOST}:{port}", "/readyz")

    def _start(self, name: str, args: list[str], url: str, probe: str) -> Server:
        log = open(Path(self._tmp.name) / f"{name}.log", "w+b")  # closed by stop()
        popen = subprocess.Popen([*slotgate_command(), *args], cwd=REPO, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT)
        server = Server(name, popen, url, log)
        self.servers.append(server)
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not _http_ok(url + probe):
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{server.log_tail()}")
            time.sleep(0.05)
        return server


def stop(server: Server) -> None:
    popen = server.popen
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(_STOP_TIMEOUT_S)
    with contextlib.suppress(OSError):
        server.log.close()


@contextlib.contextmanager
def cpu_window(servers: Sequence[Server]) -> Iterator[dict[str, float]]:
    """CPU seconds each server (and this process) used inside the `with` block."""
    out: dict[str, float] = {}
    before = {s.name: s.cpu_s() for s in servers}
    own = time.process_time()
    yield out
    for s in servers:
        out[s.name] = s.cpu_s() - before[s.name]
    out["client"] = time.process_time() - own
