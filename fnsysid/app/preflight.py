"""The check of a command line before it runs: settings, Hydra's settings, every sweep job
(the arguments parsed by :mod:`fnsysid.config.argv`).

Bad input is reported in one line (``fnsysid: error: ...``) with exit status 2 before any
output folder is written: group options, knob values and every combination of a sweep are
composed and checked up front.
"""

from __future__ import annotations

import contextvars
import errno
import itertools
import os
from pathlib import Path

from fnsysid.app.resources import check_disk
from fnsysid.config.argv import (
    check_args,
    encode,
    flag_value,
    grammar_error,
    is_multirun,
    override_args,
    sweep_values,
)
from fnsysid.config.checks import ConfigError, check_batch_size, check_run, override_key
from fnsysid.config.errors import one_line, show
from fnsysid.config.groups import CONF_DIR, HYDRA_LOCK, command, with_config_dir
from fnsysid.config.schema import GROUPS, KNOBS, TOP_LEVEL, check_value
from fnsysid.results.folder import (
    MULTIRUN,
    FolderInUse,
    has_results,
    in_use,
    in_use_message,
    not_a_run,
)

#: what a single run leaves at the top of its folder (a sweep has them in its job folders)
SINGLE_RUN = (".hydra", "summary.json", "errors.csv")
#: most sweep combinations composed and checked before a multirun starts
MAX_CHECKED = 256
#: True while the config of trajectories held in memory is checked (``compose(...,
#: data_in_memory=True)``): ``data.path`` then names them and is no file to check
DATA_IN_MEMORY = contextvars.ContextVar("fnsysid_data_in_memory", default=False)


class _GroupOptions(dict):
    """Options of each group, read when first asked for (through the initialized Hydra's
    config loader, with the command's ``hydra.searchpath``)."""

    def __init__(self, config_name: str, searchpath: list[str]):
        super().__init__()
        self._args = config_name, searchpath

    def __contains__(self, group) -> bool:
        return group in GROUPS

    def __missing__(self, group: str) -> list[str]:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.object_type import ObjectType

        loader = GlobalHydra.instance().config_loader()
        self[group] = sorted(loader.get_group_options(group, ObjectType.CONFIG, *self._args))
        return self[group]


def _check_value(key: str, value, groups: dict) -> None:
    if key in groups:
        allowed = groups[key]
        if value is None or str(value) not in allowed:
            raise ConfigError(f"{key}={show(value)} is not an option; allowed: "
                              f"{', '.join(allowed)}")
    elif "/" in key and value is None:          # a group of Hydra's own (hydra/launcher=...)
        raise ConfigError(f"{key}=null is not an option: a config group takes the name of one "
                          "of its options (--hydra-help lists Hydra's)")
    elif key == "optimizer.batch_size":
        check_batch_size(value)
    else:
        check_value(key, value)


def preflight(argv: list[str], folders: bool = True):
    """Raise :class:`ConfigError` for the first bad setting in ``argv`` (or in its sweeps).

    Returns (the deepest existing folder on the way to the results folder, or None without
    ``folders``, the config composed with the first value of every sweep, with Hydra's node).
    ``folders=False`` leaves out the checks of Hydra's results folders (the Python API writes
    into a folder of its own, if any).
    """
    from hydra import initialize_config_dir

    config_dir = config_folder(argv)
    with HYDRA_LOCK, initialize_config_dir(config_dir=str(config_dir), version_base="1.3",
                                           job_name="fnsysid"):
        return check(argv, config_dir, folders)


def config_folder(argv: list[str]) -> Path:
    """The checks of ``argv`` before Hydra is initialized: its arguments, ``FNSYSID_THREADS``;
    returns the folder of the primary config (``conf/`` or ``--config-path``)."""
    check_args(argv)
    from fnsysid.dynamics.model import threads

    try:
        threads(1)                   # FNSYSID_THREADS, read by the simulation
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return primary_config_dir(flag_value(argv, "--config-path", "-cp"))


