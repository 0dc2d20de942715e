"""The state of a results folder: empty, finished (``summary.json``) or stale, its cleanup, and
the lock that gives it to one run at a time.

A run never writes into a folder that holds an earlier run unless asked
(``output.overwrite=true``, which first removes the earlier run or sweep:
:func:`clear_earlier`); a sweep resumed with
``output.resume=true`` skips the jobs that finished ``ok`` with the same config and clears the
others before running them again. While a run (or a sweep) works in a folder it holds an
exclusive OS lock on the file ``.fnsysid.lock`` inside it (:func:`lock_folder`, ``fcntl.flock``):
a second run into the same folder, into a folder inside it (a job folder of a running sweep)
or into a folder around it is refused (:func:`in_use`), and the lock ends with the process that
holds it, however it ends. The lock file is never opened through a link.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import json
import logging
import os
from pathlib import Path

from fnsysid.config.errors import ConfigError, some

#: files a run writes at the top of its folder (Hydra adds .hydra/ and run.log)
#: files a run or a sweep (with fnsysid-plot) writes at the top of its folder (Hydra adds
#: .hydra/, run.log and multirun.yaml); the temporaries of an interrupted write match ".*.tmp*"
RESULT_FILES = ("config.yaml", "summary.json", "errors.csv", "clients.csv", "estimates.csv",
                "theory.csv", "error.png", "fit.png", "trajectories.parquet", "truth.csv",
                "results.csv", "sweep.png", "sweep.pdf", "sweep.csv")
RESULT_FILES += ("parameters.csv", "k_clients.csv", "client_estimates.csv", "equations.txt",
                 "sparsity_path.csv")
#: the other views fnsysid-plot draws of a sweep (``sweep_heatmap.png``, ...), by pattern
RESULT_PATTERNS = ("sweep_*.png", "sweep_*.pdf", "sweep_*.csv")
#: settings that do not change what a run computes (ignored when comparing configs)
IGNORED = {"output": ("resume", "overwrite", "plot"), "progress": None}


#: the lock file inside a results folder while a run or a sweep works in it
LOCK = ".fnsysid.lock"


def has_results(folder: Path) -> bool:
    """True if ``folder`` holds anything (a file, a job folder, Hydra's records) but a lock."""
    folder = Path(folder)
    return folder.is_dir() and any(p.name != LOCK for p in folder.iterdir())


class FolderInUse(ConfigError):
    """The results folder is locked by another run (another process, or another call)."""


class FolderLock:
    """An exclusive lock on a results folder (from :func:`lock_folder`); a context manager.

    :meth:`release` removes the lock file and the folders that :func:`lock_folder` made if
    they are left empty (a run refused after the lock leaves no folder behind).
    """

    def __init__(self, folder: Path, fd: int | None, made: list[Path]):
        self.folder, self._fd, self._made = folder, fd, made

    def release(self) -> None:
        """Give the folder up (once; later calls do nothing)."""
        if self._fd is not None:
            # unlinked before the unlock: a run that opened the old file and locks it after
            # this finds the name gone and takes the lock again on a new file
            try:
                (self.folder / LOCK).unlink(missing_ok=True)
            except OSError:     # a folder made read-only meanwhile: the lock ends with the fd
                pass
            os.close(self._fd)
            self._fd = None
        _remove_empty(self._made)
        self._made = []

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders in ``made`` (deepest first) while they are empty."""
    for d in made:
        try:
            d.rmdir()
        except OSError:
            return


def _make(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; the folders this call made, deepest first."""
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    for d in reversed(missing):
        try:
            d.mkdir()
            made.append(d)
        except FileExistsError:         # made by another run at the same moment
            pass
    return made[::-1]


def lock_folder(folder: Path, name: str) -> FolderLock:
    """Take the exclusive lock of the results folder ``folder`` (made if missing) for this
    run, without waiting.

    ``name`` is how the message names the folder (``hydra.run.dir=/tmp/x``). Raises
    :class:`FolderInUse` (a :class:`ConfigError`) naming the process that holds it, or that
    holds a folder above or below it (:func:`in_use`, looked at once this lock is held, so of
    two runs into nested folders starting together at least one sees the other). The lock
    is ``fcntl.flock`` on ``folder/.fnsysid.lock``, which holds the holder's pid; the system
    releases it when the process ends, however it ends. On a file system without locks the
    run goes on unlocked, with a warning.
    """
    folder = Path(folder).absolute()      # given up at this path whatever the working folder
    path = folder / LOCK
    made: list[Path] = []
    for _ in range(20):
        made += _make(folder)
        try:        # never through a link: the pid would be written into its target
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        except FileNotFoundError:       # the folder was removed meanwhile: make it again
            continue
        except OSError as exc:
            _remove_empty(made)
            if exc.errno == errno.ELOOP:
                raise ConfigError(f"{name}: {LOCK} is a symbolic link, not a lock file of "
                                  "fnsysid; remove the link, or choose another folder") from None
            raise ConfigError(f"{name}: the lock file {LOCK} cannot be made "
                              f"({exc.strerror or exc}); a writable folder") from exc
        problem = _not_lock_file(os.fstat(fd))
        if problem:
            os.close(fd)
            _remove_empty(made)
            raise ConfigError(f"{name}: {LOCK} is {problem}, not a lock file of fnsysid; "
                              "remove it, or choose another folder")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                _remove_empty(made)
                raise FolderInUse(in_use_message(name, folder, folder, holder)) from None
            logging.getLogger("fnsysid").warning(
                "%s: no lock on this file system (%s): another run could write into it at the "
                "same time", name, exc.strerror or exc)
            return FolderLock(folder, None, made)
        try:
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            lock = FolderLock(folder, fd, made)
            other = in_use(folder, own=fd)
            if other is not None:       # a run above or below this folder: give it back
                lock.release()
                raise FolderInUse(in_use_message(name, folder, *other))
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return lock
        os.close(fd)        # the holder removed the file as it ended: lock the new one
    _remove_empty(made)
    raise FolderInUse(f"{name}: in use by other runs that keep replacing its lock; choose "
                      "another folder")


def _not_lock_file(st: os.stat_result) -> str | None:
    """What the opened ``.fnsysid.lock`` is if it is not a lock file that only fnsysid uses
    (a FIFO, a device, a folder, a hard link to another file, whose bytes the pid would
    replace); None if it is one."""
    import stat

    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return f"a file with {st.st_nlink} names (a hard link)"
    return None


def in_use_message(name: str, folder: Path, where: Path, holder: int | None) -> str:
    """The refusal of the folder ``folder`` (named ``name``) because a run holds ``where``."""
    pid = f"pid {holder}" if holder else "pid unknown"
    inside = "" if where == folder else \
        f", which writes into {where}" if where in folder.parents else \
        f", which writes into {where} inside it"
    return f"{name}: in use by another run ({pid}{inside}); wait for it to end, or choose " \
        "another folder"


def _held(path: Path, own: tuple[int, int] | None = None) -> tuple[bool, int | None]:
    """Whether another open file holds the lock ``path`` (probed with a shared lock that is
    given up at once; nothing is made or changed), and the pid written in it; ``own`` (device,
    inode) is this run's lock file, not counted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:                 # none, a link or unreadable: no run of fnsysid holds it
        return False, None
    try:
        st = os.fstat(fd)
        if _not_lock_file(st) or (st.st_dev, st.st_ino) == own:
            return False, None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES), _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)


def in_use(folder: Path, own: int | None = None) -> tuple[Path, int | None] | None:
    """The folder and pid of a run that holds ``folder``, a folder above it (a sweep whose
    job folders it would mix with) or a folder inside it, or None; ``own`` is the open lock
    file of this run, not counted. Only looks: nothing is made or locked."""
    folder = Path(folder).absolute()
    me = None
    if own is not None:
        st = os.fstat(own)
        me = st.st_dev, st.st_ino
    try:
        real = folder.resolve()
    except (OSError, RuntimeError):
        real = folder
    above = [folder, *folder.parents, *(d for d in [real, *real.parents]
                                        if d not in folder.parents and d != folder)]
    for d in above:
        held, pid = _held(d / LOCK, me)
        if held:
            return d, pid
    if not real.is_dir():
        return None
    for top, dirs, files in os.walk(real, onerror=lambda exc: None):
        if Path(top) != real and LOCK in files:
            held, pid = _held(Path(top) / LOCK, me)
            if held:
                return Path(top), pid
        dirs[:] = [d for d in dirs if d != ".hydra"]
    return None


def _read_pid(fd: int) -> int | None:
    """The pid written in a lock file (None if not yet written)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def is_earlier_run(folder: Path) -> bool:
    """True if ``folder`` holds a run's or a sweep's records (``summary.json``,
    ``config.yaml``, ``.hydra/``, ``multirun.yaml``, or the temporaries of an interrupted
    write): only then does ``output.overwrite=true`` remove anything in it."""
    folder = Path(folder)
    return any((folder / name).exists()
               for name in ("summary.json", "config.yaml", ".hydra", MULTIRUN)) or \
        any(folder.glob(".*.tmp*")) or _has_jobs(folder)


def _has_jobs(folder: Path) -> bool:
    """True if a folder right below ``folder`` is a job's (holds ``.hydra/`` or
    ``summary.json``): a sweep's folder, also one whose ``multirun.yaml`` was never written
    (a sweep killed early)."""
    try:
        return any((p / ".hydra").is_dir() or (p / "summary.json").is_file()
                   for p in Path(folder).iterdir() if p.is_dir())
    except OSError:
        return False


def not_a_run(name: str, folder: Path) -> str | None:
    """The one line refusing ``folder`` (the setting ``name``) if it holds files but no run
    (:func:`is_earlier_run`): a folder of one's own files is no results folder, even with
    ``output.overwrite=true`` (which removes only what a run wrote); None otherwise."""
    folder = Path(folder)
    if not has_results(folder) or is_earlier_run(folder):
        return None
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK)
    return (f"{name}={folder} is not empty and holds no earlier run ("
            + ", ".join(some(names, 5))
            + "); allowed: a new or empty folder, or an earlier run's")


