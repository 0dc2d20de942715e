"""Memory that file data need, estimated from counts before the arrays are built.

Two estimates, both in bytes:

- :func:`file_counts` and :func:`reading_bytes`, before the files are read: rows and columns
  counted from the files (CSV lines, Parquet metadata), for the tables the reader makes and
  the regression rows (linear in the rows);
- :func:`built_bytes`, once the rows are read and checked and before the arrays are built,
  from the exact counts: the per-client statistics, the held-out blocks as
  :func:`fnsysid.data.source._heldout` pads them, and the samples that mini-batch SGD keeps
  (padded to the longest client).

Training statistics are built per length class of clients
(:func:`fnsysid.dynamics.model.ragged_stats`), so they cost at most twice the samples,
whatever the spread of the clients' lengths.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np

#: bytes a row of a file costs while it is read and checked, per column of the tables the
#: reader makes (the file's table, its checked copy, the combined and the sorted one) ...
ROW_BYTES_PER_COLUMN = 32
#: ... plus the row's labels (client and split as text)
ROW_BYTES_LABELS = 100
#: helper columns the reader adds (repeat, client, trajectory, t, split, row, file, ranks)
HELPER_COLUMNS = 8
#: copies of a regression row (states, inputs, features, targets) alive while the statistics
#: are built: the rows, the padded class slice and its weighted, transposed copies
BUILD_COPIES = 5
#: factor on the per-client arrays for temporaries (as for simulated data)
TEMPORARIES = 2.0


def file_counts(files: list[Path]) -> tuple[int, int]:
    """Rows (at most) and the largest number of columns of trajectory ``files``: CSV lines
    counted, Parquet rows from the file's metadata. Files that are not regular files or
    cannot be read count nothing (the reader reports them)."""
    rows = cols = 0
    for f in files:
        try:
            if not stat.S_ISREG(Path(f).stat().st_mode):
                continue
            if Path(f).suffix.lower() == ".parquet":
                import pyarrow.parquet as pq

                meta = pq.read_metadata(f)
                rows += int(meta.num_rows)
                cols = max(cols, int(meta.num_columns))
                continue
            with open(f, "rb") as fh:
                header = fh.readline(1 << 20)
                cols = max(cols, header.count(b",") + 1)
                last = b"\n"
                while chunk := fh.read(1 << 24):
                    rows += chunk.count(b"\n")
                    last = chunk[-1:]
                rows += last != b"\n"             # a last line without a newline
        except Exception:  # noqa: BLE001  (unreadable or broken: the reader says why)
            continue
    return rows, cols


def row_values(model) -> int:
    """Values of one regression row: states, inputs, features, targets, weight."""
    n_y, n_phi = model.structure.shape[:2]
    return model.system.n_x + model.system.n_u + n_phi + n_y + 1


def reading_bytes(model, rows: int, columns: int) -> int:
    """Bytes that reading and checking ``rows`` rows of ``columns`` columns and turning them
    into regression rows need (linear in the rows)."""
    per_row = (ROW_BYTES_PER_COLUMN * (columns + HELPER_COLUMNS) + ROW_BYTES_LABELS
               + 8 * BUILD_COPIES * row_values(model))
    return int(rows * per_row)


def matrix_values(model, strategy=None) -> int:
    """The ``p x p`` values held per client and repeat: the Gram matrix of its statistics and
    the strategy's ``client_matrices`` (its affine maps, its own fits' factors: 2 for the
    federated strategies, 0 for ``centralized``/``centralized_exact``; None: a federated
    one). The same count for simulated data
    (:func:`fnsysid.app.resources.estimate_bytes`) and file data (:func:`per_client_values`).
    """
    return (1 + getattr(strategy, "client_matrices", 2)) * model.p * model.p


def training_values(model, strategy=None) -> int:
    """Values held per client and repeat for its training data and the strategy, whatever the
    data's source: the ``p x p`` arrays (:func:`matrix_values`), the vectors (``b``, the
    models, ~10 p), the means and the QR factors of its training data
    (:func:`fnsysid.dynamics.model.factor_terms`)."""
    from fnsysid.dynamics.model import factor_terms

    n_y, n_phi = model.structure.shape[:2]
    return (matrix_values(model, strategy) + 10 * model.p + 10 + n_phi + n_y
            + factor_terms(model))


def per_client_values(model, strategy=None) -> int:
    """Values held per client and repeat of file data whatever its samples:
    :func:`training_values` and the held-out statistics (Gram matrix, cross moments, QR
    factors; the trajectories are counted by block in :func:`built_bytes`)."""
    n_y, n_phi = model.structure.shape[:2]
    return training_values(model, strategy) + 2 * n_phi * n_phi + 3 * n_y * n_phi


def built_bytes(model, rows: int, columns: int, S: int, M: int, count: np.ndarray,
                keep_samples: bool, blocks: list[tuple[int, int, int]], strategy=None) -> int:
    """Bytes a run of file data needs once its rows are read.

    ``rows``, ``columns``: the rows read and the files' columns; ``S`` repeats, ``M``
    clients; ``count`` (S M,) training transitions per repeat and client; ``keep_samples``:
    the optimizer keeps every sample (padded to the longest client); ``blocks``: (m, J, L) of
    each held-out block (clients, most trajectories, longest); ``strategy``: the run's
    strategy (its per-client matrices, :func:`matrix_values`; None: a federated one).
    """
    n_y, n_phi = model.structure.shape[:2]
    n_x, n_u = model.system.n_x, model.system.n_u
    values = S * M * per_client_values(model, strategy)
    if keep_samples:
        values += S * M * int(np.max(count, initial=0)) * (n_phi + n_y + 1)
    values += sum(S * m * J * L * (n_x + n_u + 1) for m, J, L in blocks)
    return int(reading_bytes(model, rows, columns) + TEMPORARIES * 8 * values)
