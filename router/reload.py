"""Config reload without dropping anything (SIGHUP, `slotgate reload`, POST /admin/reload).

A valid config is swapped in at once: new requests see its routes, limits, prices,
experiments and TTFT objectives; requests already running keep the config they started
with, and leases already held stay valid (a pool made smaller admits no one until enough
are released).
Backends can be added and changed (URL, model, limits, timeouts, price); a removed
backend stays idle until the next restart, its series gone from /metrics. What a running
process cannot change (where it listens, the pools' coordination, the ledger, a simulated
engine) refuses the whole reload, as does an invalid file: the old config is kept and the
errors are returned.
"""

from __future__ import annotations

import logging
from pathlib import Path

from policies.config import Config
from router.assembly import add_backend, watch, wire_routes
from router.common.config_error import ConfigError
from router.config import load_config
from router.fleet.groups import start_discovery
from router.gateway import Gateway
from router.request.auth import Keyring

log = logging.getLogger("slotgate")


class ReloadRefused(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def restart_only(old: Config, new: Config) -> list[str]:
    """The changes a reload cannot apply, each as a sentence."""
    problems = []
    if (old.server.host, old.server.port) != (new.server.host, new.server.port):
        problems.append("server.host and server.port change only with a restart")
    if old.coordination != new.coordination:
        problems.append("coordination changes only with a restart")
    if old.ledger != new.ledger:
        problems.append("ledger changes only with a restart")
    for name, backend in new.backends.items():
        before = old.backends.get(name)
        if before is None:
            continue
        if (before.discover is None) != (backend.discover is None):
            problems.append(f"backends.{name}: switching to or from 'discover' changes only "
                            "with a restart")
        engines = {e.name: e.simulated for e in before.replicas(name)}
        if any(e.name in engines and engines[e.name] != e.simulated
               for e in backend.replicas(name)):
            problems.append(f"backends.{name}: a simulated engine changes only with a restart")
    return problems


async def reload_file(gw: Gateway, path: str | Path | None) -> list[str]:
    """Reload from `path` (the embedded config when None); returns what changed."""
    try:
        new = load_config(path)
    except ConfigError as exc:
        raise ReloadRefused([str(p) for p in exc.problems]) from None
    return await apply(gw, new)


async def apply(gw: Gateway, new: Config) -> list[str]:
    old = gw.config
    problems = restart_only(old, new)
    if problems:
        raise ReloadRefused(problems)
    try:
        keyring = Keyring(new.auth)  # a key read from the environment may be missing
    except ConfigError as exc:
        raise ReloadRefused([str(p) for p in exc.problems]) from None
    gw.config, gw.keyring = new, keyring  # from here on, new requests see the new config
    gw.quotas.configure(new.auth.keys)  # reservations, buckets and spends are kept
    if gw.shared_quotas is not None:
        gw.shared_quotas.configure(new.auth.keys)
    changes = []
    for name, backend in new.backends.items():
        if name not in gw.backends:
            await add_backend(gw, name, backend)
            changes.append(f"backend {name} added")
            continue
        if backend == old.backends.get(name) and not gw.backends[name].drained:
            continue
        drained = set(gw.backends[name].drained)
        gw.backends[name].drained.clear()  # a reload listing a drained replica brings it back
        if backend.discover is not None:  # its group is discovery's to change
            if gw.discovery is not None:
                gw.discovery.refresh_now(name)
            changes.append(f"backend {name} changed (its replicas are found again)")
            continue
        await gw.backends[name].change(backend)
        if gw.drains is not None:  # on every gateway sharing the coordination
            await gw.drains.returned(name, drained, backend)
        watch(gw, gw.backends[name])  # a group now, perhaps; new breaker settings
        changes.append(f"backend {name} changed")
    changes += [f"backend {name} removed (idle until restart)"
                for name in old.backends.keys() - new.backends.keys()]
    if new.routes != old.routes:
        changes.append("routes changed")
    if new.experiments != old.experiments:
        changes.append("experiments changed")
    if new.auth != old.auth:
        changes.append("auth changed")
    if new.slo != old.slo:
        changes.append("slo changed")
    gw.metrics.configure(new)  # new names' series at 0, removed ones' gone
    wire_routes(gw)
    start_discovery(gw)  # for a discovered backend the reload added
    log.info("config reloaded: %s", "; ".join(changes) or "no change")
    return changes
