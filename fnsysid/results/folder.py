"""The state of a results folder: empty, finished (``summary.json``) or stale, and its cleanup.

A run never writes into a folder that holds an earlier run unless asked
(``output.overwrite=true``, which first clears the earlier result files); a sweep resumed with
``output.resume=true`` skips the jobs that finished ``ok`` with the same config and clears the
others before running them again.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

#: files a run writes at the top of its folder (Hydra adds .hydra/ and run.log)
RESULT_PATTERNS = ("*.csv", "*.json", "*.png", "*.pdf", "*.parquet", "config.yaml",
                   ".*.tmp*")
#: settings that do not change what a run computes (ignored when comparing configs)
IGNORED = {"output": ("resume", "overwrite", "plot"), "progress": None}


def has_results(folder: Path) -> bool:
    """True if ``folder`` holds anything (a file, a job folder, Hydra's records)."""
    folder = Path(folder)
    return folder.is_dir() and any(folder.iterdir())


def clear_results(folder: Path) -> list[str]:
    """Remove an earlier run's result files from ``folder`` (not other files); their names."""
    removed = []
    for pattern in RESULT_PATTERNS:
        for p in Path(folder).glob(pattern):
            if p.is_file():
                p.unlink()
                removed.append(p.name)
    return sorted(removed)


def _comparable(cfg: dict) -> dict:
    cfg = {k: v for k, v in cfg.items() if not (k in IGNORED and IGNORED[k] is None)}
    out = dict(cfg.get("output") or {})
    for k in IGNORED["output"]:
        out.pop(k, None)
    cfg["output"] = out
    return cfg


def errors_problem(folder: Path, summary: dict) -> str | None:
    """Why ``errors.csv`` in ``folder`` is not the table its ``summary`` describes (a row per
    repeat and round 0..``rounds_completed`` in that order, as many fields as the header, only
    numbers or empty fields); None if it is. Reads the text once, without parsing numbers."""
    import re

    try:
        text = (Path(folder) / "errors.csv").read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return f"errors.csv cannot be read ({exc.strerror or exc})"
    lines = text.splitlines()
    header = lines[0].split(",") if lines else []
    if header[:3] != ["repeat", "round", "e_max"]:
        return f"errors.csv starts with {lines[0][:40] if lines else ''!r}, not repeat,round,e_max"
    rounds, body = summary.get("rounds_completed"), lines[1:]
    per_repeat = rounds + 1 if isinstance(rounds, int) and rounds >= 0 else 0
    repeats = summary.get("repeats") or (len(body) // per_repeat if per_repeat else 0)
    if not per_repeat or len(body) != repeats * per_repeat:
        return (f"errors.csv has {len(body)} rows, not one per repeat and round 0..{rounds} "
                "of summary.json")
    after = text[len(lines[0]):]                                        # after the header
    commas = len(header) - 1
    if not after.encode("ascii", "replace").translate(None, NUMBER_BYTES) and \
            all(map(str.startswith, body, _row_prefixes(repeats, per_repeat))) and \
            set(map(str.count, body, itertools.repeat(","))) <= {commas}:
        return None                     # the checks below, made without a Python loop
    rows = ((s, r) for s in range(repeats) for r in range(per_repeat))
    for n, (line, (s, r)) in enumerate(zip(body, rows, strict=True), start=2):
        if not line.startswith(f"{s},{r},") or line.count(",") != commas:
            return (f"errors.csv: line {n} is not the row of repeat {s}, round {r} with "
                    f"{len(header)} fields")
    bad = re.search(f"[^{re.escape(NUMBER_BYTES.decode())}]", after)
    if bad:
        return f"errors.csv holds {bad.group()!r}, not a number"
    return None


#: the bytes of numbers, empty fields and line ends in a CSV (nan, inf and exponents included)
NUMBER_BYTES = b"-+.,0123456789eEnaifINF\r\n"


@functools.lru_cache(maxsize=16)
def _row_prefixes(repeats: int, per_repeat: int) -> list[str]:
    """``"repeat,round,"`` that starts each row of ``errors.csv``, in order."""
    return [f"{s},{r}," for s in range(repeats) for r in range(per_repeat)]


def finished_ok(folder: Path, resolved: dict) -> bool:
    """True if ``folder`` holds a run whose summary is ``ok``, whose ``errors.csv`` has its
    rows (:func:`errors_problem`) and whose ``config.yaml`` holds the settings ``resolved``
    (a run config resolved into plain Python; up to settings that change no number: resume,
    overwrite, plot, progress)."""
    import yaml

    folder = Path(folder)
    try:
        summary = json.loads((folder / "summary.json").read_text())
        saved = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    if not isinstance(summary, dict) or summary.get("status") != "ok" or \
            errors_problem(folder, summary) is not None:
        return False
    return isinstance(saved, dict) and _comparable(saved) == _comparable(dict(resolved))
