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


def per_client_values(model) -> int:
    """Values held per client and repeat whatever its data: the loss statistics, the
    held-out statistics, the strategy's models and affine maps."""
    n_y, n_phi = model.structure.shape[:2]
    p = model.p
    return 3 * p * p + 10 * p + 10 + 2 * n_phi * n_phi + 3 * n_y * n_phi


def built_bytes(model, rows: int, columns: int, S: int, M: int, count: np.ndarray,
                keep_samples: bool, blocks: list[tuple[int, int, int]]) -> int:
    """Bytes a run of file data needs once its rows are read.

    ``rows``, ``columns``: the rows read and the files' columns; ``S`` repeats, ``M``
    clients; ``count`` (S M,) training transitions per repeat and client; ``keep_samples``:
    the optimizer keeps every sample (padded to the longest client); ``blocks``: (m, J, L) of
    each held-out block (clients, most trajectories, longest).
    """
    n_y, n_phi = model.structure.shape[:2]
    n_x, n_u = model.system.n_x, model.system.n_u
    values = S * M * per_client_values(model)
    if keep_samples:
        values += S * M * int(np.max(count, initial=0)) * (n_phi + n_y + 1)
    values += sum(S * m * J * L * (n_x + n_u + 1) for m, J, L in blocks)
    return int(reading_bytes(model, rows, columns) + TEMPORARIES * 8 * values)
