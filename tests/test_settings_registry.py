"""Each setting declared once: the knobs' meanings come from the schema's descriptions (the
refusals, ``--help``, the reference page), the groups' tables from the classes' registry, and
a strategy of the user's own is one class (with its settings model) and one YAML."""

from __future__ import annotations

import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import fnsysid
from fnsysid.config import registry, schema
from fnsysid.config.checks import ConfigError

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
REFERENCE = runpy.run_path(str(ROOT / "scripts" / "settings_reference.py"))


def test_the_help_file_is_the_one_written_from_the_schema():
    """conf/hydra/help/fnsysid.yaml's knobs block is what --write-help writes (rerun
    ``python scripts/settings_reference.py --write-help`` after changing a description)."""
    assert (CONF / "hydra" / "help" / "fnsysid.yaml").read_text() == REFERENCE["help_yaml"]()


def test_a_knob_is_declared_once_and_its_meaning_read_from_its_description():
    knobs = schema.Knobs.model_fields
    for name in knobs:                      # Settings has the system's knobs, not a copy
        assert schema.Settings.model_fields[name] is not None
        assert schema.Settings.model_fields[name].description == knobs[name].description
    assert list(schema.KNOBS) == ["M", "N", "T", "eps", "K", "lr", "R", "repeats", "seed"]
    assert schema.TOP_LEVEL[:9] == tuple(schema.KNOBS)
    for name, meaning in schema.KNOBS.items():
        description = schema.Settings.model_fields[name].description
        assert description.startswith(meaning) and meaning
    with pytest.raises(ConfigError, match=r"^M=0 is not allowed: M \(number of clients\) "):
        schema.check_value("M", 0)
    page = REFERENCE["markdown"]()
    assert f"| {schema.Settings.model_fields['eps'].description} |" in page


def test_every_key_of_config_yaml_and_of_the_options_is_in_the_schema():
    """The YAML's keys (and so their comments) name settings the schema has."""
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    plain = {k: v for k, v in config.items() if k not in ("defaults", "hydra")}
    for key in REFERENCE["flatten"](plain):
        assert REFERENCE["field_of"](schema.Settings, key) is not None, key
    for group in registry.GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            node = yaml.safe_load(path.read_text()) or {}
            for parent in node.get("defaults", []):         # centralized_exact: centralized
                if isinstance(parent, str) and parent != "_self_":
                    node = {**yaml.safe_load((path.parent / f"{parent}.yaml").read_text()),
                            **node}
            model = REFERENCE["model_of"](group, node)
            assert model is not None, path
            for key in node:
                if key not in ("defaults", "_target_"):
                    assert key in model.model_fields, f"{path.name}: {key}"


def test_the_tables_are_the_registered_classes_of_the_options():
    """Every built-in option's class is registered with its model; the tables are read from
    the registry, which imports nothing but what defines the classes."""
    from fnsysid.dynamics import features, systems
    from fnsysid.learning import optim, strategies

    tables = {"system": schema.SYSTEMS, "feature_map": schema.FEATURE_MAPS,
              "optimizer": schema.OPTIMIZERS, "strategy": schema.STRATEGIES}
    assert tables == schema.tables()
    for group, table in tables.items():
        for path in (CONF / group).glob("*.yaml"):
            node = yaml.safe_load(path.read_text()) or {}
            if "_target_" in node:
                assert node["_target_"] in table, path
    assert schema.STRATEGIES["fnsysid.learning.strategies.FedProx"] is schema.FedProx
    assert schema.STRATEGIES["fnsysid.learning.strategies.FedLin"] is schema.Federated
    assert schema.SYSTEMS["fnsysid.dynamics.systems.Linear"] is schema.Dense
    for cls in (strategies.FedProx, optim.GD, features.Combined, systems.Pendulum):
        assert schema.tables()[cls.config_group][registry.target(cls)] is getattr(
            schema, cls.settings)                    # a built-in names its model by name
    # the bases name no model: a class that names none is the user's, checked by itself
    assert "fnsysid.learning.strategies.Federated" not in schema.STRATEGIES
    assert "fnsysid.dynamics.systems.DenseSystem" not in schema.SYSTEMS