def check(argv: list[str], config_dir: Path, folders: bool = True):
    """:func:`preflight` with Hydra initialized by the caller on ``config_dir`` (the folder
    :func:`config_folder` returns; under :data:`~fnsysid.config.groups.HYDRA_LOCK`)."""
    return _preflight(argv, config_dir, flag_value(argv, "--config-name", "-cn") or "config",
                      folders)


def primary_config_dir(config_path: str | None) -> Path:
    """The folder of the primary config: ``conf/``, or ``--config-path`` (relative to the
    working folder), which must exist and hold a primary config."""
    if config_path is None:
        if not (CONF_DIR / "config.yaml").is_file():
            raise ConfigError(f"no primary config in {CONF_DIR}; install from a checkout with "
                              "`make install`")
        return CONF_DIR
    folder = Path(config_path).absolute()
    try:
        folder.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise ConfigError(path_error("--config-path", config_path, exc)) from None
    if not folder.is_dir():
        raise ConfigError(f"--config-path {config_path}: no such folder (e.g. --config-path "
                          f"{CONF_DIR})")
    if not any(folder.glob("*.yaml")):
        held = sorted(p.name for p in folder.iterdir())
        shown = ", ".join(held[:8]) + (f", ... ({len(held)} in all)" if len(held) > 8 else "")
        raise ConfigError(f"--config-path {config_path}: no primary config (.yaml) in this "
                          f"folder; it holds: {shown or 'nothing'}")
    return folder


def _preflight(argv, config_dir: Path, config_name: str, folders: bool):
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    # --config-dir as Hydra's entry point has it: one more folder in the config search path
    args = with_config_dir(override_args(argv), flag_value(argv, "--config-dir", "-cd"))
    loader = GlobalHydra.instance().config_loader()
    parser = OverridesParser.create(config_loader=loader)
    try:
        parsed = parser.parse_overrides(args)
    except HydraException as exc:
        raise grammar_error(exc, args) from exc
    if not (config_dir / f"{config_name}.yaml").is_file():
        found = sorted(p.stem for p in config_dir.glob("*.yaml") if not p.stem.startswith("_"))
        raise ConfigError(f"--config-name {config_name}: no such primary config; allowed: "
                          + ", ".join(found))
    searchpath = [o.input_line for o in parsed
                  if o.key_or_group == "hydra.searchpath" and not o.is_delete()]
    # the messages that list options (feature maps that fit, ...) read this search path too
    with command(config_name, searchpath):
        return _check_command(argv, config_name, parser, parsed,
                              _GroupOptions(config_name, searchpath), folders)


