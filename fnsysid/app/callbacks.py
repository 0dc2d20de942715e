"""Hydra callbacks (registered in ``conf/config.yaml``): the lock on the results folder of a run
or a sweep, ``results.csv`` at a sweep's root, and the jobs that are not ``ok``, which set the
command's exit status."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fnsysid.app.preflight import check_earlier
from fnsysid.config.checks import override_key
from fnsysid.config.errors import ConfigError, DataError, show
from fnsysid.results.folder import (
    MISSING,
    MULTIRUN,
    STASH,
    clear_earlier,
    errors_problem,
    first_difference,
    input_paths,
    lock_folder,
    settle_stash,
    stash_earlier,
)
from fnsysid.results.folder import FolderLock as Lock

log = logging.getLogger("fnsysid")

#: the results folders this process holds for its run or sweep: folder -> lock
HELD: dict[Path, Lock] = {}
#: the run folders whose earlier run is kept aside during an overwrite: folder -> input paths
STASHED: dict[Path, list[str]] = {}


class FolderLock(Callback):
    """Hydra callback: the results folder (``hydra.run.dir``, or a sweep's ``hydra.sweep.dir``
    with all its jobs) belongs to one command at a time. Before Hydra writes anything there,
    the command takes the folder's exclusive lock (:func:`fnsysid.results.folder.lock_folder`)
    or stops with one line and exit status 2, touching nothing of the run that holds it; it
    then checks again, under the lock, that the folder holds no earlier run (or, with
    ``output.resume=true``, a sweep of the same settings), and with ``output.overwrite=true``
    removes the earlier run or sweep (before Hydra opens ``run.log``). The lock is given up
    when the run or the sweep ends (the jobs of a sweep, in this process or in a launcher's
    workers, write their sub-folders under their command's lock and take none of their
    own)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _take(config, "hydra.run.dir", multirun=False)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _take(config, "hydra.sweep.dir", multirun=True)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        release(Path(str(config.hydra.run.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        release(Path(str(config.hydra.sweep.dir)))


def _take(config: DictConfig, key: str, multirun: bool) -> None:
    """Lock the folder of ``key`` and check it again under the lock; one line and exit 2 if
    it is refused (the folder left as it was)."""
    folder = Path(str(OmegaConf.select(config, key)))   # resolves (and fixes) ${now:...}
    try:
        HELD[folder] = lock_folder(folder, f"{key}={folder}")
        output = config.get("output") or {}
        check_earlier(key, folder, output, multirun)
        if multirun and output.get("resume"):
            check_resume(config, folder)
        elif output.get("overwrite") and multirun:  # before Hydra writes (and opens run.log)
            removed = clear_earlier(folder, input_paths(config.get("data") or {}))
            if removed:
                log.info("output.overwrite=true: removed the earlier results in %s: %s",
                         folder, ", ".join(removed))
        elif output.get("overwrite"):   # kept aside until the new run has its summary
            keep = input_paths(config.get("data") or {})
            if stash_earlier(folder, keep):
                STASHED[folder] = keep
    except ConfigError as exc:
        release(folder)                 # if it was taken
        print(f"fnsysid: error: {exc}", file=sys.stderr)
        sys.exit(2)


def release(folder: Path | None = None) -> None:
    """Give up the lock this process holds on ``folder`` (all of them when None), after
    ending an overwrite of it: the earlier run is dropped if the new run wrote its summary,
    and put back as it was if not (:func:`~fnsysid.results.folder.settle_stash`)."""
    for f in [folder] if folder is not None else list(HELD):
        if f in STASHED:
            keep = STASHED.pop(f)
            try:
                outcome = settle_stash(f, keep)
            except OSError as exc:
                print(f"fnsysid: error: the earlier run in {f} could not be put back "
                      f"({exc.strerror or exc}); it is kept in {f / STASH}", file=sys.stderr)
                outcome = None
            if outcome == "restored":
                print(f"fnsysid: output.overwrite=true: the new run did not finish; the earlier "
                      f"run in {f} is kept as it was", file=sys.stderr)
        lock = HELD.pop(f, None)
        if lock is not None:
            lock.release()


def _plain(config) -> dict:
    """A run config without Hydra's node, resolved into plain Python where it can be."""
    cfg = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:           # an interpolation that needs a running job: compared as text
        return OmegaConf.to_container(cfg, resolve=False)


def check_resume(config: DictConfig, folder: Path) -> None:
    """``output.resume=true`` finishes a sweep only with the settings it was started with
    (up to the swept values and the settings that change no number): refuse otherwise in one
    line naming the setting and both values. ``config`` is the new sweep's (with Hydra's
    node); the earlier sweep's is its ``multirun.yaml`` (none: nothing to compare)."""
    from fnsysid.results.sweep import sweep_keys  # numpy: a sweep's, imported when needed

    path = folder / MULTIRUN
    if not path.is_file():
        return
    try:
        old = OmegaConf.load(path)
        if not isinstance(old, DictConfig):
            raise ValueError("not a mapping")
    except Exception as exc:        # a damaged multirun.yaml: the sweep cannot be compared
        raise ConfigError(f"output.resume=true: {path} cannot be read ({type(exc).__name__}); "
                          "resume needs the sweep's own multirun.yaml, or choose a new "
                          "hydra.sweep.dir") from None
    old_hydra = OmegaConf.to_container(old.get("hydra") or {}, resolve=False)
    new_hydra = OmegaConf.to_container(config.hydra, resolve=False)
    old_keys, new_keys = sweep_keys(old_hydra), sweep_keys(new_hydra)
    if set(old_keys) != set(new_keys):
        now, was = (", ".join(keys) or "nothing" for keys in (new_keys, old_keys))
        raise ConfigError(f"output.resume=true: this command sweeps {now}, the sweep in "
                          f"{folder} swept {was}; resume it with the same swept settings, or "
                          "choose a new hydra.sweep.dir")
    choices = [{k: v for k, v in ((h.get("runtime") or {}).get("choices") or {}).items()
                if not k.startswith("hydra/")} for h in (old_hydra, new_hydra)]
    own = ("resume it only with its own settings (other values of its swept settings may be "
           "added), or choose a new hydra.sweep.dir")
    diff = first_difference(*choices, skip=new_keys) or \
        first_difference(_plain(old), _plain(config), skip=new_keys)
    if diff is not None:
        key, was, now = diff
        raise ConfigError(
            f"output.resume=true: {key}={_shown(now)} differs from {key}={_shown(was)} of the "
            f"sweep in {folder}; {own}")
    # Hydra names a job's folder by its command line's settings (override_dirname): a setting
    # given now and not then (seed=0, the value in effect anyway) would rerun every job in a
    # new folder
    exclude = set(OmegaConf.select(config, "hydra.job.config.override_dirname.exclude_keys")
                  or [])
    was, now = (_given(h, new_keys, exclude) for h in (old_hydra, new_hydra))
    for key in [*now, *(k for k in was if k not in now)]:
        if was.get(key) == now.get(key):
            continue
        if key not in was:
            what = f"{now[key]} is not on the command line of the sweep in {folder}"
        elif key not in now:
            what = f"{key} is not given, but the sweep in {folder} was started with {was[key]}"
        else:
            what = f"{now[key]} differs from {was[key]} on the command line of the sweep in " \
                f"{folder}"
        raise ConfigError(f"output.resume=true: {what} (the job folders are named by the "
                          f"settings the command line gives); {own}")


def _given(hydra_cfg: dict, swept: list[str], exclude: set[str]) -> dict:
    """The settings a sweep's command line gives (``hydra.overrides.task``) that name its job
    folders: setting -> override as written, without the swept ones and ``exclude``."""
    lines = (hydra_cfg.get("overrides") or {}).get("task") or []
    given = {override_key(line): line for line in lines}
    return {k: line for k, line in given.items() if k not in swept and k not in exclude}


def _shown(value) -> str:
    return "(not set)" if value is MISSING else show(value)


class SweepTable(Callback):
    """Hydra callback: at the end of a multirun, ``results.csv`` at the sweep's root; if a
    job's files cannot be read, one line in the log and no ``results.csv`` (the sweep's exit
    status is set by :class:`SweepStatus`, which names the job)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from fnsysid.results.sweep import RESULTS, write_results

        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        try:
            log.info("sweep table: %s", write_results(sweep_dir))
        except (DataError, OSError, ValueError) as exc:
            try:
                (sweep_dir / RESULTS).unlink(missing_ok=True)
            except OSError:
                pass
            if not isinstance(exc, OSError):
                log.error("sweep table not written: %s", exc)   # a job's files: SweepStatus
                return
            reason = f"{exc.strerror}: {exc.filename}" if exc.strerror else str(exc)
            log.error("sweep table not written: %s", reason)
            TABLE_PROBLEM[:] = [str(sweep_dir / RESULTS), reason]


#: the sweep table of the last multirun that could not be written: [path, reason] (set by
#: :class:`SweepTable`; a failure of the command, exit status 2)
TABLE_PROBLEM: list[str] = []

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
            if status == "ok":              # client models judged like the server's
                kinds = summary.get("client_models") or {}
                worst = [f"{k} {j['status']}" for k, j in kinds.items()   # local: a diagnostic
                         if k != "local" and isinstance(j, dict) and j.get("status", "ok") != "ok"]
                status = f"client models {', '.join(worst)}" if worst else status
            if status != "ok":
                SWEEP_PROBLEMS.setdefault(status, []).append(str(job.relative_to(root)))
        if SWEEP_PROBLEMS:
            SWEEP_PROBLEMS["_root"] = [str(root)]


def sweep_exit() -> None:
    """Exit with one line if the multirun that just ended had jobs that are not ``ok``: 2 if a
    job's settings were refused, else 3 (diverged, growing, interrupted or unfinished jobs);
    and with 2 if its table ``results.csv`` could not be written (the worst outcome wins)."""
    problems = dict(SWEEP_PROBLEMS)
    SWEEP_PROBLEMS.clear()          # reported once: a later command in this process starts clean
    table = list(TABLE_PROBLEM)
    TABLE_PROBLEM.clear()
    if table:
        print(f"fnsysid: error: the sweep table {table[0]} could not be written ({table[1]})"
              + ("; some jobs are not ok either, see their summary.json" if problems else ""),
              file=sys.stderr)
        sys.exit(2)
    if not problems:
        return
    root = problems.pop("_root")[0]
    parts = [f"{status}: {', '.join(jobs)}" for status, jobs in sorted(problems.items())]
    print(f"fnsysid: sweep {root} has jobs that are not ok ({'; '.join(parts)}); see their "
          "summary.json and run.log", file=sys.stderr)
    sys.exit(2 if "refused" in problems else 3)
