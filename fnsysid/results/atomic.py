"""Result files written atomically: a temporary file in the same folder, then a rename.

A reader (or a run killed half-way) sees either the complete old file, the complete new one,
or none; never a truncated file. A failed write (disk full, read-only folder) raises
:class:`WriteError` with one line naming the path and the cause, and leaves no temporary file.
The files of one run are written :func:`together`: on disk at once, then made visible in order.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: permissions of a new result file (mkstemp makes 0600; results are as readable as open())
FILE_MODE = 0o666 & ~_umask()


class WriteError(OSError):
    """A result file could not be written (one-line message naming path and cause)."""


#: per thread, ``pending``: (temporary, path) of the files written so far in the thread's
#: :func:`together` block, else None (runs in threads of one process, as with the joblib
#: launcher's threading backend or the Python API, each publish their own files)
_LOCAL = threading.local()
#: threads that sync the files of :func:`together` blocks (started when first needed)
_SYNC_THREADS: ThreadPoolExecutor | None = None
_SYNC_LOCK = threading.Lock()


def _pending() -> list[tuple[str, Path]] | None:
    return getattr(_LOCAL, "pending", None)


def _sync_threads() -> ThreadPoolExecutor:
    global _SYNC_THREADS
    with _SYNC_LOCK:
        if _SYNC_THREADS is None:
            _SYNC_THREADS = ThreadPoolExecutor(8, thread_name_prefix="fnsysid-sync")
        return _SYNC_THREADS


def _forget_sync_threads() -> None:
    """In a forked process: the parent's threads do not exist there; start new ones."""
    global _SYNC_THREADS
    _SYNC_THREADS = None


os.register_at_fork(after_in_child=_forget_sync_threads)


def write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file, then rename it to ``path`` (in a
    :func:`together` block: at the end of the block).

    The temporary name ends with ``path``'s suffix, so writers that pick the format from the
    name (``savefig``) still work.
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                                   dir=path.parent)
        os.close(fd)
        write(tmp)
        pending = _pending()
        if pending is not None:
            pending.append((tmp, path))
            tmp = None
            return path
        _sync(tmp)                      # on disk before the rename makes it visible
        _publish(tmp, path)
        tmp = None
    except OSError as exc:
        raise _error(path, exc) from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _error(path: Path, exc: OSError) -> WriteError:
    return WriteError(f"cannot write {path}: {exc.strerror or exc}")


def _sync(tmp: str) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())


def _publish(tmp: str, path: Path) -> None:
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)


@contextmanager
def together():
    """Write the files of the block (:func:`write_atomic`) to disk together, then rename them.

    Each file stays in its temporary until the block ends; then all are synced at once (one
    ``fsync`` per file, in threads, so that the file system commits them together rather than
    one after another) and renamed in the order they were written: a reader sees none of
    them before all are on disk, and the last written (``summary.json``) last. If the block
    or a sync fails, none is renamed; no temporary is left. Nested blocks join the outer one;
    a block collects the files its own thread writes.
    """
    if _pending() is not None:
        yield
        return
    pending = _LOCAL.pending = []
    try:
        yield
        _LOCAL.pending = None
        done = list(_sync_threads().map(_try_sync, [tmp for tmp, _ in pending]))
        for (_, path), error in zip(pending, done, strict=True):
            if error is not None:
                raise _error(path, error) from error
        for tmp, path in pending:
            try:
                _publish(tmp, path)
            except OSError as exc:
                raise _error(path, exc) from exc
    finally:
        _LOCAL.pending = None
        for tmp, _ in pending:          # those not renamed
            if os.path.exists(tmp):
                os.unlink(tmp)


def _try_sync(tmp: str) -> OSError | None:
    """:func:`_sync`, returning its error instead of raising it."""
    try:
        _sync(tmp)
    except OSError as exc:
        return exc
    return None


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def write_csv(path: str | Path, frame) -> Path:
    """Write a DataFrame or a :class:`~fnsysid.results.tables.Table` as CSV (no index)
    atomically."""
    return write_atomic(path, lambda tmp: frame.to_csv(tmp, index=False))


def json_safe(obj, prefix: str = "") -> tuple[object, dict]:
    """``obj`` with NaN/inf floats replaced by None, and {dotted key: "nan"/"inf"/"-inf"}."""
    notes: dict = {}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None, {prefix or "value": str(obj)}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out[k], n = json_safe(v, f"{prefix}.{k}" if prefix else str(k))
            notes.update(n)
        return out, notes
    if isinstance(obj, (list, tuple)):
        out = []
        for i, v in enumerate(obj):
            item, n = json_safe(v, f"{prefix}[{i}]")
            out.append(item)
            notes.update(n)
        return out, notes
    return obj, notes


def write_json(path: str | Path, data: dict) -> Path:
    """Write a dict as strict JSON atomically.

    JSON has no NaN or Infinity: such values are written as ``null`` and listed in the key
    ``null_values`` (dotted key -> the value it stands for), so a reader knows why.
    """
    clean, notes = json_safe(data)
    if notes:
        clean["null_values"] = {k: f"{v} (not a finite number; JSON has no NaN/Infinity)"
                                for k, v in notes.items()}
    text = json.dumps(clean, indent=2, allow_nan=False) + "\n"
    return write_text(path, text)
