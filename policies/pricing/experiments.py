"""Sticky A/B arm assignment. Pure: a subject and an experiment name give an arm.

The subject is hashed with the experiment's name, so one user lands in the same arm
of one experiment on every request and every replica, and independently across
experiments. With no subject, each request draws its arm at random.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass

from policies.config import ExperimentConfig, RouteConfig

_SCALE = float(1 << 64)


@dataclass(frozen=True, slots=True)
class Arm:
    experiment: str
    name: str
    route: RouteConfig  # the experiment's route with this arm's overrides applied


class Experiment:
    def __init__(self, name: str, config: ExperimentConfig, route: RouteConfig) -> None:
        self.name = name
        self.route = config.route
        self.arms = [Arm(name, arm_name, arm.apply(route)) for arm_name, arm in config.arms.items()]
        total = sum(arm.weight for arm in config.arms.values())
        edges, running = [], 0.0
        for arm in config.arms.values():
            running += arm.weight / total
            edges.append(running)
        edges[-1] = 1.0
        self._edges = edges
        self._salt = name.encode() + b"\x00"

    def assign(self, subject: str | None) -> Arm:
        """The arm of `subject` (sticky), or a random arm when there is none."""
        if subject is None:
            point = random.random()
        else:
            digest = hashlib.blake2b(self._salt + subject.encode(), digest_size=8).digest()
            point = int.from_bytes(digest, "big") / _SCALE
        return self.arms[bisect.bisect_right(self._edges, point)]


def build_experiments(experiments: Mapping[str, ExperimentConfig],
                      routes: Mapping[str, RouteConfig]) -> dict[str, Experiment]:
    """Enabled experiments by the route they split (the config allows one per route)."""
    return {
        config.route: Experiment(name, config, routes[config.route])
        for name, config in experiments.items()
        if config.enabled
    }
