"""Shared fixtures: compose configs from conf/ the way run.py does, without running Hydra; run
the command line in this process."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fnsysid.app.build import build
from fnsysid.config.checks import check_run
from fnsysid.config.groups import CONF_DIR

#: ``make test-flower`` sets FNSYSID_TEST_FLOWER=1: a Flower test then runs (and fails where
#: the extra is missing) instead of being skipped; ``make test`` sets FNSYSID_TEST_FLOWER=0:
#: skipped even where the extra is installed (``make test-flower`` runs them)
FLOWER_REQUIRED = os.environ.get("FNSYSID_TEST_FLOWER") == "1"
FLOWER_REFUSED = os.environ.get("FNSYSID_TEST_FLOWER") == "0"


def _flower_installed() -> bool:
    from fnsysid.runtimes.check import flower_installed

    return flower_installed()


#: a test that needs the flower extra: skipped without it, except under ``make test-flower``
needs_flower = pytest.mark.skipif(
    FLOWER_REFUSED or (not FLOWER_REQUIRED and not _flower_installed()),
    reason="FNSYSID_TEST_FLOWER=0 (make test; make test-flower runs it)" if FLOWER_REFUSED
    else "Flower is not installed (extra: pip install -e '.[flower]' or make install-flower)")


try:
    import absl.logging
except ImportError:         # without the privacy extra (dp-accounting brings absl)
    pass
else:
    # absl makes a log handler on import, on the stderr of that moment, and closes that
    # stream when logging is configured again (Hydra's job logging) unless it is sys.stderr
    # then; a test's captured stderr is not: the handler writes to the process's own
    absl.logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


def compose_cfg(*overrides: str):
    """The composed run config for ``overrides`` (quiet, no plot unless asked).

    Hydra composes the config once per process for each choice of config groups (conf/ does
    not change during the tests); the overrides of single values (``R=3``, ``data.path=...``)
    are then applied to a deep copy as Hydra applies them after composing
    (``OmegaConf.update(cfg, key, value, merge=True)`` with the value parsed by Hydra's
    override parser). Any other override (a sweep, ``+``, ``~``, ``@``, a key the config does
    not have) is left to Hydra's composition of the whole list. Each call returns its own
    copy, which the test may change.
    """
    split = _split(overrides)
    if split is None:
        return copy.deepcopy(_composed(overrides))
    groups, values = split
    cfg = copy.deepcopy(_composed(groups))
    try:
        for key, value in values:
            OmegaConf.update(cfg, key, value, merge=True)
    except OmegaConfBaseException:     # e.g. an unknown key: Hydra's own error
        return copy.deepcopy(_composed(overrides))
    return cfg


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])


#: the config groups of conf/ (``system``, ``strategy``, ...): an override of one of them
#: chooses a file, which only Hydra's composition does
GROUP_NAMES = frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir())


def _split(overrides: tuple[str, ...]):
    """(group choices, [(key, value), ...] of single values), or None when an override is
    neither (Hydra then composes the whole list)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except (HydraException, OmegaConfBaseException):
        return None
    groups, values = [], []
    for line, o in zip(overrides, parsed, strict=True):
        if (o.type != OverrideType.CHANGE or o.package is not None or o.is_sweep_override()
                or "/" in o.key_or_group or o.key_or_group.split(".")[0] == "hydra"):
            return None
        if o.key_or_group in GROUP_NAMES:
            groups.append(line)
        else:
            values.append((o.key_or_group, o.value()))
    return tuple(groups), values


def engine(*overrides):
    """What ``fnsysid.run(overrides)`` returns, nothing written (``overrides``: strings, or
    one dict as fnsysid.run takes it), from :func:`compose_cfg`'s cached composition: the
    engine (:func:`fnsysid.app.experiment.execute`) called directly,
    for tests of what a run computes (about 0.04 s of CPU for a small run, against 0.23 s
    through ``fnsysid.run``'s own composition and pre-run checks, which test_api.py and the
    tests of refusals check). The summary names no group options (``choices={}``)."""
    from fnsysid.app.experiment import execute, given_keys
    from fnsysid.config.overrides import as_overrides

    args = as_overrides(overrides[0] if len(overrides) == 1 and isinstance(overrides[0], dict)
                        else list(overrides))
    return execute(compose_cfg(*args), choices={}, given=given_keys(args))


