"""Memory a run needs, estimated from the shapes of its arrays before anything is allocated.

How memory grows (float64, 8 bytes a value; S = repeats, M = clients, p = parameters,
n_phi/n_y = features/targets per regression row, N = trajectories per client, T = length):

- per client and repeat, always: the loss statistics (``H`` p x p, ``b``, means, the QR
  factors of the training data), the true parameters, the strategy's per-client models and
  affine maps (about ``3 p^2 + 10 p``; the ``p^2`` count is ``1 + client_matrices`` of the
  strategy: 3 for the federated strategies, 1 for ``centralized``/``centralized_exact``, which
  keep no per-client maps; :func:`fnsysid.data.memory.training_values`, the same count as
  for file data) and
  the held-out data (``data.val_N`` trajectories of T + 1 states and T inputs);
- mini-batch SGD also keeps every sample: ``N T (n_phi + n_y + 1)`` per client and repeat;
- per-client history (``clients.csv``): ``(R + 1)`` values per client and repeat;
- simulation works on chunks of at least one block of clients (up to 1024, at least 16; see
  :mod:`fnsysid.dynamics.random`) with all their ``N (T + 1)`` samples, so a huge ``N`` or ``T``
  costs memory even for one client.

The estimate counts these arrays, doubles them for temporaries and adds the interpreter's
baseline; it is checked against the memory available (``MemAvailable``, a cgroup limit or
``RLIMIT_AS``, whichever is smallest).
"""

from __future__ import annotations

import math
import os
import resource
from functools import lru_cache
from pathlib import Path

from fnsysid.config.errors import ConfigError

#: resident memory of the interpreter with numpy, pandas and Hydra loaded
BASELINE_BYTES = 200 * 2**20
#: factor on the arrays' own size for temporaries
TEMPORARIES = 2.0


def estimate_bytes(cfg, model, optimizer, keep_clients: bool, strategy=None) -> int:
    """Bytes a simulated run of ``cfg`` needs (see the module docstring); ``strategy``
    (class or instance; None: a federated one) sets the per-client ``p x p`` arrays."""
    from fnsysid.data.memory import training_values
    from fnsysid.dynamics.model import CHUNK_VALUES, values_per_sample
    from fnsysid.dynamics.random import BLOCK, block_of, block_start

    S, M, T, R = cfg.repeats, cfg.M, cfg.T, cfg.R
    N = cfg.N
    n_max = max(N) if isinstance(N, list) else int(N)
    n_y, n_phi = model.structure.shape[:2]
    system = model.system
    n_x, n_u = system.n_x, system.n_u
    val_n = getattr(cfg.data, "val_N", 0)

    per_client = training_values(model, strategy)       # as for file data
    per_client += val_n * ((T + 1) * (n_x + 1) + T * n_u)
    if getattr(optimizer, "needs_samples", False):
        per_client += n_max * T * (n_phi + n_y + 1)
    if keep_clients:
        per_client += R + 1
    drawn = BLOCK if M >= BLOCK else block_start(block_of(M - 1) + 1)  # clients a chunk draws
    chunk = max(CHUNK_VALUES, drawn * n_max * (T + 1) * values_per_sample(model))
    history = (R + 1) * S * 8                  # errors.csv columns per round and repeat
    values = S * M * per_client + chunk + history
    return int(BASELINE_BYTES + TEMPORARIES * 8 * values)


def available_bytes() -> int:
    """Memory this process may still use: the smallest of the memory available
    (``psutil.virtual_memory().available``, MemAvailable on Linux), the cgroup limit and
    RLIMIT_AS."""
    import psutil

    limits = [psutil.virtual_memory().available]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            limits.append(int(text))
        break
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    return min(limits)


def estimate_disk_bytes(cfg, keep_clients: bool) -> int:
    """Bytes a run's result files take, generously (CSV rows ~40 bytes, plots ~150 KB)."""
    # data=files before the files are read: one repeat, per-client rows up to per_client_max
    S, R = int(cfg.repeats or 1), int(cfg.R)
    M = int(cfg.M or cfg.output.per_client_max)
    rows = (R + 1) * S * (3 + (M if keep_clients else 0))
    return int(40 * rows + 150_000 + 20_000)


def check_disk(key: str, path, need: int) -> None:
    """Refuse when the results folder's file system (or the file-size limit) cannot hold
    ``need`` bytes (one line with both numbers)."""
    import shutil

    target = Path(path)
    while not target.exists():
        target = target.parent
    free = shutil.disk_usage(target).free
    if need > free:
        raise ConfigError(f"{key}={path}: the results need about {_size(need)} of disk but "
                          f"{_size(free)} is free on {target}")
    fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if fsize != resource.RLIM_INFINITY and fsize < 200_000:
        raise ConfigError(f"{key}={path}: the file size limit (ulimit -f) is {_size(fsize)}, "
                          "too small for the result files (plots alone take about 100 KiB)")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit == "PiB" or n >= 10 else f"{n:.2g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"    # pragma: no cover


