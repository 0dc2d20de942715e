"""Random streams and noise distributions; every draw comes from an explicit Generator.

Streams are derived from one seed with ``numpy.random.SeedSequence``. Clients are grouped in
blocks of consecutive indices: blocks of ``FIRST``, ``FIRST``, ``2 FIRST``, ... clients up to
client ``BLOCK`` (16, 16, 32, 64, 128, 256, 512), then blocks of ``BLOCK`` (1024) clients each
(:func:`blocks`). Each (purpose, repeat, block, trajectory) owns a stream that always draws
values for the whole block. Client ``i`` therefore reads the same numbers whatever ``M`` is, and
trajectory ``j`` the same numbers whatever ``N`` is, while the work stays vectorized over a
block instead of looping over clients; a fleet of ``M`` clients draws for fewer than ``2 M``
clients (at least ``FIRST``) up to ``M = BLOCK``, and for fewer than ``M + BLOCK`` above.

A :class:`StreamBatch` draws from many such streams at once and hands out exactly the values
each stream would give to the same sequence of calls (its standard normals in order), so
simulating many blocks together changes no number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: clients of each block from client ``BLOCK`` on (one random stream serves a whole block)
BLOCK = 1024
#: clients of the first block; the blocks before client ``BLOCK`` double from there
FIRST = 16
#: number of blocks before client ``BLOCK``: FIRST, FIRST, 2 FIRST, ..., BLOCK / 2
_SMALL = (BLOCK // FIRST).bit_length()

# purposes of streams; part of the spawn key so that streams never collide
PARAMS, TRAJECTORY, SHUFFLE, HOLDOUT, LOCAL_STEPS, PARTICIPATION, MODEL_CHECK = 0, 1, 2, 3, 4, 5, 6


def stream(seed: int, purpose: int, *key: int) -> np.random.Generator:
    """Return the generator for one purpose and integer key under ``seed``.

    The generator is ``PCG64(SeedSequence(seed, spawn_key=(purpose, *key)))``; the state
    that seed sequence gives PCG64 is kept (:class:`_KnownSeed`), since the runs of a sweep
    draw the same streams again.

    Parameters
    ----------
    seed : int
        The run's root seed.
    purpose : int
        What the stream draws (a constant of this module, e.g. :data:`TRAJECTORY`).
    *key : int
        The stream's key within the purpose (repeat, block, client, ...).

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> a = stream(0, TRAJECTORY, 0, 0, 3).standard_normal(2)
    >>> b = stream(0, TRAJECTORY, 0, 0, 3).standard_normal(2)
    >>> bool((a == b).all())
    True
    """
    k = (int(seed), int(purpose), *map(int, key))
    state = _STATES.get(k)
    if state is None:
        state = np.random.SeedSequence(entropy=k[0], spawn_key=k[1:]).generate_state(
            *_PCG64_REQUEST)
        if len(_STATES) >= _STATES_MAX:
            _STATES.clear()
        _STATES[k] = state
    return np.random.Generator(np.random.PCG64(_KnownSeed(k, state)))


#: the words of state PCG64 asks of its seed sequence
_PCG64_REQUEST = (4, np.uint64)
#: PCG64 states of the streams made so far, by (seed, purpose, *key) (at most _STATES_MAX)
_STATES: dict[tuple[int, ...], np.ndarray] = {}
_STATES_MAX = 1 << 14


class _KnownSeed(np.random.bit_generator.ISpawnableSeedSequence):
    """``SeedSequence(entropy=key[0], spawn_key=key[1:])`` whose PCG64 state ``words`` is
    already known (computing it costs more than the rest of a new generator); any other
    request, spawning and every other attribute (``entropy``, ``spawn_key``, ``state``, ...)
    go to that seed sequence itself."""

    def __init__(self, key: tuple[int, ...], words: np.ndarray):
        self._key, self._words = key, words
        self._seq: np.random.SeedSequence | None = None

    def _sequence(self) -> np.random.SeedSequence:
        if self._seq is None:
            self._seq = np.random.SeedSequence(entropy=self._key[0], spawn_key=self._key[1:])
        return self._seq

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sequence(), name)

    def __repr__(self) -> str:
        return repr(self._sequence())

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if (n_words, np.dtype(dtype)) == _PCG64_REQUEST:
            return self._words.copy()
        return self._sequence().generate_state(n_words, dtype)

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        return self._sequence().spawn(n_children)


def block_start(b: int) -> int:
    """First client of block ``b``.

    Parameters
    ----------
    b : int
        A block's index.

    Returns
    -------
    int
    """
    if b >= _SMALL:
        return (b - _SMALL + 1) * BLOCK
    return 0 if b == 0 else FIRST << (b - 1)


def block_size(b: int) -> int:
    """Number of clients of block ``b`` (the values each of its streams draws per call).

    Parameters
    ----------
    b : int
        A block's index.

    Returns
    -------
    int
    """
    return block_start(b + 1) - block_start(b)


def block_of(i):
    """Block of client ``i``.

    Parameters
    ----------
    i : int or numpy.ndarray of int
        Client indices.

    Returns
    -------
    int or numpy.ndarray of int
        Of the shape of ``i``.

    Examples
    --------
    >>> [block_of(i) for i in (0, 15, 16, 32, 1023, 1024, 2048)]
    [0, 0, 1, 2, 6, 7, 8]
    """
    i = np.asarray(i)
    small = np.frexp(np.maximum(i // FIRST, 1))[1] - (i < FIRST)   # bit length of i // FIRST
    out = np.where(i < BLOCK, small, i // BLOCK + _SMALL - 1)
    return int(out) if out.ndim == 0 else out


def blocks(m: int) -> list[tuple[int, int, int]]:
    """Split clients ``0..m-1`` into blocks.

    Parameters
    ----------
    m : int
        The clients.

    Returns
    -------
    list of tuple of (int, int, int)
        ``(block_index, start, stop)`` triples.

    Examples
    --------
    >>> blocks(40)
    [(0, 0, 16), (1, 16, 32), (2, 32, 40)]
    """
    out, b = [], 0
    while block_start(b) < m:
        out.append((b, block_start(b), min(block_start(b + 1), m)))
        b += 1
    return out


def chunks(blks: list[tuple[int, int, int]], limit: int) -> list[list[tuple[int, int, int]]]:
    """Consecutive runs of ``blks`` holding at most ``limit`` clients each (counting whole
    blocks, whose streams draw for all their clients), at least one block per run.

    Parameters
    ----------
    blks : list of tuple of (int, int, int)
        Blocks (:func:`blocks`).
    limit : int
        The most clients of a run.

    Returns
    -------
    list of list of tuple of (int, int, int)
    """
    out: list[list[tuple[int, int, int]]] = []
    used = 0
    for blk in blks:
        size = block_size(blk[0])
        if out and used + size <= limit:
            out[-1].append(blk)
            used += size
        else:
            out.append([blk])
            used = size
    return out


class StreamBatch:
    """Standard normals of ``G`` streams, consumed in lockstep as each stream would draw them.

    ``take(n)`` gives every stream's next ``n`` values (G, n); ``refill(z, bad)`` overwrites
    the ``True`` entries of each stream's row of ``z`` (in C order) with that stream's next
    values, as ``z[bad] = rng.standard_normal(bad.sum())`` would, for a different count per
    stream. A generator's normals do not depend on how the draws are split into calls, so the
    values are those of the per-stream calls. Values are drawn ahead in chunks (``reserve``
    per stream at first); the streams must not be used elsewhere.

    Parameters
    ----------
    gens : list of numpy.random.Generator
        The G streams.
    reserve : int, default=1024
        The values drawn ahead per stream at first.

    Examples
    --------
    >>> gens = [stream(0, TRAJECTORY, 0, b, 0) for b in range(2)]
    >>> z = StreamBatch(gens, reserve=4).take(3)
    >>> bool((z[1] == stream(0, TRAJECTORY, 0, 1, 0).standard_normal(3)).all())
    True
    """

    def __init__(self, gens: list[np.random.Generator], reserve: int = 1024):
        self.gens = gens
        self.buf = self._draw(max(int(reserve), 1))
        self.pos = np.zeros(len(gens), dtype=np.intp)

    def __len__(self) -> int:
        return len(self.gens)

    def _draw(self, n: int) -> np.ndarray:
        out = np.empty((len(self.gens), n))
        for row, g in zip(out, self.gens, strict=True):
            g.standard_normal(out=row)
        return out

    def _ensure(self, need: np.ndarray | int) -> None:
        """Make sure stream g holds ``need[g]`` unread values (drop read ones, draw more)."""
        short = int(np.max(self.pos + need)) - self.buf.shape[1]
        if short <= 0:
            return
        done = int(self.pos.min())
        self.buf, self.pos = self.buf[:, done:], self.pos - done
        extra = int(np.max(self.pos + need)) - self.buf.shape[1]
        if extra > 0:
            extra = max(extra, self.buf.shape[1] // 2, 64)
            self.buf = np.concatenate([self.buf, self._draw(extra)], axis=1)

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` standard normals of every stream, (G, n)."""
        self._ensure(n)
        if (self.pos == self.pos[0]).all():           # all streams at the same place
            out = self.buf[:, self.pos[0]:self.pos[0] + n].copy()
        else:                                         # row g from its own position
            windows = np.lib.stride_tricks.sliding_window_view(self.buf, n, axis=1)
            out = windows[np.arange(len(self)), self.pos]
        self.pos += n
        return out

    def refill(self, z: np.ndarray, bad: np.ndarray, cut: np.ndarray | None = None) -> None:
        """Replace ``z[g][bad[g]]`` by stream g's next values, for every g (in place).

        With ``cut`` (broadcastable to a row of ``z``), repeat until ``|z| <= cut`` everywhere,
        touching only the entries still out of range (rejection sampling).
        """
        if not bad.any():
            return
        G = len(self)
        zf = z.reshape(G, -1)
        g, i = np.divmod(np.flatnonzero(bad), zf.shape[1])    # C order within each stream
        cutf = cut if cut is None or np.ndim(cut) == 0 else \
            np.broadcast_to(cut, z.shape[1:]).reshape(-1)
        while g.size:
            counts = np.bincount(g, minlength=G)
            self._ensure(counts)
            rank = np.arange(g.size) - (np.cumsum(counts) - counts)[g]
            vals = self.buf[g, self.pos[g] + rank]
            zf[g, i] = vals
            self.pos += counts
            if cutf is None:
                break
            still = np.flatnonzero(np.abs(vals) > (cutf if np.ndim(cutf) == 0 else cutf[i]))
            g, i = g[still], i[still]