def make(*overrides: str):
    """(settings, model, optimizer, strategy) for ``overrides``."""
    settings = check_run(compose_cfg(*overrides))
    return (settings, *build(settings))


@pytest.fixture
def noiseless():
    """Overrides that switch the disturbance off (per system)."""
    def _for(system: str) -> list[str]:
        out = [f"system={system}", "system.disturbance.kind=zero"]
        if system == "pendulum":   # excite the angle, which the paper's x0 = 0 leaves at rest
            out.append("system.x0.scale=[0.5,0.5]")
        return out
    return _for


ROOT = Path(__file__).resolve().parent.parent


def cli_in_process(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The command line (``python run.py ARGS``) run in this process: ``fnsysid.app.cli.main``
    with ``sys.argv`` set, in ``cwd`` (default: the repository, as ``tests.test_cli.cli``).

    Returns what :func:`subprocess.run` would (``returncode``, ``stdout``, ``stderr``). For
    tests whose point is not the process (settings, messages, files written); the state the
    command sets for its own process (signal handlers, logging, environment, Hydra's job
    config) is put back after each call. Multiruns here take ``hydra/launcher=basic`` or
    ``hydra.launcher.n_jobs=1`` (joblib then runs the jobs in this process).
    """
    import fnsysid.app.callbacks as callbacks
    import fnsysid.app.cli as cli
    from fnsysid.runtimes import interrupt

    env = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    root = logging.getLogger()
    log_handlers, log_level = root.handlers[:], root.level
    raise_exceptions = logging.raiseExceptions
    hydra_cfg = HydraConfig.instance().cfg
    state, existed = dict(interrupt._state), cli._EXISTED
    here, argv = os.getcwd(), sys.argv
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        sys.argv = [str(ROOT / "run.py"), *args]
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, (int, type(None))):     # sys.exit("message")
            print(exc.code, file=err)
    finally:
        sys.argv = argv
        os.chdir(here)
        for s, h in handlers.items():
            signal.signal(s, h)
        for h in root.handlers:
            if h not in log_handlers:
                h.close()
        root.handlers[:] = log_handlers
        root.setLevel(log_level)
        logging.raiseExceptions = raise_exceptions
        HydraConfig.instance().cfg = hydra_cfg
        interrupt._state.clear()
        interrupt._state.update(state)
        cli._EXISTED = existed
        callbacks.SWEEP_PROBLEMS.clear()
        for k in set(os.environ) - set(env):
            del os.environ[k]
        os.environ.update(env)
    return subprocess.CompletedProcess(["run.py", *args], code, out.getvalue(), err.getvalue())


def ragged_client_folder(tmp_path: Path, system: str = "synthetic",
                         eps: float = 0.3) -> tuple[Path, list[str]]:
    """A folder of four client CSVs (``system``, T = 40, N = 3, 6, 2 and 4 trajectories)
    whose client ``robot1`` lost the last 7 samples of its last trajectory (a held-out
    trajectory shorter than the others, padded in a block), and the overrides that read it;
    every client has >= 20 held-out transitions, so the model check runs."""
    import pandas as pd

    import fnsysid
    from fnsysid.data.files import write_client_files

    sim = tmp_path / "sim"
    fnsysid.run([f"system={system}", "M=4", "N=[3,6,2,4]", "T=40", "repeats=1", f"eps={eps}",
                 "R=1", "output.trajectories=true", "output.plot=false"], sim)
    traj = pd.read_parquet(sim / "trajectories.parquet")
    last = traj.index[traj["client"] == 1][-7:]                  # robot1's last 7 samples
    folder = tmp_path / "clients"
    write_client_files(traj.drop(index=last), folder, "robot{client}")
    return folder, [f"system={system}", "data=files", f"data.path={folder}", "R=3",
                    "output.plot=false"]