def _check_command(argv, config_name: str, parser, parsed, groups, folders: bool):
    """The checks of :func:`preflight` once the overrides are parsed."""
    import yaml
    from hydra import compose
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    dims, fixed = {}, []
    for o in parsed:
        key = o.key_or_group
        top = key.split(".")[0].split("/")[0]
        if top not in (*TOP_LEVEL, *GROUPS, "hydra") and o.package is None:
            raise ConfigError(f"unknown setting '{key}'; knobs: {', '.join(KNOBS)}; other "
                              f"settings: {', '.join(sorted(set(TOP_LEVEL) - set(KNOBS)))}; "
                              f"groups: {', '.join(GROUPS)} (see --help)")
        if o.is_sweep_override() and o.is_hydra_override():
            raise ConfigError(_hydra_sweep(o))
        if key == "hydra.job.env_copy" and not o.is_delete():
            _check_env_copy(o)
        if o.is_delete() or o.package is not None or not o.is_sweep_override():
            fixed.append(o.input_line)
            if not o.is_delete() and o.package is None and not key.startswith("hydra."):
                try:
                    _check_value(key, o.value(), groups)
                except ConfigError as exc:  # one value for a list: the bracket form
                    if "must be a list" not in str(exc) or isinstance(o.value(), (list, dict)):
                        raise
                    raise ConfigError(f"{exc}; a list is written in brackets: "
                                      f"{key}={_bracketed([o.value()])}") from None
            continue
        values = sweep_values(o, key)
        for v in values:
            try:
                _check_value(key, v, groups)
            except ConfigError as exc:      # a,b for a list: the bracket form
                if "must be a list" not in str(exc):
                    raise
                raise ConfigError(f"{o.input_line}: {key} must be a list; a,b is a sweep of "
                                  f"{len(values)} values, a list is written in brackets: "
                                  f"{key}={_bracketed(values)}") from None
        dims[o.input_line.split("=", 1)[0]] = values

    first = fixed + [f"{k}={encode(v[0])}" for k, v in dims.items()]
    try:
        base = compose(config_name, overrides=first, return_hydra_config=True)
    except yaml.YAMLError as exc:   # a config file of one's own that is not valid YAML
        raise ConfigError(one_line(exc)) from exc
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_not_in_option(exc, first, config_name, compose, groups)
                          or one_line(exc)) from exc
    except KeyError as exc:     # Hydra copies hydra.job.env_copy from os.environ unchecked
        if str(exc.args[0]) in os.environ:
            raise
        raise _unset_env("hydra.job.env_copy", [str(exc.args[0])]) from exc
    except (AssertionError, AttributeError) as exc:   # OmegaConf on hydra.sweeper.params=null
        message = _params_unset(parsed, first, config_name, compose)
        if message is None:
            raise
        raise ConfigError(message) from exc
    multirun = is_multirun(argv) or base.hydra.mode == RunMode.MULTIRUN
    if dims and not multirun:
        k = next(iter(dims))
        raise ConfigError(f"{k}={','.join(encode(v) for v in dims[k])} is a sweep: add -m to run "
                          f"one job per value, or write {k}=[...] for a list value")
    existing = _check_hydra(base, multirun) if folders else None
    # sweeps stored in experiment files (hydra.sweeper.params); the command line wins
    for k, v in (base.hydra.sweeper.get("params") or {}).items():
        if k in dims or any(override_key(f) == k for f in fixed):
            continue
        o = parser.parse_overrides([f"{k}={v}"])[0]
        values = sweep_values(o, k)
        for val in values:
            _check_value(o.key_or_group, val, groups)
        dims[k] = values
    disk = _check_combinations(config_name, fixed, dims, compose, base, groups)
    n_jobs = 1
    for values in dims.values():
        n_jobs *= len(values)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if folders:
        check_disk(key, OmegaConf.select(base, key), disk * n_jobs)
    return existing, base


def _bracketed(values) -> str:
    """``values`` as a list override, ``[theta,omega]`` (strings bare, others encoded)."""
    return "[" + ",".join(v if isinstance(v, str) else encode(v) for v in values) + "]"


def _hydra_sweep(o) -> str:
    """The message for a sweep of a ``hydra.*`` setting, which Hydra refuses."""
    key, value = o.key_or_group, o.input_line.split("=", 1)[1]
    if key.startswith("hydra.sweeper.params."):
        name = key[len("hydra.sweeper.params."):]
        return (f"{o.input_line}: a hydra.* setting takes one value, not a sweep: quote it to "
                f"change an experiment's sweep ({o.input_line.split('=', 1)[0]}='{value}'), or "
                f"sweep on the command line (-m {name}={value}, which wins over the experiment's "
                f"sweep of {name})")
    return (f"{o.input_line}: Hydra settings (hydra.*) take one value, not a sweep; run one "
            "command per value")


def _check_env_copy(o) -> None:
    """Every variable ``hydra.job.env_copy`` names is set (Hydra copies them unchecked)."""
    names = o.value() if isinstance(o.value(), list) else [o.value()]
    missing = [str(n) for n in names if str(n) not in os.environ]
    if missing:
        raise _unset_env(o.input_line, missing)


def _unset_env(setting: str, missing: list[str]) -> ConfigError:
    """The error for variables named in ``hydra.job.env_copy`` (by ``setting``) that are not
    set: from the command line, or from a config file (found when Hydra composes)."""
    return ConfigError(f"{setting}: {', '.join(missing)} not set in the environment; "
                       "hydra.job.env_copy takes names of variables that are set (export "
                       f"{missing[0]}=... first, or use hydra.job.env_set.{missing[0]}=value)")