def _kept(path: Path, keep) -> bool:
    """True if ``path`` is one of the paths ``keep`` (a run's inputs) or holds one."""
    path = Path(os.path.abspath(path))
    return any(k == path or path in k.parents for k in keep)


def input_paths(data) -> list[str]:
    """The input files of a run's ``data`` section (a mapping or settings object):
    ``data.path``, ``data.val_path`` and ``data.truth`` where given."""
    get = data.get if hasattr(data, "get") else (lambda k, d=None: getattr(data, k, d))
    return [str(get(k)) for k in ("path", "val_path", "truth") if get(k, None)]


def clear_results(folder: Path, keep=()) -> list[str]:
    """Remove an earlier run's result files (:data:`RESULT_FILES` and temporaries) from
    ``folder`` if it holds a run (:func:`is_earlier_run`), never a path of ``keep`` (the new
    run's input files); other files stay. Their names."""
    folder = Path(folder)
    if not is_earlier_run(folder):
        return []
    return sorted(_remove_result_files(folder, [Path(os.path.abspath(k)) for k in keep]))


def _result_paths(folder: Path) -> list[Path]:
    """The paths in ``folder`` that a run or fnsysid-plot may have written at its top
    (:data:`RESULT_FILES`, :data:`RESULT_PATTERNS`) and the temporaries of a write."""
    paths = [folder / name for name in RESULT_FILES]
    for pattern in (*RESULT_PATTERNS, ".*.tmp*"):
        paths += sorted(folder.glob(pattern))
    return paths


