"""Curves binned for the screen: what a plot of thousands of rounds needs to draw, per pixel.

`bin_for_screen` bins one curve for a plot's view; `ScreenBins` does it again after each new
round, binning only the new tail (the dashboard's redraw at 10,000 rounds: sapo-bench gui,
docs/calibration.md, "Dashboard redraw"). No Qt: tested without a display.
"""

from __future__ import annotations

import numpy as np


def bin_for_screen(
    x: np.ndarray, y: np.ndarray, x0: float, x1: float, bins: int, peak: bool, force: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """What a curve of (x, y) needs on a plot showing rounds [x0, x1] across `bins` pixels.

    x ascending. The points inside the range plus one on each side (a line runs to the edge);
    when they are more than the pixels can show, one bin per pixel instead: its smallest and
    largest value (`peak`, spikes stay visible) or its mean at its mean x (a smooth curve). Bins
    sit on a grid fixed by x0, x1 and `bins`, so a new round changes only the last bin; where a
    point falls never depends on how many came before it. `force`: bin even a few points (a
    tail of a longer curve, `ScreenBins`)."""
    n = len(x)
    if n == 0 or bins < 1 or not x1 > x0:
        return x, y
    lo = max(0, int(np.searchsorted(x, x0, "left")) - 1)
    hi = min(n, int(np.searchsorted(x, x1, "right")) + 1)
    xs, ys = x[lo:hi], y[lo:hi]
    if len(xs) <= (2 * bins if peak else bins) and not force:
        return xs, ys
    idx = np.floor((xs - x0) * (bins / (x1 - x0))).astype(np.int64)
    starts = np.flatnonzero(np.diff(idx, prepend=idx[0] - 1))
    if peak:
        low, high = np.minimum.reduceat(ys, starts), np.maximum.reduceat(ys, starts)
        at = x0 + (idx[starts] + 0.5) * ((x1 - x0) / bins)  # the pixel's middle, both values there
        return np.repeat(at, 2), np.column_stack([low, high]).ravel()
    counts = np.diff(np.append(starts, len(xs)))
    return np.add.reduceat(xs, starts) / counts, np.add.reduceat(ys, starts) / counts


class ScreenBins:
    """`bin_for_screen` for one curve, again after each new round, binning only the new tail.

    While the view (x0, x1, pixels) and `token` stay the same and the data only grew, the points
    before the last bin are as they were (a history only gains rounds; a rolling mean or a running
    sum of a longer history starts the same), so their bins are kept and only the last bin and the
    points after it are binned again. Whoever changes earlier values (another rolling window,
    another run) changes `token`."""

    def __init__(self, peak: bool) -> None:
        self.peak = peak
        self._key: tuple | None = None
        self._n = 0
        self._tail = 0  # index of the first point of the last bin (its bin is redone next time)
        self._head: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))  # the bins before it

    def __call__(
        self, x: np.ndarray, y: np.ndarray, x0: float, x1: float, bins: int, token: object = None
    ) -> tuple[np.ndarray, np.ndarray]:
        key = (x0, x1, bins, token)
        n = len(x)
        per = 2 * bins if self.peak else bins
        grows = key == self._key and n >= self._n and self._tail > 0
        self._key, self._n = key, n
        # incremental only for what it is for: a long history in full view (nothing beyond x1,
        # so the bins hold every point from the first bin on)
        if n <= per or not x1 > x0 or x[-1] > x1 or x[0] < x0:
            self._tail = 0
            return bin_for_screen(x, y, x0, x1, bins, self.peak)
        if not grows:
            self._head = (np.empty(0), np.empty(0))
            self._tail = 0
        scale = bins / (x1 - x0)
        hx, hy = self._head
        tx, ty = x[self._tail :], y[self._tail :]
        if self._tail and np.floor((tx[-1] - x0) * scale) == np.floor((tx[0] - x0) * scale):
            # the usual case: the new points fall in the last bin, redone alone (a few calls, not ~15)
            if self.peak:
                at = x0 + (np.floor((tx[0] - x0) * scale) + 0.5) / scale
                out = np.append(hx, (at, at)), np.append(hy, (ty.min(), ty.max()))
            else:
                # the same reduction as bin_for_screen's, so the same floats as binning everything
                out = (
                    np.append(hx, np.add.reduceat(tx, [0]) / len(tx)),
                    np.append(hy, np.add.reduceat(ty, [0]) / len(ty)),
                )
            self._head = out[0][: len(hx)], out[1][: len(hy)]
            return out
        bx, by = bin_for_screen(tx, ty, x0, x1, bins, self.peak, force=True)
        out = np.concatenate([hx, bx]), np.concatenate([hy, by])
        # keep all but the last bin: its first point is where the next call starts (found with the
        # same arithmetic as the binning's, not a boundary of its own that rounds differently)
        idx = np.floor((x[self._tail :] - x0) * (bins / (x1 - x0)))
        self._tail += int(np.searchsorted(idx, idx[-1], "left"))
        keep = len(out[0]) - (2 if self.peak else 1)
        self._head = out[0][:keep], out[1][:keep]
        return out


__all__ = ["bin_for_screen", "ScreenBins"]
