"""Finding a group's replicas (#34): the addresses of a DNS name (A/AAAA records, at the
configured port, or SRV records with their own ports), or the lines of a file of URLs.

A lookup that fails (a timeout, SERVFAIL, an unreadable file) returns None: the group
keeps the replicas it has, since a resolver's hiccup must not empty a fleet. A name with
no address (NXDOMAIN, no records: a headless Service of no pod) or an empty file is a
group of none: scaled to zero. Resolution is dnspython's, asynchronous, against the
system's resolver or the configured nameservers; nothing here is cached between looks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.resolver

from policies.config.fleet import DiscoveryConfig, split_nameserver

log = logging.getLogger("slotgate")

LOOKUP_S = 5.0  # one lookup's bound, retries included
FILE_BYTES = 1024 * 1024  # a file of URLs is read up to this much
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # EndpointConfig's name pattern


@dataclass(frozen=True, slots=True)
class Found:
    """One replica found: its name (a metric label, the drain's handle) and base URL."""

    name: str
    url: str


async def find(config: DiscoveryConfig) -> list[Found] | None:
    """The replicas there now, at most `max_replicas`, each name once (None: the lookup
    failed, keep what you have)."""
    found = await _dns(config) if config.dns is not None else _file(config)
    if found is None:
        return None
    firsts: dict[str, Found] = {}
    for replica in found:
        firsts.setdefault(replica.name, replica)  # a name taken: the first keeps it
    unique = list(firsts.values())
    if len(unique) > config.max_replicas:
        log.warning("discovery of %s found %d replicas: the first %d are kept",
                    config.dns or config.file, len(unique), config.max_replicas)
    return unique[:config.max_replicas]


def _resolver(config: DiscoveryConfig) -> dns.asyncresolver.Resolver:
    resolver = dns.asyncresolver.Resolver(configure=not config.nameservers)
    if config.nameservers:
        servers = [split_nameserver(s) for s in config.nameservers]
        resolver.nameservers = [host for host, _ in servers]
        resolver.nameserver_ports = dict(servers)
    resolver.lifetime = LOOKUP_S
    return resolver


async def _dns(config: DiscoveryConfig) -> list[Found] | None:
    assert config.dns is not None
    resolver = _resolver(config)
    try:
        if config.record != "SRV":
            return [_at(config, address, config.port, address)
                    for address in await _addresses(resolver, config.dns, config.record)]
        answer = await resolver.resolve(config.dns, "SRV", search=True)
        targets = sorted(answer, key=lambda r: (r.priority, -r.weight, str(r.target)))
        looked = await asyncio.gather(*(_addresses(resolver, str(r.target), "A")
                                        for r in targets))
        return [_at(config, addresses[0], record.port, str(record.target).split(".")[0])
                for record, addresses in zip(targets, looked, strict=True) if addresses]
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    except dns.exception.DNSException as exc:
        log.warning("discovery: looking up %s failed (%s): the replicas found before are "
                    "kept", config.dns, type(exc).__name__)
        return None


async def _addresses(resolver: dns.asyncresolver.Resolver, name: str,
                     record: str) -> list[str]:
    try:
        answer = await resolver.resolve(name, record, search=True)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return []
    return sorted(str(r) for r in answer)


def _at(config: DiscoveryConfig, host: str, port: int, label: str) -> Found:
    """The replica at `host`:`port`, named `label` (an address: its text, IPv6's colons
    as dashes)."""
    name = label.replace(":", "-").strip("-.") or "replica"
    where = f"[{host}]" if ":" in host else host
    return Found(name[:63], f"{config.scheme}://{where}:{port}{config.path.rstrip('/')}")


def _file(config: DiscoveryConfig) -> list[Found] | None:
    """Each line `URL [NAME]` (`#` starts a comment); a line that is no http(s) URL is
    skipped with a warning. The name defaults to the URL's host and port."""
    assert config.file is not None
    try:
        with open(config.file, "rb") as f:
            text = f.read(FILE_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        log.warning("discovery: %s cannot be read (%s): the replicas found before are "
                    "kept", config.file, os.strerror(exc.errno or 0) or type(exc).__name__)
        return None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        replica = _line(words)
        if replica is None:
            log.warning("discovery: %s line %d is not `URL [NAME]` with an http(s) URL and "
                        "a name of letters, digits, '.', '_' or '-': skipped",
                        config.file, number)
            continue
        found.append(replica)
    return found


def _line(words: list[str]) -> Found | None:
    if len(words) > 2:
        return None
    try:
        url = urlsplit(words[0])
        port = url.port
    except ValueError:
        return None
    if url.scheme not in ("http", "https") or not url.hostname or url.username \
            or url.password or url.query or url.fragment:
        return None
    name = words[1] if len(words) == 2 else _default_name(url.hostname, port)
    return Found(name, words[0].rstrip("/")) if _NAME.match(name) else None


def _default_name(host: str, port: int | None) -> str:
    try:
        host = str(ipaddress.ip_address(host)).replace(":", "-").strip("-") or "replica"
    except ValueError:
        pass
    return f"{host}-{port}" if port is not None else host