def _remove_result_files(folder: Path, keep: list[Path]) -> list[str]:
    """Remove :data:`RESULT_FILES` and temporaries from ``folder`` (not links, not a path of
    ``keep``: absolute); their names."""
    removed = []
    for p in _result_paths(folder):
        if p.is_file() and not p.is_symlink() and not _kept(p, keep):
            p.unlink()
            removed.append(p.name)
    return removed


#: the sweep's config that Hydra writes at the top of a sweep folder
MULTIRUN = "multirun.yaml"
#: what a run or a sweep writes at the top of its folder besides :data:`RESULT_FILES`
RUN_RECORDS = (MULTIRUN, "run.log")


def earlier_items(folder: Path, keep=()) -> list[Path]:
    """What makes the earlier run or sweep in ``folder`` (``output.overwrite=true``), if it
    holds one (:func:`is_earlier_run`): its result files and temporaries
    (:data:`RESULT_FILES`), Hydra's records at the top (``.hydra/``, ``run.log``,
    ``multirun.yaml``) and, for a sweep (``multirun.yaml`` or job folders right below), every
    job folder (a folder below that holds ``.hydra/``). Nothing that is or holds a path of
    ``keep`` (the new run's input files), no link but the records, no other file or folder."""
    folder = Path(folder)
    if not folder.is_dir() or not is_earlier_run(folder):
        return []
    keep = [Path(os.path.abspath(k)) for k in keep]
    sweep = (folder / MULTIRUN).is_file() or _has_jobs(folder)
    items = [p for p in _result_paths(folder)
             if p.is_file() and not p.is_symlink() and not _kept(p, keep)]
    items += [folder / name for name in RUN_RECORDS
              if ((folder / name).is_file() or (folder / name).is_symlink())
              and not _kept(folder / name, keep)]
    if (folder / ".hydra").is_dir() and not (folder / ".hydra").is_symlink():
        items.append(folder / ".hydra")
    for top, dirs, _ in os.walk(folder) if sweep else ():
        if Path(top) != folder and ".hydra" in dirs:
            if not _kept(Path(top), keep):
                items.append(Path(top))
            dirs[:] = []                    # a job folder goes whole
        else:
            dirs[:] = [d for d in dirs if d not in (".hydra", STASH)]
    return items


