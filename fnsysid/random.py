"""Random streams and noise distributions; every draw comes from an explicit Generator.

Streams are derived from one seed with ``numpy.random.SeedSequence``. Clients are grouped in
blocks of ``BLOCK`` consecutive indices; each (purpose, repeat, block, trajectory) owns a stream
that always draws values for the whole block. Client ``i`` therefore reads the same numbers
whatever ``M`` is, and trajectory ``j`` the same numbers whatever ``N`` is, while the work stays
vectorized over a block instead of looping over clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: number of clients that share one random stream (at different positions)
BLOCK = 1024

# purposes of streams; part of the spawn key so that streams never collide
PARAMS, TRAJECTORY, SHUFFLE, HOLDOUT = 0, 1, 2, 3


def stream(seed: int, purpose: int, *key: int) -> np.random.Generator:
    """Return the generator for one purpose and integer key under ``seed``.

    Examples
    --------
    >>> a = stream(0, TRAJECTORY, 0, 0, 3).standard_normal(2)
    >>> b = stream(0, TRAJECTORY, 0, 0, 3).standard_normal(2)
    >>> bool((a == b).all())
    True
    """
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(int(purpose), *map(int, key)))
    return np.random.Generator(np.random.PCG64(ss))


def blocks(m: int) -> list[tuple[int, int, int]]:
    """Split clients ``0..m-1`` into ``(block_index, start, stop)`` triples."""
    return [(b, s, min(s + BLOCK, m)) for b, s in enumerate(range(0, m, BLOCK))]


@dataclass(frozen=True)
class Noise:
    """A zero-mean (or shifted) distribution with per-coordinate scale.

    Parameters
    ----------
    kind : {"normal", "truncnormal", "uniform", "zero"}
        ``normal``: ``loc + scale * N(0, 1)``; ``truncnormal``: normal with standard deviation
        ``scale`` redrawn until ``|z| <= clip``; ``uniform``: ``loc + scale * U(-1, 1)``.
    scale : float or sequence
        Per-coordinate scale, broadcast over the last axis.
    loc : float or sequence
        Per-coordinate offset.
    clip : float
        Cut-off of ``truncnormal`` in physical units.
    """

    kind: str = "normal"
    scale: float | tuple = 1.0
    loc: float | tuple = 0.0
    clip: float = float("inf")

    KINDS = ("normal", "truncnormal", "uniform", "zero")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"noise kind={self.kind!r}; allowed: {', '.join(self.KINDS)}")
        object.__setattr__(self, "scale", np.asarray(self.scale, dtype=float))
        object.__setattr__(self, "loc", np.asarray(self.loc, dtype=float))
        if np.any(self.scale < 0):
            raise ValueError("noise scale must be >= 0")

    @classmethod
    def from_spec(cls, spec) -> "Noise":
        """Build from a mapping such as ``{"kind": "normal", "scale": 0.1}`` or a Noise."""
        if isinstance(spec, Noise):
            return spec
        spec = dict(spec)
        for key in ("scale", "loc"):
            if isinstance(spec.get(key), list):
                spec[key] = tuple(spec[key])
        return cls(**spec)

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Draw an array of ``shape`` (last axis is the coordinate axis)."""
        if self.kind == "zero":
            z = np.zeros(shape)
        elif self.kind == "uniform":
            z = rng.uniform(-1.0, 1.0, size=shape)
        else:
            z = rng.standard_normal(shape)
            if self.kind == "truncnormal":
                # rejection: redraw standardized values beyond clip/scale (per coordinate)
                with np.errstate(divide="ignore"):
                    cut = np.broadcast_to(self.clip / self.scale, shape)
                bad = np.abs(z) > cut
                while bad.any():
                    z[bad] = rng.standard_normal(int(bad.sum()))
                    bad = np.abs(z) > cut
        return self.loc + self.scale * z
