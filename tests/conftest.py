"""Shared fixtures: compose configs from conf/ the way run.py does, without running Hydra."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from fnsysid.app.build import build
from fnsysid.config.checks import check_run
from fnsysid.config.groups import CONF_DIR


def compose_cfg(*overrides: str):
    """The composed run config for ``overrides`` (quiet, no plot unless asked)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])


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