def memory_limit() -> tuple[int, str]:
    """The memory a run may use (:func:`available_bytes`, lowered by the environment variable
    ``FNSYSID_MEMORY_LIMIT`` in bytes) and where that limit comes from, for messages."""
    have = available_bytes()
    raw = os.environ.get("FNSYSID_MEMORY_LIMIT")
    if raw:                                          # tests and shared machines
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 1:
            what = "is not a number" if math.isnan(value) else "is not allowed"
            raise ConfigError(f"FNSYSID_MEMORY_LIMIT={raw} {what}; allowed: a positive finite "
                              "number of bytes, e.g. 4e9 (unset: the available memory)")
        limit = int(value)
        if limit <= have:
            return limit, f"FNSYSID_MEMORY_LIMIT={raw}"
    return have, "available"


def check_memory(cfg, model, optimizer, strategy=None) -> None:
    """Refuse a run whose estimated memory exceeds what is available (one line).

    Simulated data: from the shapes of the run's arrays (:func:`estimate_bytes`). File data:
    from the rows and columns of the files before they are read
    (:func:`estimate_file_bytes`); once read, :func:`file_budget` checks the exact counts.
    The environment variable ``FNSYSID_MEMORY_LIMIT`` (bytes) lowers the limit, e.g. on a
    shared machine or in the tests.
    """
    from fnsysid.results.history import keep_per_client

    if cfg.files:
        need, rows = estimate_file_bytes(cfg, model, strategy)
        have, source = memory_limit()
        if need > have:
            raise ConfigError(
                f"data.path={cfg.data.path}: reading its {rows} rows needs about {_size(need)} "
                f"of memory, above the limit of {_size(have)} ({source}); allowed: data whose "
                "rows fit (memory grows with the rows and the features per row, see README, "
                "Memory and disk)")
        return
    need = estimate_bytes(cfg, model, optimizer, keep_per_client(cfg), strategy)
    have, source = memory_limit()
    if need > have:
        raise ConfigError(
            f"this run needs about {_size(need)} of memory but {_size(have)} is available "
            f"(M={cfg.M}, N={plain_n(cfg)}, T={cfg.T}, repeats={cfg.repeats}, R={cfg.R}; "
            "memory grows with repeats x M x (p^2 + held-out data [+ N T samples for SGD]), "
            "see README); lower M, N, T or repeats")


def estimate_file_bytes(cfg, model, strategy=None) -> tuple[int, int]:
    """Bytes that reading the files of ``data.path`` (and ``data.val_path``) needs, from their
    rows and columns counted before they are read, and the rows (0 when a path cannot be
    listed: the reader reports it); ``strategy`` sets the per-client ``p x p`` arrays as for
    simulated data (:func:`fnsysid.data.memory.matrix_values`)."""
    from fnsysid.config.checks import DataError
    from fnsysid.data.files import data_files
    from fnsysid.data.memory import TEMPORARIES, per_client_values, reading_bytes

    rows = cols = clients = 0
    for setting in ("data.path", "data.val_path"):
        path = getattr(cfg.data, setting.split(".")[1], None)
        if not path:
            continue
        try:
            files = data_files(path, setting)
        except (DataError, OSError):
            return BASELINE_BYTES, 0
        r, c = _file_counts(tuple((str(f), *_stamp(f)) for f in files))
        rows, cols = rows + r, max(cols, c)
        clients = max(clients, len(files) if Path(path).is_dir() else 1)
    need = BASELINE_BYTES + reading_bytes(model, rows, cols) + \
        TEMPORARIES * 8 * clients * per_client_values(model, strategy)
    return int(need), rows


def _stamp(f) -> tuple:
    try:
        st = Path(f).stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return 0, 0


@lru_cache(maxsize=64)
def _file_counts(files: tuple) -> tuple[int, int]:
    """Rows and columns of files ``(path, size, mtime)``, counted once per process (a sweep
    checks every job)."""
    from fnsysid.data.memory import file_counts

    return file_counts([Path(f[0]) for f in files])


def file_budget():
    """The memory check of file data once read (see
    :func:`fnsysid.data.source.from_files`): refuses in one line naming the estimate and the
    limit."""
    def budget(need: int, what: str) -> None:
        need += BASELINE_BYTES
        have, source = memory_limit()
        if need > have:
            raise ConfigError(
                f"{what}: these data need about {_size(need)} of memory, above the limit of "
                f"{_size(have)} ({source}); allowed: data whose arrays fit (fewer or shorter "
                "clients; optimizer=gd keeps statistics only, see README, Memory and disk)")
    return budget


def plain_n(cfg):
    N = cfg.N
    return f"[{min(N)}..{max(N)}]" if isinstance(N, list) else N
