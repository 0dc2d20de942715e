"""Python API for notebooks and scripts: the command line's runs as function calls.

>>> import fnsysid
>>> res = fnsysid.run({"system": "pendulum", "M": 5, "R": 10})        # doctest: +SKIP
>>> res.errors.tail(1)                                                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from .experiment import Result, execute, given_keys
from .output_files import write_outputs
from .run_folder import clear_results, has_results
from .trajectory_files import PUBLIC_COLUMNS, read_trajectories
from .validate import ConfigError


def as_overrides(overrides) -> list[str]:
    """Overrides as the command line's strings: a list of ``key=value`` or a mapping."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError("overrides must be a list of 'key=value' strings or a dict, not one "
                          "string")
    if isinstance(overrides, Mapping):
        from .cli import encode

        return [f"{k}={encode(v)}" for k, v in overrides.items()]
    return [str(o) for o in overrides]


def compose(overrides, config_dir=None):
    """The checked, composed run config of ``overrides`` and the chosen group options.

    Runs the command line's pre-run check (one-line :class:`ConfigError` for bad input);
    ``config_dir`` adds a folder of your own config groups, like ``--config-dir``.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from .cli import preflight
    from .options import CONF_DIR

    args = as_overrides(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except HydraException as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc
    sweeps = [o.input_line for o in parsed if o.is_sweep_override()]
    if sweeps:
        raise ConfigError(f"{sweeps[0]}: fnsysid.run runs one job; call it once per value "
                          "(sweeps are for the command line's -m)")
    extra = []
    if config_dir is not None:
        folder = Path(config_dir).resolve()
        if not folder.is_dir():
            raise ConfigError(f"config_dir={config_dir}: no such folder")
        extra = ["--config-dir", str(folder)]
        args = args + [f"hydra.searchpath=[file://{folder}]"]
    preflight(args + extra)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", overrides=args, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items()
               if not k.startswith("hydra/")}
    with_hydra = OmegaConf.to_container(cfg, resolve=False)
    with_hydra.pop("hydra")
    return OmegaConf.create(with_hydra), choices


def run(overrides=(), output_dir=None, config_dir=None) -> Result:
    """Run one experiment, as ``python run.py <overrides>`` does, and return its results.

    Parameters
    ----------
    overrides : list of ``"key=value"`` strings (exactly the command line's) or a dict
        ``{"system": "pendulum", "M": 5, "data.states": ["x1", "x2"]}``.
    output_dir : folder to write the run's files into (as the command line does); None
        writes nothing. Checked before the run: a file, a folder that cannot be written, or
        one holding an earlier run (unless ``output.overwrite=true``) is refused.
    config_dir : a folder of your own config groups (like ``--config-dir``).

    Returns
    -------
    :class:`~fnsysid.experiment.Result` with the DataFrames ``errors``, ``clients``,
    ``estimates``, ``theory`` and the ``summary`` dict (which names the chosen group options).

    Raises
    ------
    ConfigError
        With the command line's one-line message for a bad setting or bad data; nothing is
        written then.
    """
    cfg, choices = compose(overrides, config_dir)
    if output_dir is not None:
        check_output_folder(Path(output_dir), cfg)
    result = execute(cfg, choices, given_keys(as_overrides(overrides)))
    if output_dir is not None:
        if cfg.output.get("overwrite"):
            clear_results(Path(output_dir))
        write_outputs(Path(output_dir), cfg, result)
    return result


def check_output_folder(folder: Path, cfg) -> None:
    """``output_dir`` must be (or become) a writable folder without an earlier run's results
    (unless ``output.overwrite=true``), as the command line's results folder: checked before
    the run starts."""
    from .cli import check_output_dir

    check_output_dir("output_dir", folder)
    if has_results(folder) and not cfg.output.get("overwrite"):
        raise ConfigError(f"output_dir={folder} holds an earlier run: choose a new folder, or "
                          "add output.overwrite=true to replace its results")


def load_trajectories(path, states, inputs=()) -> pd.DataFrame:
    """Read and check trajectory files (the ``data=files`` layout) into one DataFrame.

    Columns ``repeat, client, trajectory, t, split``, the states and the inputs; raises
    :class:`~fnsysid.trajectory_files.DataError` (a :class:`ConfigError`) naming the file and
    row or column of the first problem.
    """
    df = read_trajectories(path, states, inputs)
    names = [c for c in df.columns if c not in PUBLIC_COLUMNS and not c.startswith("_")]
    return df[PUBLIC_COLUMNS + names].reset_index(drop=True)
