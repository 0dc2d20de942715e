"""tests/conftest.py::compose_cfg applies single-value overrides to a cached composition
instead of composing each list with Hydra; these cases guard that the shortcut gives
Hydra's own config (unresolved and resolved), so the tests built on it test what a run gets."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tests.conftest import CONF_DIR, _split, compose_cfg

CASES = [
    ("R=3",),
    ("system=pendulum", "M=7", "lr=0.02"),                    # a knob other keys interpolate
    ("strategy=fedprox", "strategy.mu=0.5", "system=synthetic"),
    ("N=[2,3,4]", "M=3", "system=synthetic"),                  # a list value
    ("data.val_N=0", "output.plot=true", "seed=11"),
    ("system=linear", "feature_map=polynomial", "sparsity=stlsq", "sparsity.threshold=auto"),
    ("personalize=auto", "output.ci_level=0.9", "eps=0.3"),
    ("system.disturbance.scale=[0.2,1,3]", "system=synthetic"),
]


def _hydra(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o))
def test_compose_cfg_is_hydras_composition(overrides):
    assert _split(overrides) is not None          # the shortcut is what is tested here
    ours, hydras = compose_cfg(*overrides), _hydra(overrides)
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydras)
    assert OmegaConf.to_container(ours, resolve=True) == \
        OmegaConf.to_container(hydras, resolve=True)
    assert OmegaConf.is_struct(ours) == OmegaConf.is_struct(hydras)