def clear_earlier(folder: Path, keep=()) -> list[str]:
    """Remove the earlier run or sweep in ``folder`` (:func:`earlier_items`), then the
    folders that this leaves empty. Returns the names removed (relative to ``folder``)."""
    import shutil

    folder = Path(folder)
    removed = []
    for item in earlier_items(folder, keep):
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()
        removed.append(item.relative_to(folder).as_posix())
        _remove_empty_parents(item.parent, folder)
    return sorted(removed)


def _remove_empty_parents(parent: Path, folder: Path) -> None:
    while parent != folder and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


#: where ``output.overwrite=true`` keeps the earlier run while the new one works (inside the
#: results folder: the same file system, so that moving is renaming)
STASH = ".fnsysid-earlier"


def stash_earlier(folder: Path, keep=()) -> list[str]:
    """Move the earlier run or sweep in ``folder`` (:func:`earlier_items`) into
    ``folder/.fnsysid-earlier/`` (renames), to be dropped when the new run has written its
    summary or put back when it has not (:func:`settle_stash`). Returns the names moved."""
    folder = Path(folder)
    items = earlier_items(folder, keep)
    if not items:
        return []
    stash = folder / STASH
    if stash.exists() or stash.is_symlink():
        raise ConfigError(f"{folder}: {STASH} is left from an overwrite that did not end; "
                          "look at what it holds (the earlier run), then move or remove it")
    moved = []
    stash.mkdir()
    for item in items:
        rel = item.relative_to(folder)
        (stash / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(item, stash / rel)
        moved.append(rel.as_posix())
        _remove_empty_parents(item.parent, folder)
    return sorted(moved)


def settle_stash(folder: Path, keep=()) -> str | None:
    """End an overwrite of ``folder``: if the new run wrote a summary (any status but
    ``refused``), drop the earlier run kept by :func:`stash_earlier` (``"replaced"``); if it
    did not (refused, failed, or killed before its summary), remove what the new run wrote
    and put the earlier run back as it was (``"restored"``). None when nothing was kept."""
    import shutil

    folder = Path(folder)
    stash = folder / STASH
    if not stash.is_dir() or stash.is_symlink():
        return None
    summary = folder / "summary.json"
    status = None
    if summary.is_file():
        try:
            status = json.loads(summary.read_text()).get("status")
        except (OSError, ValueError, AttributeError):
            status = None
    if status is not None and status != "refused":
        shutil.rmtree(stash)
        return "replaced"
    for item in earlier_items(folder, keep):    # what the new run left
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()
    for top, dirs, files in os.walk(stash):
        for name in files + [d for d in dirs if Path(top, d).is_symlink()]:
            src = Path(top) / name
            dst = folder / src.relative_to(stash)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
        for d in [d for d in dirs if not Path(top, d).is_symlink()]:
            (folder / Path(top, d).relative_to(stash)).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(stash)
    return "restored"


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


def _leaves(cfg, prefix: str = "") -> dict:
    """A nested config (plain dicts) as ``{"dotted.key": value}`` (lists are values)."""
    if not isinstance(cfg, dict) or not cfg:
        return {prefix: cfg} if prefix else {}
    out = {}
    for k, v in cfg.items():
        out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: the value :func:`first_difference` gives for a setting that one config lacks
MISSING = _Missing()


def first_difference(old: dict, new: dict, skip=()) -> tuple[str, object, object] | None:
    """The first setting (dotted key, old value, new value; a missing one is ``MISSING``)
    in which two resolved run configs differ, or None; up to the settings that change no
    number (resume, overwrite, plot, progress) and the keys in ``skip`` (with what is below
    them: a swept group)."""
    a, b = _leaves(_comparable(dict(old))), _leaves(_comparable(dict(new)))

    def skipped(key: str) -> bool:
        return any(key == s or key.startswith(s + ".") for s in skip)

    for key in [*b, *(k for k in a if k not in b)]:
        if not skipped(key) and a.get(key, MISSING) != b.get(key, MISSING):
            return key, a.get(key, MISSING), b.get(key, MISSING)
    return None
