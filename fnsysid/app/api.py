"""Python API for notebooks and scripts: the command line's runs as function calls.

>>> import fnsysid
>>> res = fnsysid.run({"system": "pendulum", "M": 5, "R": 10})        # doctest: +SKIP
>>> res.errors.tail(1)                                                # doctest: +SKIP
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pandas as pd

from fnsysid.app.experiment import Result, execute, given_keys
from fnsysid.app.preflight import DATA_IN_MEMORY, check_output_dir, path_error, preflight
from fnsysid.config.checks import ConfigError, check_run
from fnsysid.config.errors import one_line
from fnsysid.config.overrides import as_overrides
from fnsysid.data.files import PUBLIC_COLUMNS, ColumnMap, read_trajectories
from fnsysid.results.files import write_outputs
from fnsysid.results.folder import (
    has_results,
    input_paths,
    lock_folder,
    not_a_run,
    settle_stash,
    stash_earlier,
)


def run(overrides=(), output_dir=None, config_dir=None) -> Result:
    """Run one experiment, as ``python run.py <overrides>`` does, and return its results.

    Parameters
    ----------
    overrides : sequence of str or dict, default=()
        ``"key=value"`` strings (exactly the command line's), or a dict
        ``{"system": "pendulum", "M": 5, "data.states": ["x1", "x2"]}`` (string keys; values
        str, int, float, bool, None or numpy scalars, and lists and dicts of them).
    output_dir : str, path or None, default=None
        A folder to write the run's files into (as the command line does); None writes
        nothing. Checked before the run: a file, a folder that cannot be written, one
        holding an earlier run (unless ``output.overwrite=true``, which removes it once the
        run is done) or one in use by another run (its lock, held by this call until it
        returns; a folder inside or around a folder in use is in use too) is refused.
    config_dir : str, path or None, default=None
        A folder of your own config groups (like ``--config-dir``).

    Returns
    -------
    Result
        The run's :class:`~fnsysid.app.experiment.Result`: the DataFrames ``errors``,
        ``clients``, ``estimates``, ``theory`` and the ``summary`` dict (which names the
        chosen group options).

    Raises
    ------
    ConfigError
        With the command line's one-line message for a bad setting or bad data; nothing is
        written then.
    """
    return run_job(overrides, output_dir, config_dir)


def run_job(overrides=(), output_dir=None, config_dir=None, tables=None) -> Result:
    """:func:`run`, with ``tables``: the trajectories of ``data=files`` held in memory as
    ``(name, DataFrame)`` pairs (``data.path`` then names them; see
    :func:`fnsysid.data.source.from_files`), checked as files are."""
    cfg, choices = compose(overrides, config_dir, data_in_memory=tables is not None)
    settings = check_run(cfg)
    if tables is not None and settings.runtime.name == "flower":
        raise ConfigError("runtime=flower: each Flower client reads its own trajectory file; "
                          "data held in memory cannot be sent to them; allowed: a folder of "
                          "one file per client (data.path)")
    if output_dir is None:
        return execute(settings, choices, given_keys(as_overrides(overrides)), tables)
    folder = Path(output_dir)
    check_output_dir("output_dir", folder)
    with lock_folder(folder, f"output_dir={folder}"):      # one run at a time in the folder
        check_output_folder(folder, settings)
        result = execute(settings, choices, given_keys(as_overrides(overrides)), tables)
        keep = input_paths(settings.data)
        stashed = settings.output.overwrite and stash_earlier(folder, keep)
        try:
            write_outputs(folder, settings, result)
        finally:            # the earlier run goes only once the new summary is written
            if stashed:
                settle_stash(folder, keep)
    return result


def check_output_folder(folder: Path, settings) -> None:
    """``output_dir`` must hold no earlier run's results (unless ``output.overwrite=true``),
    as the command line's results folder: checked before the run starts, under the folder's
    lock (:func:`~fnsysid.results.folder.lock_folder`; a folder another run holds is
    refused)."""
    foreign = not_a_run("output_dir", folder)
    if foreign:
        raise ConfigError(foreign)
    if has_results(folder) and not settings.output.overwrite:
        raise ConfigError(f"output_dir={folder} holds an earlier run: choose a new folder, or "
                          "add output.overwrite=true to replace its results")


def compose(overrides, config_dir=None, data_in_memory: bool = False):
    """The checked, composed run config of ``overrides`` (without Hydra's node) and the
    chosen group options.

    Runs the command line's pre-run check (one-line :class:`ConfigError` for bad input);
    ``config_dir`` adds a folder of your own config groups, like ``--config-dir``;
    ``data_in_memory``: ``data.path`` names trajectories held in memory, not a file.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    args = as_overrides(overrides)
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(args)
    except HydraException as exc:
        for arg in args:                         # the first that is not key=value, named
            try:
                parser.parse_overrides([arg])
            except HydraException as bad:
                why = ("the Python API runs one job: -m and other flags are the command "
                       "line's" if arg.startswith("-") else
                       "no spaces around the key or the =" if " " in arg.split("=")[0]
                       else one_line(bad).split(";")[0])
                raise ConfigError(f"{arg!r} is not a setting ({why}); allowed: key=value "
                                  "strings, e.g. 'M=20'") from exc
        raise ConfigError(one_line(exc)) from exc
    hydra_dirs = [o.input_line for o in parsed
                  if o.key_or_group in ("hydra.run.dir", "hydra.sweep.dir")]
    if hydra_dirs:           # fnsysid.run writes nothing unless given output_dir
        raise ConfigError(f"{hydra_dirs[0]}: the Python API does not take Hydra's folders; "
                          "allowed: output_dir (fnsysid.run, FederatedSysID) to write the "
                          "results")
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(f"{sweeps[0]}: the Python API (fnsysid.run, FederatedSysID) runs "
                          "one job; call it once per value (sweeps are for the command "
                          "line's -m)")
    extra = []
    if config_dir is not None:
        try:
            folder = Path(config_dir).resolve()
            folder.stat()
        except (FileNotFoundError, NotADirectoryError):
            pass
        except (OSError, RuntimeError) as exc:
            if not isinstance(exc, OSError):        # a loop of links (Path.resolve)
                exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            raise ConfigError(path_error("config_dir", config_dir, exc)) from None
        if not folder.is_dir():
            raise ConfigError(f"config_dir={config_dir}: no such folder")
        extra = ["--config-dir", str(folder)]
    token = DATA_IN_MEMORY.set(data_in_memory)
    try:
        _, cfg = preflight(args + extra, folders=False)  # output_dir is checked by the caller
    finally:
        DATA_IN_MEMORY.reset(token)
    given = {o.key_or_group for o in parsed}
    swept = [k for k in (cfg.hydra.get("sweeper", {}).get("params") or {}) if k not in given]
    if swept:                # an experiment's sweep: one job at a value outside it, unsaid
        raise ConfigError(
            f"{swept[0]}: the settings sweep it (hydra.sweeper.params: "
            f"{swept[0]}={cfg.hydra.sweeper.params[swept[0]]}, an experiment's sweep) and "
            f"the Python API (fnsysid.run, FederatedSysID) runs one job; allowed: a value for "
            f"each swept setting "
            f"({', '.join(swept)}), or the sweep from the command line (python run.py "
            "experiment=... runs every job)")
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items()
               if not k.startswith("hydra/")}
    run_config = OmegaConf.to_container(cfg, resolve=False)
    run_config.pop("hydra")
    return OmegaConf.create(run_config), choices


def load_trajectories(path, states, inputs=(), *, trajectory: str = "trajectory",
                      time: str = "t", ignore=(), missing: str = "refuse") -> pd.DataFrame:
    """Read and check trajectory files (the ``data=files`` layout) into one DataFrame.

    Parameters
    ----------
    path : str or path
        A folder of one file per client, or one file with a ``client`` column
        (``data.path``).
    states : str or list of str
        The state columns (``data.states``).
    inputs : str or list of str, default=()
        The input columns (``data.inputs``).
    trajectory : str, default="trajectory"
        The column of the trajectory ids (``data.trajectory``).
    time : str, default="t"
        The column of the times (``data.time``).
    ignore : str or list of str, default=()
        Columns not used (``data.ignore``); any other column that is not a state, an
        input, ``client``, ``repeat`` or ``split`` is refused.
    missing : {"refuse", "split"}, default="refuse"
        A row with an empty time, state or input (``data.missing``): refused, or left out
        with its trajectory split there into parts ``<id>#1``, ``<id>#2``, ...

    Returns
    -------
    DataFrame
        Columns ``repeat, client, trajectory, t, split`` (the mapped columns under these
        names; ``split`` only when the files have it, so that fitting the DataFrame holds out
        ``data.holdout`` of each client's trajectories as fitting the files does), the states
        and the inputs (``repeat`` the files' labels, 0 without the column).

    Raises
    ------
    DataError
        (a :class:`ConfigError`) naming the file and row or column of the first problem.
    """
    for name, value in (("trajectory", trajectory), ("time", time)):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name}={value!r} is not allowed; allowed: a column name (str)")
    if missing not in ("refuse", "split"):
        raise ConfigError(f"missing={missing!r} is not allowed; allowed: 'refuse', 'split'")
    ignore = [ignore] if isinstance(ignore, str) else list(ignore or ())
    if not all(isinstance(c, str) for c in ignore):
        raise ConfigError(f"ignore={ignore!r} is not allowed; allowed: a column name or a list "
                          "of column names (str)")
    df = read_trajectories(path, states, inputs,
                           columns=ColumnMap(trajectory, time, tuple(ignore), missing),
                           every_ignored=True)
    names = [c for c in df.columns if c not in PUBLIC_COLUMNS and not c.startswith("_")]
    public = [c for c in PUBLIC_COLUMNS if c != "split" or df.attrs.get("split_column")]
    out = df[public + names].reset_index(drop=True)
    out["repeat"] = out["repeat"].map(dict(enumerate(df.attrs["repeats"])))
    return out
