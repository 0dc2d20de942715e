"""Secure aggregation (Flower's SecAgg+) and Flower's central DP blocks on runtime=flower
(fnsysid/runtimes/flower_secure.py, docs/PRIVACY.md)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import run_experiment
from fnsysid.config.checks import ConfigError, check_run
from fnsysid.learning.privacy import FINAL_MODEL
from fnsysid.runtimes import check as runtime
from tests.conftest import compose_cfg, needs_flower

pytestmark = pytest.mark.flower

DOCS = Path(__file__).resolve().parent.parent / "docs" / "PRIVACY.md"

#: one repeat, three clients of different sizes (DP-FedAvg under Flower needs repeats=1)
DP = ["system=synthetic", "M=3", "R=3", "repeats=1", "eps=0.3", "N=[3,5,2]", "lr=2e-3",
      "output.plot=false", "privacy=central", "privacy.epsilon=null"]


def _docs_example() -> list[str]:
    """The overrides of docs/PRIVACY.md's SecAgg+ example."""
    line = next(x for x in DOCS.read_text().splitlines()
                if x.startswith("python run.py") and "runtime.secure_aggregation=true" in x)
    return shlex.split(line)[2:]


def _estimates(folder: Path) -> np.ndarray:
    return pd.read_csv(folder / "estimates.csv")["estimate"].to_numpy()