@dataclass(frozen=True)
class Noise:
    """A zero-mean (or shifted) distribution with per-coordinate scale.

    Parameters
    ----------
    kind : {"normal", "truncnormal", "uniform", "zero"}, default="normal"
        ``normal``: ``loc + scale * N(0, 1)``; ``truncnormal``: normal with standard deviation
        ``scale`` redrawn until ``|z| <= clip``; ``uniform``: ``loc + scale * U(-1, 1)``.
    scale : float or sequence of float, default=1.0
        Per-coordinate scale, broadcast over the last axis.
    loc : float or sequence of float, default=0.0
        Per-coordinate offset.
    clip : float, default=inf
        Cut-off of ``truncnormal`` in physical units.
    """

    kind: str = "normal"
    scale: float | tuple = 1.0
    loc: float | tuple = 0.0
    clip: float = float("inf")

    KINDS = ("normal", "truncnormal", "uniform", "zero")
    #: kinds that draw standard normals only (or nothing): can come from a StreamBatch
    BATCHED_KINDS = ("normal", "truncnormal", "zero")

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

    def sample(self, rng: np.random.Generator | StreamBatch,
               shape: tuple[int, ...]) -> np.ndarray:
        """Draw an array of ``shape`` (last axis is the coordinate axis).

        From a :class:`StreamBatch` of G streams (kinds in ``BATCHED_KINDS``): (G, *shape),
        row g holding what stream g alone would give.
        """
        if isinstance(rng, StreamBatch):
            return self._sample_batch(rng, shape)
        if self.kind == "zero":
            z = np.zeros(shape)
        elif self.kind == "uniform":
            z = rng.uniform(-1.0, 1.0, size=shape)
        else:
            z = rng.standard_normal(shape)
            if self.kind == "truncnormal":
                # rejection: redraw standardized values beyond clip/scale (per coordinate)
                cut = self._cut(shape)
                bad = np.abs(z) > cut
                while bad.any():
                    z[bad] = rng.standard_normal(int(bad.sum()))
                    bad = np.abs(z) > cut
        return self._scaled(z)

    def _cut(self, shape: tuple[int, ...]):
        """The standardized cut-off ``clip / scale`` of a truncated normal: one float when it
        is the same for every coordinate, else broadcast to ``shape``."""
        with np.errstate(divide="ignore"):
            cut = self.clip / self.scale
        one = _one(cut)
        return one if one is not None else np.broadcast_to(cut, shape)

    def _scaled(self, z: np.ndarray) -> np.ndarray:
        """``loc + scale * z``; with plain floats when every coordinate has the same loc and
        scale (the same numbers; a broadcast over a short last axis is several times
        slower)."""
        loc, scale = _one(self.loc), _one(self.scale)
        if loc is None or scale is None:
            return self.loc + self.scale * z
        return loc + scale * z

    def expected_draws(self, shape: tuple[int, ...]) -> float:
        """Mean number of standard normals one :meth:`sample` of ``shape`` reads."""
        if self.kind == "zero":
            return 0.0
        if self.kind != "truncnormal":
            return float(np.prod(shape))
        with np.errstate(divide="ignore"):
            cut = np.broadcast_to(self.clip / self.scale, shape[-1:])
        keep = np.array([math.erf(c / math.sqrt(2.0)) for c in np.minimum(cut, 40.0)])
        return float(np.prod(shape[:-1]) * np.sum(1.0 / np.maximum(keep, 1e-300)))

    def _sample_batch(self, batch: StreamBatch, shape: tuple[int, ...]) -> np.ndarray:
        if self.kind not in self.BATCHED_KINDS:
            raise ValueError(f"noise kind={self.kind!r} cannot be drawn from a StreamBatch")
        full = (len(batch), *shape)
        if self.kind == "zero":
            z = np.zeros(full)
        else:
            z = batch.take(int(np.prod(shape))).reshape(full)
            if self.kind == "truncnormal":
                cut = self._cut(shape)
                batch.refill(z, np.abs(z) > cut, cut)
        return self._scaled(z)


def _one(v: np.ndarray) -> float | None:
    """The value of every entry of ``v`` as a float, or None if they differ."""
    v = np.asarray(v)
    if v.size == 0 or not (v == v.flat[0]).all():
        return None
    return float(v.flat[0])
