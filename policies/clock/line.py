"""A least-squares line over a window of recent samples (y = a + b * x), kept in running
sums so that each sample costs O(1). Pure, no I/O."""

from __future__ import annotations

from collections import deque


class Line:
    """y = intercept + slope * x over the last `window` samples, both clamped at zero.
    Before two distinct x are seen, the mean y (`initial` before any sample)."""

    __slots__ = ("_n", "_samples", "_sx", "_sxx", "_sxy", "_sy", "initial")

    def __init__(self, initial: float, window: int = 256) -> None:
        self.initial = initial
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._n = 0
        self._sx = self._sy = self._sxx = self._sxy = 0.0

    def __len__(self) -> int:
        return self._n

    def observe(self, x: float, y: float) -> None:
        if len(self._samples) == self._samples.maxlen:
            self._add(*self._samples[0], -1)
        self._samples.append((x, y))
        self._add(x, y, 1)

    def _add(self, x: float, y: float, sign: int) -> None:
        self._n += sign
        self._sx += sign * x
        self._sy += sign * y
        self._sxx += sign * x * x
        self._sxy += sign * x * y

    def slope(self) -> float | None:
        """The line's slope (at least 0), None before two distinct x."""
        n = self._n
        if n < 2:
            return None
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        if var_x <= 1e-9 * max(1.0, mean_x * mean_x):
            return None
        return max(0.0, (self._sxy / n - mean_x * mean_y) / var_x)

    def predict(self, x: float) -> float:
        n = self._n
        if n == 0:
            return self.initial
        mean_x, mean_y = self._sx / n, self._sy / n
        slope = self.slope()
        if slope is None:
            return max(0.0, mean_y)
        return max(0.0, mean_y - slope * mean_x) + slope * x
