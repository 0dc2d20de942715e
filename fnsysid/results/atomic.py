"""Result files written atomically: a temporary file in the same folder, then a rename.

A reader (or a run killed half-way) sees either the complete old file, the complete new one,
or none; never a truncated file. A failed write (disk full, read-only folder) raises
:class:`WriteError` with one line naming the path and the cause, and leaves no temporary file.
The files of one run are written :func:`together`: all of them first, then renamed in order.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path


class WriteError(OSError):
    """A result file could not be written (one-line message naming path and cause)."""


#: per thread, ``pending``: (temporary, path) of the files written so far in the thread's
#: :func:`together` block, else None (runs in threads of one process, as with the joblib
#: launcher's threading backend or the Python API, each publish their own files)
_LOCAL = threading.local()


def write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` to fill a temporary file, sync it to disk, then rename it to
    ``path`` (in a :func:`together` block: at the end of the block).

    The temporary name ends with ``path``'s suffix, so writers that pick the format from the
    name (``savefig``) still work.
    """
    path = Path(path)
    tmp = None
    try:
        os.close(_new_file(tmp := _temporary_name(path)))
        write(tmp)
        with open(tmp, "rb") as f:      # on disk before the rename makes it visible
            os.fsync(f.fileno())
        pending = getattr(_LOCAL, "pending", None)
        if pending is None:
            os.replace(tmp, path)
        else:
            pending.append((tmp, path))
        tmp = None
    except OSError as exc:
        raise _error(path, exc) from exc
    finally:
        if tmp is not None:
            _discard(tmp)
    return path


def _discard(tmp: str) -> None:
    """Remove a temporary file if it is there and can be removed (a folder made read-only
    during the run keeps it; the write's own error is the one reported)."""
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _temporary_name(path: Path) -> str:
    """A name beside ``path`` that no other file has (``.errors.csv.<random>.tmp.csv``)."""
    return str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}")


def _new_file(name: str) -> int:
    """Create ``name`` (refused if it exists) with the permissions ``open()`` gives a new
    file (0666 less the umask, applied by the system; ``tempfile.mkstemp`` makes 0600)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def _error(path: Path, exc: OSError) -> WriteError:
    return WriteError(f"cannot write {path}: {exc.strerror or exc}")


@contextmanager
def together():
    """Rename the files the block writes (:func:`write_atomic`) only when the block ends, in
    the order they were written: a reader sees none of them before all are on disk, and the
    last written (``summary.json``) last. If the block fails, none is renamed and no temporary
    is left. Nested blocks join the outer one; a block collects its own thread's files.
    """
    if getattr(_LOCAL, "pending", None) is not None:
        yield
        return
    pending = _LOCAL.pending = []
    try:
        yield
        _LOCAL.pending = None
        for tmp, path in pending:
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _error(path, exc) from exc
    finally:
        _LOCAL.pending = None
        for tmp, _ in pending:          # those not renamed
            _discard(tmp)


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


def restored(summary: dict, key: str):
    """``summary[key]`` as it was before :func:`write_json` wrote it: a number written as
    ``null`` (NaN, inf) is read back from ``null_values``; None where the key is absent or
    null for no such reason."""
    value = summary.get(key)
    if value is not None:
        return value
    note = (summary.get("null_values") or {}).get(key)
    if not isinstance(note, str):
        return None
    word = note.split(" ", 1)[0]
    return float(word) if word in ("inf", "-inf", "nan") else None


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
