"""Which series exist at 0 before their first event: the label sets known from the config.

A counter or histogram whose labels are config names (backends, replicas, routes, tenants)
or small closed sets (reject reasons, priority classes, client APIs, status classes) has
each of its series at 0 from startup, so a panel or a ratio reads 0 on a quiet gateway,
not "no data". A reload that adds a name adds its series at 0; one that removes a
backend, replica or route removes every series carrying it (a removed tenant's series keep
their counts until a restart). Labels of open sets appear on first use (see
Metrics.configure and docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

from router.telemetry.tallies import Labels, Spread, Tally

if TYPE_CHECKING:
    from policies.config import Config
    from policies.slots import SlotPool

# What each label of a family holds: a config value of one kind ("endpoint": a replica of
# the backend named by the label before it, "group": a backend of more than one replica),
# or "" (a closed set, a tenant, or "none"/"unknown"/"other": never removed).
Dim = Literal["backend", "group", "endpoint", "route", "currency", ""]
STATUS_CLASSES = ("2xx", "4xx", "5xx")  # what the gateway answers (no 1xx, no 3xx)


@dataclass(frozen=True, slots=True)
class Scope:
    """The config's names, as label values."""

    apis: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # each backend's APIs
    replicas: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # its replicas
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # primary, fallbacks
    tenants: tuple[str, ...] = ()  # the tenant label's values (none without keys)
    priced: tuple[str, ...] = ()  # the backends whose cost is counted
    currency: str = ""

    @classmethod
    def of(cls, config: Config, pools: Mapping[str, SlotPool],
           tenants: Iterable[str]) -> Scope:
        names = [n for n in config.backends if n in pools]
        return cls(
            apis={n: tuple(sorted(a.value for a in config.backends[n].served_apis))
                  for n in names},
            replicas={n: tuple(s.name for s in pools[n].seats()) for n in names},
            routes={name: tuple(b for b in (r.primary, *r.fallbacks) if b in pools)
                    for name, r in config.routes.items()},
            tenants=tuple(tenants),
            priced=tuple(n for n in names if config.ledger.enabled
                         and config.backends[n].price is not None),
            currency=config.currency)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.replicas)

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(n for n, replicas in self.replicas.items() if len(replicas) > 1)


@dataclass(frozen=True, slots=True)
class Labelled:
    """A family, what its labels hold, and its series at 0 in a scope."""

    family: Tally | Spread
    dims: tuple[Dim, ...]
    zeros: Callable[[Scope], Iterable[Labels]]


def rescope(families: Iterable[Labelled], old: Scope, new: Scope) -> None:
    """Remove the series of names `new` no longer has, then add `new`'s zeros."""
    gone: dict[Dim, set[str]] = {
        "backend": set(old.backends) - set(new.backends),
        "group": set(old.groups) - set(new.groups),
        "route": set(old.routes) - set(new.routes),
        "currency": {old.currency} - {new.currency},
    }
    replicas = {(b, r) for b, names in old.replicas.items() for r in names} - {
        (b, r) for b, names in new.replicas.items() for r in names}

    def stale(dims: tuple[Dim, ...], labels: Labels) -> bool:
        return any((labels[i - 1], value) in replicas if dim == "endpoint"
                   else value in gone.get(dim, ())
                   for i, (dim, value) in enumerate(zip(dims, labels, strict=True)))

    for labelled in families:
        labelled.family.drop(partial(stale, labelled.dims))
        for labels in labelled.zeros(new):
            labelled.family.zero(labels)
