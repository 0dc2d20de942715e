"""Property: any set of overrides ends cleanly.

Random override sets are drawn from the knobs, the groups and the typed settings, with valid,
wrong-type, out-of-range and non-finite values, and run through the command line. Each must
end in one of three ways: exit 0 with a complete folder (``summary.json`` says ``ok``), exit 2
with exactly one line and nothing written, or exit 3 with a result marked ``diverged`` or
``growing``. A few examples run in ``make test``, in process; ``make test-slow`` runs many
more, each in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import cli_in_process  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: setting -> values to draw from (valid ones first and most often)
CHOICES = {
    "system": ["pendulum", "synthetic", "linear", "quadrotor", "nosuch"],
    "optimizer": ["gd", "sgd", "adam"],
    "strategy": ["fedavg", "fedprox", "scaffold", "oneshot", "local", "centralized", "nosuch"],
    "M": ["1", "3", "5", "0", "-2", "1.5", "'3'", "true"],
    "N": ["1", "2", "[1,2,3]", "0", "[]", "2.5"],
    "T": ["1", "3", "0", "x"],
    "K": ["1", "3", "0", "-1"],
    "R": ["1", "4", "0", "1e3"],
    "repeats": ["1", "2", "0"],
    "seed": ["0", "7", "-1", "abc"],
    "lr": ["0.01", "1e-4", "1", "10", "0", "-1", "inf", "nan", "'0.1'"],
    "eps": ["0", "0.1", "2", "-0.1", "inf", "nan"],
    "data.shared_noise": ["true", "false", "'false'", "no", "maybe", "0"],
    "output.per_client": ["auto", "true", "false", "yes", "1"],
    "output.plot": ["false", "true", "no"],
    "progress": ["false", "maybe"],
    "theory.delta": ["0.05", "0.5", "0", "1", "-1", "inf"],
    "system.init.scale": ["0", "0.5", "nan", "-inf"],
    "system.dt": ["0.01", "0", "-0.01", "inf"],
    "system.disturbance.scale": ["0.1", "0", "-1"],
    "strategy.mu": ["0.1", "-1", "inf"],
    "optimizer.batch_size": ["1", "5", "0", "1000"],
    "+foo": ["1"],
    "++bar": ["x"],
    "~seed": [None],
}


@st.composite
def override_sets(draw) -> list[str]:
    keys = draw(st.lists(st.sampled_from(sorted(CHOICES)), min_size=1, max_size=5,
                         unique=True))
    out = []
    for k in keys:
        v = draw(st.sampled_from(CHOICES[k]))
        out.append(k if v is None else f"{k}={v}")
    return out


def fresh(*args: str, cwd: str) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` in a fresh interpreter."""
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def check_outcome(args: list[str], command=fresh) -> int:
    """Run ``args`` (small sizes unless drawn) through ``command`` (a fresh interpreter, or
    :func:`tests.conftest.cli_in_process`) and assert one of the three clean endings."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        base = ["R=3", "M=3", "repeats=1", "progress=false", "output.plot=false"]
        res = command(*base, *args, f"hydra.run.dir={run}", cwd=tmp)
        text = res.stdout + res.stderr
        assert "Traceback" not in text, (args, text[-2000:])
        if res.returncode == 2:
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("fnsysid: error: "), (args, lines)
            assert sorted(p.name for p in Path(tmp).iterdir()) == [], args
        elif res.returncode == 0:
            summary = json.loads((run / "summary.json").read_text())
            assert summary["status"] == "ok", args
            errors = pd.read_csv(run / "errors.csv")
            assert errors["round"].max() == summary["R"] == summary["rounds_completed"]
            for name in ("config.yaml", "estimates.csv", "theory.csv"):
                assert (run / name).exists(), (args, name)
        elif res.returncode == 3:
            summary = json.loads((run / "summary.json").read_text())
            assert summary["status"] in ("diverged", "growing"), args
            if summary["status"] == "diverged":
                assert not (run / "error.png").exists()
                assert "diverged" in res.stdout, args
            else:                               # every round, far above the start
                assert summary["rounds_completed"] == summary["R"], args
                assert summary["growth"]["ratio"] > summary["growth"]["factor"], args
                assert "run growing" in res.stdout, args
        else:
            raise AssertionError(f"{args}: exit {res.returncode}: {text[-2000:]}")
        return res.returncode


_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@settings(max_examples=4, derandomize=True, **_COMMON)     # the same few examples every time
@given(override_sets())
def test_random_overrides_end_cleanly(args):
    """In process (the long test below runs each draw in a fresh interpreter)."""
    check_outcome(args, cli_in_process)


@pytest.mark.slow
@settings(max_examples=150, derandomize=False, database=None, **_COMMON)   # new draws each time
@given(override_sets())
def test_random_overrides_end_cleanly_long(args):
    check_outcome(args)


@pytest.mark.parametrize("args, code", [
    (["system=synthetic", "lr=0.5"], 3),
    (["data.shared_noise='false'", "M=2"], 2),
    (["system=linear", "strategy=scaffold"], 0),
])
@pytest.mark.parametrize("command", [cli_in_process,
                                     pytest.param(fresh, marks=pytest.mark.slow)])
def test_the_three_endings_are_recognised(args, code, command):
    """The checker itself: one input of each ending, so the property cannot pass vacuously
    (in process, and in a fresh interpreter as the long test runs it)."""
    assert check_outcome(args, command) == code
