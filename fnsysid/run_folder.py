"""The state of a results folder: empty, finished (``summary.json``) or stale, and its cleanup.

A run never writes into a folder that holds an earlier run unless asked
(``output.overwrite=true``, which first clears the earlier result files); a sweep resumed with
``output.resume=true`` skips the jobs that finished ``ok`` with the same config and clears the
others before running them again.
"""

from __future__ import annotations

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


def finished_ok(folder: Path, cfg) -> bool:
    """True if ``folder`` holds a run whose summary is ``ok`` and whose resolved config equals
    ``cfg`` (up to settings that change no number: resume, overwrite, plot, progress)."""
    from omegaconf import OmegaConf

    folder = Path(folder)
    try:
        status = json.loads((folder / "summary.json").read_text()).get("status")
        saved = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
    except (OSError, ValueError):
        return False
    current = OmegaConf.to_container(cfg, resolve=True)
    return status == "ok" and _comparable(saved) == _comparable(current)