def _params_unset(parsed, first: list[str], config_name: str, compose) -> str | None:
    """For an override of ``hydra.sweeper.params`` when the config leaves it null (no
    experiment): the message saying to sweep on the command line; None otherwise."""
    from omegaconf import OmegaConf

    params = [o for o in parsed if o.key_or_group == "hydra.sweeper.params"
              or o.key_or_group.startswith("hydra.sweeper.params.")]
    if not params:
        return None
    rest = [line for line in first
            if not override_key(line).startswith("hydra.sweeper.params")]
    try:
        cfg = compose(config_name, overrides=rest, return_hydra_config=True)
    except Exception:          # another bad override: the original error
        return None
    if OmegaConf.select(cfg, "hydra.sweeper.params") is not None:
        return None
    o = params[0]
    value = o.value()
    sweeps = value if isinstance(value, dict) else \
        {o.key_or_group[len("hydra.sweeper.params."):]: value}
    return (f"{o.input_line}: hydra.sweeper.params is null in this config (an experiment file "
            "sets it), so Hydra cannot add to it; sweep on the command line instead: -m "
            + " ".join(f"{k}={v}" for k, v in sweeps.items()))


def _not_in_option(exc, first: list[str], config_name: str, compose, groups) -> str | None:
    """For Hydra's "Could not override 'data.holdout'" (a key that the chosen option of its
    group lacks): the message naming the chosen option, its keys and the options that have
    the key; None for other errors."""
    import re

    match = re.match(r"Could not override '([^']+)'", str(exc))
    group, _, rest = match.group(1).partition(".") if match else ("", "", "")
    if group not in GROUPS or not rest:
        return None
    key = match.group(1)
    others = [o for o in first if override_key(o) != key]
    try:
        cfg = compose(config_name, overrides=others, return_hydra_config=True)
        chosen = cfg.hydra.runtime.choices[group]
        # the group's other settings (data.path=...) may not exist in its other options
        base = [o for o in others if override_key(o).split(".")[0] != group]
        have = [name for name in groups[group] if name != chosen and rest.split(".")[0] in
                compose(config_name, overrides=[*base, f"{group}={name}"])[group]]
    except Exception:          # another bad override: Hydra's own message
        return None
    also = f"; it is a setting of {', '.join(f'{group}={h}' for h in have)}" if have else ""
    keys = [k for k in cfg[group] if not k.startswith("_")]
    has = f"has: {', '.join(keys)}" if keys else "has no settings"
    return f"unknown setting '{key}' with {group}={chosen}; {group}={chosen} {has}{also}"


def _check_hydra(base, multirun: bool) -> Path:
    """Hydra settings that Hydra itself accepts but that would fail or misplace results.
    Returns the deepest existing folder on the way to the results folder."""
    from omegaconf import OmegaConf

    for key in ("hydra.sweep.dir", "hydra.run.dir") if multirun else ("hydra.run.dir",):
        value = OmegaConf.select(base, key)
        if value is None or not str(value).strip():
            raise ConfigError(f"{key} is empty: give a folder for the results "
                              f"(e.g. {key}=outputs/myrun)")
    if multirun:
        _check_subdir(OmegaConf.to_container(base.hydra.sweep, resolve=False).get("subdir"))
    if OmegaConf.select(base, "hydra.job.chdir") is True:
        for k in ("path", "val_path", "truth"):
            value = OmegaConf.select(base, f"data.{k}", default=None)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                raise ConfigError(
                    f"data.{k}={value} is relative, and hydra.job.chdir=true runs each job in "
                    "its results folder, where it would be looked up; allowed: an absolute "
                    f"path (data.{k}={Path(value).absolute()}), or hydra.job.chdir=false")
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    folder = Path(str(OmegaConf.select(base, key)))
    existing = check_output_dir(key, folder).resolve()
    other = in_use(folder)          # looked at first: nothing else matters then
    if other is not None:
        raise FolderInUse(in_use_message(f"{key}={folder}", folder.absolute(), *other))
    check_earlier(key, folder, base.get("output") or {}, multirun)
    launcher = base.hydra.get("launcher") or {}
    if multirun and "joblib" in str(launcher.get("_target_", "")):
        n = launcher.get("n_jobs")
        if isinstance(n, bool) or not isinstance(n, int) or n == 0:
            raise ConfigError(f"hydra.launcher.n_jobs={n} is not allowed: an integer >= 1 "
                              "(workers), or -1 for all cores (-2 all but one, ...)")
    return existing


