"""Hydra callbacks of a multirun (registered in ``conf/config.yaml``): ``results.csv`` at the
sweep's root, and the jobs that are not ``ok``, which set the command's exit status."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from fnsysid.config.errors import DataError
from fnsysid.results.folder import errors_problem
from fnsysid.results.sweep import RESULTS, write_results

log = logging.getLogger("fnsysid")


class SweepTable(Callback):
    """Hydra callback: at the end of a multirun, ``results.csv`` at the sweep's root; if a
    job's files cannot be read, one line in the log and no ``results.csv`` (the sweep's exit
    status is set by :class:`SweepStatus`, which names the job)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            log.info("sweep table: %s", write_results(sweep_dir))
        except (DataError, OSError, ValueError) as exc:
            (sweep_dir / RESULTS).unlink(missing_ok=True)
            log.error("sweep table not written: %s", exc)


#: jobs of the last multirun whose summary is not ``ok`` (set by :class:`SweepStatus`)
SWEEP_PROBLEMS: dict[str, list[str]] = {}


class SweepStatus(Callback):
    """Hydra callback: after a multirun, collect the jobs that diverged, grew (``growing``) or
    did not finish, and finished jobs whose ``errors.csv`` lacks rows its summary counts."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        SWEEP_PROBLEMS.clear()
        root = Path(config.hydra.sweep.dir)
        for job in sorted(p.parent for p in root.glob("**/.hydra")):
            try:
                summary = json.loads((job / "summary.json").read_text())
                status = summary["status"]
            except (OSError, ValueError, KeyError, TypeError):
                status = "incomplete"
            if status == "ok" and errors_problem(job, summary) is not None:
                status = "bad errors.csv"
            if status != "ok":
                SWEEP_PROBLEMS.setdefault(status, []).append(str(job.relative_to(root)))
        if SWEEP_PROBLEMS:
            SWEEP_PROBLEMS["_root"] = [str(root)]


def sweep_exit() -> None:
    """Exit with one line if the multirun that just ended had jobs that are not ``ok``: 2 if a
    job's settings were refused, else 3 (diverged, growing, interrupted or unfinished jobs)."""
    problems = dict(SWEEP_PROBLEMS)
    SWEEP_PROBLEMS.clear()          # reported once: a later command in this process starts clean
    if not problems:
        return
    root = problems.pop("_root")[0]
    parts = [f"{status}: {', '.join(jobs)}" for status, jobs in sorted(problems.items())]
    print(f"fnsysid: sweep {root} has jobs that are not ok ({'; '.join(parts)}); see their "
          "summary.json and run.log", file=sys.stderr)
    sys.exit(2 if "refused" in problems else 3)
