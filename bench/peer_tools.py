"""The tools the side-by-side suite (bench/suite.py) installs or finds, each into a place of
its own: LiteLLM's proxy into bench/.venv-litellm, matplotlib and py-spy into
bench/.venv-tools (both gitignored), nginx and wrk from Debian's packages when `apt` is
allowed. Whatever cannot be installed is skipped, with the reason, and the rest of the
suite still runs. The servers themselves: bench/peers.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO

LITELLM_VENV = REPO / "bench" / ".venv-litellm"
TOOLS_VENV = REPO / "bench" / ".venv-tools"
# litellm[proxy] from 1.109 on needs companion packages newer than the registry serves
# here (litellm-proxy, litellm-proxy-extras 0.4.113); 1.108.0 installs as a whole.
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.0"
TOOLS_REQUIREMENTS = ("matplotlib==3.11.2", "py-spy==0.4.3")
_INSTALL_TIMEOUT_S = 900.0


@dataclass
class Tools:
    """What the suite found or installed, and why anything is missing."""

    wrk: str | None = None
    nginx: str | None = None
    litellm: bool = False
    tools_python: str | None = None  # the bench/.venv-tools interpreter (matplotlib)
    py_spy: str | None = None
    notes: list[str] = field(default_factory=list)


def _run(argv: Sequence[str], timeout_s: float = _INSTALL_TIMEOUT_S) -> tuple[bool, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    lines = [line for line in (done.stdout + done.stderr).decode(errors="replace").splitlines()
             if not line.startswith("WARNING: Location")]  # the registry mirror's chatter
    return done.returncode == 0, "\n".join(lines[-5:])


def base_python() -> str:
    """The interpreter this venv was made from: new venvs must not nest in ours."""
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return shutil.which("python3") or sys.executable


def ensure_venv(venv: Path, requirements: Sequence[str], log: list[str]) -> bool:
    """A venv holding exactly `requirements`, made once and kept (a stamp file says what)."""
    stamp = venv / ".bench-installed"
    wanted = "\n".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted:
        return True
    print(f"  installing {' '.join(requirements)} into {venv.relative_to(REPO)} ...",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    if not (venv / "bin" / "python").exists():
        ok, out = _run([base_python(), "-m", "venv", str(venv)])
        if not ok:
            log.append(f"could not create {venv.name}: {out}")
            return False
    (venv / ".gitignore").write_text("*\n")
    pip = str(venv / "bin" / "pip")
    _run([pip, "install", "--quiet", "--upgrade", "pip"])
    ok, out = _run([pip, "install", "--quiet", *requirements])
    if not ok:
        log.append(f"pip install {' '.join(requirements)} failed: {out.strip()}")
        return False
    stamp.write_text(wanted)
    print(f"  ... done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return True


def ensure_apt(programs: Mapping[str, str], allow: bool, log: list[str]) -> dict[str, str]:
    """{program: path} for those found; installs the missing Debian packages if allowed."""
    found = {p: path for p in programs if (path := shutil.which(p) or _sbin(p))}
    missing = {p: pkg for p, pkg in programs.items() if p not in found}
    if missing and allow:
        print(f"  apt-get install {' '.join(missing.values())} ...", file=sys.stderr, flush=True)
        env_ok, out = _run(["apt-get", "update", "-q"], 300)
        if env_ok:
            env_ok, out = _run(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install",
                                "-y", "-q", "--no-install-recommends", *missing.values()])
        if not env_ok:
            log.append(f"apt-get install {' '.join(missing.values())} failed: {out.strip()}")
        found.update({p: path for p in missing if (path := shutil.which(p) or _sbin(p))})
    for program, pkg in programs.items():
        if program not in found:
            hint = "" if allow else f" (run with --apt, or apt-get install {pkg})"
            log.append(f"{program} is not installed: skipped{hint}")
    return found


def _sbin(program: str) -> str | None:
    path = Path("/usr/sbin") / program
    return str(path) if path.exists() else None


def prepare(*, apt: bool, litellm: bool, nginx: bool) -> Tools:
    tools = Tools()
    wanted = {"wrk": "wrk"}
    if nginx:
        wanted["nginx"] = "nginx"
    found = ensure_apt(wanted, apt, tools.notes)
    tools.wrk, tools.nginx = found.get("wrk"), found.get("nginx")
    if not nginx:
        tools.notes.append("nginx: skipped (--no-nginx)")
    if litellm:
        tools.litellm = ensure_venv(LITELLM_VENV, [LITELLM_REQUIREMENT], tools.notes)
    else:
        tools.notes.append("LiteLLM: skipped (--no-litellm)")
    if ensure_venv(TOOLS_VENV, TOOLS_REQUIREMENTS, tools.notes):
        tools.tools_python = str(TOOLS_VENV / "bin" / "python")
        tools.py_spy = str(TOOLS_VENV / "bin" / "py-spy")
    return tools


def version_of(argv: Sequence[str]) -> str | None:
    """The first line a tool prints about its version (nginx and wrk print to stderr)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).decode(errors="replace").strip()
    return text.splitlines()[0] if text else None