def _check_subdir(subdir) -> None:
    """A sweep's job folders (``hydra.sweep.subdir``, unresolved) are each job's own and lie
    inside ``hydra.sweep.dir``: the text names a job (``${hydra.job.num}``,
    ``${hydra.job.id}`` or ``${hydra.job.override_dirname}``), is relative and has no ``..``
    (two jobs in one folder lose one's results; a job folder elsewhere escapes the sweep's
    lock and table)."""
    text = str(subdir)
    if not any(f"hydra.job.{k}" in text for k in ("num", "id", "override_dirname")):
        raise ConfigError(f"hydra.sweep.subdir={text} gives every job of the sweep the same "
                          "folder; allowed: a folder per job, e.g. hydra.sweep.subdir="
                          "'${hydra.job.num}' (default: "
                          "${fnsysid.job_dirname:${hydra.job.override_dirname}})")
    if Path(text).is_absolute() or ".." in Path(text).parts:
        raise ConfigError(f"hydra.sweep.subdir={text} puts job folders outside "
                          "hydra.sweep.dir; allowed: a relative path without '..'")
    import re

    for part in Path(text).parts:      # the text around the interpolations is already too long
        if len(os.fsencode(re.sub(r"\$\{[^}]*\}", "", part))) > NAME_MAX:
            raise ConfigError(f"hydra.sweep.subdir: a part of it is longer than {NAME_MAX} bytes "
                              f"({part[:40]}...); allowed: a path whose every part has at most "
                              f"{NAME_MAX} bytes")


def check_earlier(key: str, folder: Path, output, multirun: bool) -> None:
    """Refuse a results folder that holds an earlier run (or sweep) unless the ``output``
    settings say to replace it (``overwrite``) or to finish the sweep (``resume``), not both."""
    if output.get("resume") and output.get("overwrite"):
        raise ConfigError("output.resume=true and output.overwrite=true ask for opposites "
                          "(keep the finished jobs, remove them); allowed: one of the two")
    foreign = not_a_run(key, folder)
    if foreign:
        raise ConfigError(foreign)
    if multirun and output.get("resume") and not output.get("overwrite") and \
            not (Path(folder) / MULTIRUN).is_file() and \
            any((Path(folder) / name).exists() for name in SINGLE_RUN):
        raise ConfigError(f"{key}={folder} holds a single run, not a sweep (no {MULTIRUN}): "
                          "output.resume=true finishes a sweep in its own folder; choose a new "
                          "folder, or add output.overwrite=true (without output.resume) to "
                          "replace its results")
    if has_results(folder) and not output.get("overwrite") and \
            not (multirun and output.get("resume")):
        what = "an earlier sweep" if multirun else "an earlier run"
        raise ConfigError(f"{key}={folder} holds {what}: choose a new folder, or add "
                          "output.overwrite=true to replace its results"
                          + (" (output.resume=true to finish it)" if multirun else ""))


def check_output_dir(key: str, path: Path) -> Path:
    """The results folder must be (or become) a writable folder: one line naming the cause.
    Returns the deepest folder of ``path`` that exists (``path`` itself if it does).

    Writability is probed by creating (and removing) a temporary file, which also catches
    read-only file systems and runs as root.
    """
    try:
        too_long = [p for p in Path(path).parts if len(os.fsencode(p)) > NAME_MAX]
        if too_long:        # found before a missing parent is made on the way to it
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        return _check_output_dir(key, path)
    except ConfigError:
        raise
    except OSError as exc:      # a name too long, a loop of links, ...: before anything is made
        raise ConfigError(path_error(key, path, exc)) from None


#: the longest name of a file or folder (one part of a path) on Linux and macOS file systems
NAME_MAX = 255


def path_error(key: str, path, exc: OSError) -> str:
    """The one line for a path that the system refuses (``exc``) as the setting ``key``."""
    allowed = "a path whose every part has at most 255 bytes" \
        if exc.errno == errno.ENAMETOOLONG else "a path this system can use"
    return f"{key}={path}: {exc.strerror or exc}; {allowed}"


