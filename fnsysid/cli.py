"""Command line: check the overrides, then hand over to Hydra, which calls ``task``.

Bad input is reported in one line (``fnsysid: error: ...``) with exit status 2 before any
output folder is written: group options, knob values and every combination of a sweep are
composed and checked up front.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .options import CONF_DIR, options
from .validate import KNOBS, ConfigError, check_batch_size, check_knob

GROUPS = ("data", "system", "feature_map", "optimizer", "strategy", "experiment")
TOP_LEVEL = set(KNOBS) | set(GROUPS) | {"data", "output", "progress", "hydra"}
#: Hydra flags followed by a value
_VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                "--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun"}
#: most sweep combinations composed and checked before a multirun starts
MAX_CHECKED = 256

log = logging.getLogger("fnsysid")


def _overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _VALUE_FLAGS:
            skip = True
            continue
        if not a.startswith("-") and "=" in a:
            out.append(a)
    return out


def _check_value(key: str, value) -> None:
    if key in GROUPS:
        allowed = options(key)
        if str(value) not in allowed and value is not None:
            raise ConfigError(f"{key}={value} is not an option; allowed: {', '.join(allowed)}")
    elif key in KNOBS:
        check_knob(key, value)
    elif key == "optimizer.batch_size":
        check_batch_size(value)


def _sweep_values(override) -> list:
    if override.is_sweep_override():
        return list(override.sweep_iterator())
    return [override.value()]


def preflight(argv: list[str]) -> None:
    """Raise :class:`ConfigError` for the first bad setting in ``argv`` (or in its sweeps)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = _overrides(argv)
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(args)
    except HydraException as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc
    dims = {}
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or o.package is not None:
            continue
        top = key.split(".")[0].split("/")[0]
        if top not in TOP_LEVEL and not o.is_add() and not o.is_force_add():
            raise ConfigError(f"unknown setting '{key}'; knobs: {', '.join(KNOBS)}; groups: "
                              f"{', '.join(GROUPS[:-1])} (see --help)")
        values = _sweep_values(o)
        for v in values:
            _check_value(key, v)
        dims[o.input_line.split("=", 1)[0]] = values

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            first = [f"{k}={_encode(v[0])}" for k, v in dims.items()]
            try:
                base = compose("config", overrides=first, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as exc:
                raise ConfigError(_first_line(exc)) from exc
            # sweeps stored in experiment files (hydra.sweeper.params); the command line wins
            for k, v in (base.hydra.sweeper.get("params") or {}).items():
                if k in dims:
                    continue
                o = parser.parse_overrides([f"{k}={v}"])[0]
                values = _sweep_values(o)
                for val in values:
                    _check_value(o.key_or_group, val)
                dims[k] = values
            _check_combinations(dims, compose)
    finally:
        GlobalHydra.instance().clear()


def _check_combinations(dims: dict, compose) -> None:
    """Compose every combination of group options once; apply plain values on a copy."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .build import build
    from .validate import check_run

    def is_group(key: str) -> bool:
        return key.lstrip("+~") in GROUPS or "/" in key

    groups = [k for k in dims if is_group(k)]
    values = [k for k in dims if not is_group(k) and not k.startswith("hydra")]
    checked = 0
    for gcombo in itertools.product(*(dims[k] for k in groups)):
        ovr = [f"{k}={_encode(v)}" for k, v in zip(groups, gcombo, strict=True)]
        ovr += [f"{k}={_encode(dims[k][0])}" for k in values]
        try:
            base = compose("config", overrides=ovr)
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(_first_line(exc)) from exc
        for vcombo in itertools.product(*(dims[k] for k in values)):
            cfg = base.copy()
            try:
                for k, v in zip(values, vcombo, strict=True):
                    OmegaConf.update(cfg, k.lstrip("+"), v, force_add=k.startswith("+"))
            except OmegaConfBaseException as exc:
                raise ConfigError(_first_line(exc)) from exc
            check_run(cfg)
            build(cfg)
            checked += 1
            if checked >= MAX_CHECKED:
                return


def _encode(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_encode(x) for x in v) + "]"
    return str(v)


def _first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(lines[:2]) if lines else type(exc).__name__


def _remove_outputs(job_dir: Path) -> None:
    """Remove a job folder that Hydra made for a run that was refused."""
    shutil.rmtree(job_dir, ignore_errors=True)
    parent = job_dir.parent
    if parent.exists() and {p.name for p in parent.iterdir()} <= {"multirun.yaml"}:
        shutil.rmtree(parent, ignore_errors=True)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def task(cfg: DictConfig) -> float | None:
    """One Hydra job: run the experiment into Hydra's output folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .experiment import run_experiment

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    try:
        summary = run_experiment(cfg, out)
    except ConfigError as exc:
        _remove_outputs(out)
        print(f"fnsysid: error: {exc}", file=sys.stderr)
        sys.exit(2)
    log.info("results: %s", out)
    if summary["status"] != "ok":
        log.error("run diverged at round %s: results up to round %s kept; try a smaller lr "
                  "than %g", summary["diverged_round"], summary["rounds_completed"], cfg.lr)
        if hc.mode == RunMode.RUN:
            sys.exit(3)
        return None
    if summary["final_e_max_mean"] is not None:
        log.info("final e_R at R=%d (max over clients; mean +- std over %d repeats): %.4f +- "
                 "%.4f | mean over clients: %.4f", cfg.R, summary["repeats"],
                 summary["final_e_max_mean"], summary["final_e_max_std"],
                 summary["final_e_mean_mean"])
    if summary["final_nrmse_1step_max"] is not None:
        log.info("final held-out NRMSE (max | mean over clients, mean over repeats): one-step "
                 "%.4f | %.4f, free run %.4f | %.4f", summary["final_nrmse_1step_max"],
                 summary["final_nrmse_1step_mean"], summary["final_nrmse_sim_max"],
                 summary["final_nrmse_sim_mean"])
    if summary["final_e_max_mean"] is None:
        return summary["final_nrmse_1step_max"]
    return summary["final_e_max_mean"]


def main() -> None:
    """Console entry point (``fnsysid`` or ``python run.py``)."""
    argv = sys.argv[1:]
    if not CONF_DIR.is_dir():
        print(f"fnsysid: error: config folder {CONF_DIR} not found; install from a checkout "
              "with `make install` (editable), which keeps conf/ beside the package",
              file=sys.stderr)
        sys.exit(2)
    if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c",
                     "--shell-completion", "-sc") for a in argv):
        try:
            preflight(argv)
        except ConfigError as exc:
            print(f"fnsysid: error: {exc}", file=sys.stderr)
            sys.exit(2)
    task()