@needs_flower
def test_quantization_bound_holds_for_flowers_own_quantizer():
    """The bound 2 c / Q of SecAgg+'s mean, checked on Flower's quantize/dequantize as
    SecAggPlusWorkflow combines them (sum of n quantized replies, offset -(n - 1) c, over n)."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    from fnsysid.runtimes.flower_secure import quantization_bound

    c, Q, n = 2.0, 2 ** 10, 7                 # coarse: the errors are large enough to see
    bound = quantization_bound(c, Q)
    assert bound == 4.0 / 1024
    rng = np.random.default_rng(0)
    x = rng.uniform(-c, c, size=(n, 5000))
    total = sum(quantize([xi], c, Q)[0].astype(np.int64) for xi in x)
    mean = (dequantize([total], c, Q)[0] - (n - 1) * c) / n
    err = np.abs(mean - x.mean(axis=0))
    assert err.max() <= bound
    assert err.max() > 0.2 * bound            # the bound is not loose by orders


@needs_flower
def test_docs_secagg_example_equals_plain_flower_within_the_bound(tmp_path):
    from fnsysid.runtimes.flower_secure import quantization_bound

    example = _docs_example()
    plain = [o for o in example if o != "runtime.secure_aggregation=true"]
    assert len(plain) == len(example) - 1 and "R=1" in example
    a = run_experiment(compose_cfg(*plain), tmp_path / "plain")
    b = run_experiment(compose_cfg(*example), tmp_path / "secure")
    assert (a["status"], b["status"]) == ("ok", "ok")
    sa = check_run(compose_cfg(*example)).runtime.secagg
    bound = quantization_bound(sa.clipping_range, sa.quantization_range)
    assert bound == pytest.approx(2 * 16 / 2 ** 24)
    diff = np.abs(_estimates(tmp_path / "secure") - _estimates(tmp_path / "plain"))
    # one round: the server model differs by SecAgg+'s quantization only (plus round-off)
    assert diff.max() <= bound + 1e-12
    assert diff.max() > 0                     # the replies were quantized: SecAgg+ ran
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in ("plain", "secure"))
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=10 * bound)


@needs_flower
@pytest.mark.slow
def test_secagg_refuses_a_reply_outside_the_clipping_range(tmp_path):
    args = [*_docs_example(), "runtime.secagg.clipping_range=0.01"]
    summary = run_experiment(compose_cfg(*args), tmp_path)
    # round 0's scores came in; the first secure exchange stopped the run, naming the setting
    assert (summary["status"], summary["rounds_completed"]) == ("interrupted", 0)
    assert re.search(r"round 1: the SecAgg\+ train exchange gave no aggregate: node \d+: "
                     r"ValueError: runtime\.secagg\.clipping_range=0\.01: client \d's reply "
                     r"has an entry of size 0\.\d+", summary["error"]), summary["error"]


@needs_flower
@pytest.mark.parametrize("clip", ["1e6", "1e-3"])
def test_flower_dp_without_noise_equals_in_process(clip, tmp_path):
    """Zero noise: Flower's fixedclipping_mod and wrapper give DP-FedAvg's rounds to 1e-10,
    with a clip that never acts (1e6) and one that clips every change (1e-3)."""
    args = [*DP, "privacy.noise_multiplier=0", f"privacy.clip={clip}"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert (a["runtime"], b["runtime"], a["status"], b["status"]) == (
        "inprocess", "flower", "ok", "ok")
    np.testing.assert_allclose(_estimates(tmp_path / "b"), _estimates(tmp_path / "a"),
                               rtol=0, atol=1e-10)
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)
    assert a["privacy"]["clipped_fraction"] == (1.0 if clip == "1e-3" else 0.0)
    assert b["privacy"]["clipped_fraction"] is None           # the clients clip
    assert "fixedclipping_mod" in b["privacy"]["mechanism"]
    if clip == "1e-3":              # clipping acted: the rounds moved less than without it
        plain = run_experiment(compose_cfg(*DP[:8]), tmp_path / "plain")
        assert plain["status"] == "ok"
        assert np.abs(_estimates(tmp_path / "plain") - _estimates(tmp_path / "a")).max() > 1e-4


@needs_flower
@pytest.mark.slow
def test_flower_dp_with_noise_reports_the_in_process_epsilon(tmp_path):
    args = [*DP, "privacy.noise_multiplier=1.0", "privacy.clip=1e-3"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    run_experiment(compose_cfg(*DP, "privacy.noise_multiplier=0", "privacy.clip=1e-3",
                                      "runtime=flower"), tmp_path / "zero")
    pa, pb = a["privacy"], b["privacy"]
    assert pa["epsilon"] is not None and pb["epsilon"] == pa["epsilon"]
    for k in ("noise_multiplier", "delta", "rounds", "sampling_rate", "accountant"):
        assert pb[k] == pa[k]
    written = json.loads((tmp_path / "b" / "summary.json").read_text())["privacy"]
    assert written["epsilon"] == pa["epsilon"]
    # the noise the model takes every round, and its share of the final model, as in process
    assert pb["round_noise_sd"] == pytest.approx(pa["round_noise_sd"]) == pytest.approx(1e-3 / 3)
    assert pb["noise_share"] == pytest.approx(pa["noise_share"], rel=0.1)
    assert pb["noise_share_of"] == FINAL_MODEL
    # noise of std z C / M = 3.3e-4 per entry and round was added to the server model
    moved = np.abs(_estimates(tmp_path / "b") - _estimates(tmp_path / "zero")).max()
    assert 1e-5 < moved < 0.05


@pytest.mark.parametrize("setting, match", [
    ("strategy=scaffold", "runtime.secure_aggregation=true with strategy Scaffold"),
    ("strategy=fedavg strategy.weighting=samples", "strategy.weighting=samples"),
    ("strategy=fedavg strategy.fraction=0.5", "strategy.fraction=0.5"),
    ("M=1 N=3", "M=1: SecAgg\\+ needs at least 2 clients"),
    ("M=300 N=3", "wraps around"),
    ("personalize=finetune", "personalize=finetune"),
])
def test_secure_aggregation_refuses_what_flowers_workflow_cannot_carry(
        monkeypatch, tmp_path, setting, match):
    monkeypatch.setattr(runtime, "flower_installed", lambda: True)
    with pytest.raises(ConfigError, match=match):
        run_experiment(compose_cfg("system=synthetic", "M=3", "N=3", "runtime=flower",
                                   "runtime.secure_aggregation=true", *setting.split()),
                       tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("setting, match", [
    ("strategy=fednova", "privacy=central with runtime=flower with strategy FedNova"),
    ("strategy=oneshot", "query messages"),
    ("repeats=2", "repeats=2"),
    ("privacy=local", "privacy=local is not allowed with runtime=flower"),
])
def test_flower_dp_refuses_what_flowers_blocks_cannot_do(monkeypatch, tmp_path, setting,
                                                         match):
    monkeypatch.setattr(runtime, "flower_installed", lambda: True)
    args = [*DP, "privacy.noise_multiplier=1", "runtime=flower", *setting.split()]
    with pytest.raises(ConfigError, match=match):
        run_experiment(compose_cfg(*args), tmp_path)


def test_secagg_settings_are_typed():
    s = check_run(compose_cfg("runtime=flower")).runtime
    assert s.secure_aggregation is False
    assert (s.secagg.clipping_range, s.secagg.quantization_range) == (16.0, 2 ** 24)
    for bad in ("runtime.secagg.clipping_range=0", "runtime.secagg.quantization_range=1.5",
                "runtime.secagg.quantization_range=1", "runtime.secagg.num_shares=2",
                "runtime.secure_aggregation=maybe"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            check_run(compose_cfg("runtime=flower", bad))


@needs_flower
@pytest.mark.slow
def test_loopback_deployment_with_flower_dp_without_noise_equals_in_process(tmp_path):
    """The same ServerApp and ClientApp in a deployment (SuperLink and three SuperNodes on
    127.0.0.1, scripts/flower_deploy.py): Flower's clipping acts on every node (clip 1e-3
    clips every change) and the rounds equal the in-process ones to 1e-10."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    report = deploy.main(["--out", str(tmp_path), "--clients", "3", "system=synthetic", "R=2",
                          "repeats=1", "strategy=fedavg", "privacy=central",
                          "privacy.epsilon=null", "privacy.noise_multiplier=0",
                          "privacy.clip=1e-3"])
    assert report["max_abs_diff"] <= 1e-10
    flower = pd.read_csv(tmp_path / "flower" / "errors.csv")
    # clipped: the error falls by less than 1e-3 a round (unclipped it fell by 1e-2)
    assert 0 < flower["e_max"].iloc[0] - flower["e_max"].iloc[2] < 2e-3