def _check_output_dir(key: str, path: Path) -> Path:
    import tempfile

    target = path
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            kind = "a device" if path.is_char_device() or path.is_block_device() else \
                "a file" if path.is_file() else "not a folder"
            raise ConfigError(f"{key}={path} is {kind}, not a folder for the results")
    else:
        target = path.parent
        while not target.exists():
            target = target.parent
        if not target.is_dir():
            raise ConfigError(f"{key}={path}: {target} is a file, so the folder cannot be made")
    try:
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as exc:
        where = "" if target == path else f": cannot make it inside {target}"
        raise ConfigError(f"{key}={path} is not writable{where} ({exc.strerror or exc})") \
            from exc
    return target


def _check_combinations(config_name: str, fixed: list, dims: dict, compose, base,
                        groups) -> int:
    """Compose every combination of group options once; apply plain values on a copy.

    Returns the largest disk space a job's result files need (bytes).

    ``base`` is the config composed with the first value of every sweep (with Hydra's node).
    """
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from fnsysid.app.build import build
    from fnsysid.app.resources import check_memory, estimate_disk_bytes
    from fnsysid.results.history import keep_per_client

    def is_group(key: str) -> bool:
        return key.lstrip("+~") in GROUPS or "/" in key

    swept = [k for k in dims if is_group(k)]
    values = [k for k in dims if not is_group(k) and not k.startswith("hydra")]
    checked = disk = 0
    seen = set()                       # data paths checked (once per sweep)
    read = set()                       # data files read (a sweep's, once per way of reading)
    for gcombo in itertools.product(*(dims[k] for k in swept)):
        ovr = fixed + [f"{k}={encode(v)}" for k, v in zip(swept, gcombo, strict=True)]
        ovr += [f"{k}={encode(dims[k][0])}" for k in values]
        if swept:
            try:
                base = compose(config_name, overrides=ovr)
            except (HydraException, OmegaConfBaseException) as exc:
                raise ConfigError(_not_in_option(exc, ovr, config_name, compose, groups)
                                  or one_line(exc)) from exc
        else:    # nothing to recompose: the run config is ``base`` without Hydra's node
            base = base.copy()
            with open_dict(base):
                base.pop("hydra", None)
        for vcombo in itertools.product(*(dims[k] for k in values)):
            cfg = base.copy()
            try:
                with open_dict(cfg):
                    for k, v in zip(values, vcombo, strict=True):
                        OmegaConf.update(cfg, k.lstrip("+"), v, force_add=k.startswith("+"))
            except OmegaConfBaseException as exc:
                raise ConfigError(one_line(exc)) from exc
            settings = check_run(cfg)
            paths = (settings.data.path, settings.data.val_path, settings.data.truth) \
                if settings.files else None
            if paths and paths not in seen:   # FIFOs, devices, unreadable folders: refused here
                from fnsysid.data.files import check_paths  # pandas: only with data=files

                data = settings.data
                if DATA_IN_MEMORY.get():
                    data = data.model_copy(update={"path": None})
                _check_path_names(data)
                check_paths(data)
                seen.add(paths)
            built = build(settings)
            if dims and settings.files and not DATA_IN_MEMORY.get():
                # a sweep: the files' contents read once per reading of them, before any job
                # starts (each job would refuse a bad file alike and leave its folder)
                d = settings.data
                key = (paths, *(str(getattr(d, k, None)) for k in (
                    "states", "inputs", "trajectory", "time", "ignore")))
                if key not in read:
                    from fnsysid.data.source import check_trajectory_files

                    check_trajectory_files(settings, built[0])
                    read.add(key)
            check_memory(settings, *built)
            disk = max(disk, estimate_disk_bytes(settings, keep_per_client(settings)))
            checked += 1
            if checked >= MAX_CHECKED:
                return disk
    return disk


def _check_path_names(data) -> None:
    """Each data path is one the system can look up (a part longer than 255 bytes, a loop of
    links: one line naming the setting; a missing file is left to the data checks)."""
    for key in ("path", "val_path", "truth"):
        value = getattr(data, key, None)
        if value is None:
            continue
        try:
            os.stat(value)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            raise ConfigError(path_error(f"data.{key}", value, exc)) from None