@pytest.mark.slow
def test_help_shows_each_knob_with_its_description():
    res = subprocess.run([sys.executable, str(ROOT / "run.py"), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    for name in schema.KNOBS:
        assert " ".join(schema.Settings.model_fields[name].description.split()) in text, name
    assert "fnsysid --cfg job --resolve" in text and "lr: ${system.knobs.lr}" in text


@pytest.mark.slow
def test_cfg_job_resolve_shows_the_systems_knob_values():
    """--cfg job shows a knob left to the system as its interpolation; --resolve its value,
    the system YAML's (conf/system/synthetic.yaml's knobs)."""
    knobs = yaml.safe_load((CONF / "system" / "synthetic.yaml").read_text())["knobs"]
    args = [sys.executable, str(ROOT / "run.py"), "--cfg", "job", "system=synthetic"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)
    resolved = subprocess.run([*args, "--resolve"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
    assert plain.returncode == 0 and resolved.returncode == 0, plain.stderr + resolved.stderr
    assert yaml.safe_load(plain.stdout)["lr"] == "${system.knobs.lr}"
    shown = yaml.safe_load(resolved.stdout)
    assert {k: shown[k] for k in knobs} == knobs


# --- a strategy of the user's own: one class and one YAML -----------------------------------------

POOLED = '''
    """The pooled ridge solution, a strategy of the user's own (tests/test_settings_registry.py)."""

    import numpy as np
    from pydantic import ConfigDict

    from fnsysid.config import schema
    from fnsysid.learning import communication as comm
    from fnsysid.learning.strategies import Strategy


    class PooledRidgeSettings(schema.Strategy):
        model_config = ConfigDict(extra="forbid")
        ridge: schema.NonNegReal = 0.0


    class PooledRidge(Strategy):
        """argmin sum_i ||X_i theta - y_i||^2 + ridge ||theta||^2, solved once (flat)."""

        settings = PooledRidgeSettings

        def __init__(self, ridge: float = 0.0, **kwargs):
            super().__init__(**kwargs)
            self.ridge = float(ridge)

        def setup(self, theta0, data, model, optimizer, K, lr, seed):
            super().setup(theta0, data, model, optimizer, K, lr, seed)
            H, b = data.H.sum(axis=1), data.b.sum(axis=1)            # (S, p, p), (S, p)
            A = H + self.ridge * np.eye(H.shape[-1])
            self.server = np.linalg.solve(A, b[..., None])[..., 0]

        def round(self, r):
            pass

        def payload(self, p):
            return comm.Plan(start=comm.upload(("H", (p, p)), ("b", (p,))))
'''


@pytest.fixture
def pooled_ridge(tmp_path, monkeypatch):
    """The module on sys.path and its YAML in a config folder of its own."""
    name = f"pooled_ridge_{tmp_path.name}"                      # one module per test
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(POOLED))
    (tmp_path / "conf" / "strategy").mkdir(parents=True)
    (tmp_path / "conf" / "strategy" / "pooled.yaml").write_text(
        f"# The pooled ridge solution.\n_target_: {name}.PooledRidge\nridge: 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "conf", name
    sys.modules.pop(name, None)


@pytest.mark.slow
def test_a_users_strategy_is_one_class_and_one_yaml(pooled_ridge, tmp_path):
    """End to end through config_dir: its settings are checked by its own model, and with
    ridge 0 it is the pooled least squares, which centralized_exact computes (by pinv)."""
    conf, name = pooled_ridge
    base = {"system": "synthetic", "M": 4, "R": 2, "repeats": 2, "progress": False,
            "output.plot": False, "output.model_check": False}
    with pytest.raises(ConfigError) as info:
        fnsysid.run({**base, "strategy": "pooled", "strategy.ridge": -1.0}, config_dir=conf)
    assert str(info.value).startswith("strategy.ridge=-1.0 is not allowed: strategy.ridge "
                                      "must be a finite number >= 0")
    with pytest.raises(ConfigError, match="unknown setting 'strategy.rdge'"):
        fnsysid.run({**base, "strategy": "pooled", "+strategy.rdge": 1.0}, config_dir=conf)
    assert f"{name}.PooledRidge" in schema.STRATEGIES

    ours = fnsysid.run({**base, "strategy": "pooled"}, config_dir=conf)
    exact = fnsysid.run({**base, "strategy": "centralized_exact"})
    assert ours.summary["status"] == "ok" and ours.summary["strategy"] == "pooled"
    scale = np.abs(exact.estimate).max()
    np.testing.assert_allclose(ours.estimate, exact.estimate, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(ours.errors["e_max"], exact.errors["e_max"], rtol=1e-10)

    # ridge > 0: (H + ridge I)^-1 b of the pooled statistics, through H's eigenvectors
    ridge = fnsysid.run({**base, "strategy": "pooled", "strategy.ridge": 1e3},
                        config_dir=conf)
    data = ridge.dataset.train
    H, b = data.H.sum(axis=1), data.b.sum(axis=1)                # (S, p, p), (S, p)
    w, V = np.linalg.eigh(H)
    want = np.einsum("spq,sq->sp", V, np.einsum("sqp,sq->sp", V, b) / (w + 1e3))
    got = np.asarray(ridge.estimate).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    assert np.abs(got - np.asarray(ours.estimate).reshape(want.shape)).max() > 1e-6


def test_the_reference_script_refuses_an_unknown_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        REFERENCE["main"](["--write-hlep"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --write-hlep" in capsys.readouterr().err
