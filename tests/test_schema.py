"""The typed config schema and the pre-run check: wrong types, ranges, unknown keys, Hydra flags.

Most cases call :func:`fnsysid.app.preflight.preflight` in-process (what ``run.py`` runs before
Hydra); a few go through the command line end to end.
"""

from __future__ import annotations

import functools
import json
import math

import pytest

from fnsysid.app.experiment import run_experiment
from fnsysid.app.preflight import preflight
from fnsysid.config.checks import ConfigError
from fnsysid.config.errors import show
from fnsysid.config.groups import options
from fnsysid.config.messages import allowed
from fnsysid.config.schema import TOP_LEVEL, check_value
from tests.conftest import cli_in_process, compose_cfg
from tests.test_cli import cli

REFUSED = [
    # strings, numbers and other types given for booleans
    (["data.shared_noise='false'"], "data.shared_noise='false' is not allowed", "true or false"),
    (["data.shared_noise=no"], "data.shared_noise=no", "true or false"),
    (["data.shared_noise=maybe"], "data.shared_noise=maybe", "true or false"),
    (["data.shared_noise=0"], "data.shared_noise=0", "true or false"),
    (["output.plot=no"], "output.plot=no", "true or false"),
    (["progress=maybe"], "progress=maybe", "true or false"),
    (["output.per_client=yes"], "output.per_client=yes", "auto, true, false"),
    (["output.per_client='true'"], "output.per_client='true'", "auto, true, false"),
    # wrong types for numbers
    (["M=1.5"], "M=1.5", "an integer >= 1"),
    (["M='3'"], "M='3'", "an integer >= 1"),
    (["lr='0.1'"], "lr='0.1'", "a finite number > 0"),
    (["seed=-1"], "seed=-1", "an integer >= 0"),
    # non-finite and out-of-range physical constants and settings
    (["system.dt=0"], "system.dt=0", "a finite number > 0"),
    (["system.dt=-0.01"], "system.dt=-0.01", "a finite number > 0"),
    (["system.m=inf"], "system.m=inf", "a finite number > 0"),
    (["system.l=-1"], "system.l=-1", "> 0"),
    (["system.gain=nan"], "system.gain=nan", ">= 0"),
    (["system.disturbance.scale=-1"], "system.disturbance.scale=-1", ">= 0"),
    (["system.x0.scale=[0.5,inf]"], "system.x0.scale=[0.5,inf]", "finite"),
    (["system=quadrotor", "system.Ixx=-1"], "system.Ixx=-1", "> 0"),
    (["system=quadrotor", "system.controller.kp_z=-1"], "system.controller.kp_z=-1", ">= 0"),
    (["system.init.scale=nan"], "system.init.scale=nan", "a finite number"),
    (["system.init.reference=nosuch"], "system.init.reference=nosuch", "nominal, client0"),
    (["strategy=fedprox", "strategy.mu=-1"], "strategy.mu=-1", ">= 0"),
    (["strategy=fedprox", "strategy.mu=inf"], "strategy.mu=inf", ">= 0"),
    (["eps=inf"], "eps=inf", "a finite number >= 0"),
    (["lr=inf"], "lr=inf", "a finite number > 0"),
    (["theory.delta=0"], "theory.delta=0", "(0, 1)"),
    (["++theory.delta=-1"], "theory.delta=-1", "(0, 1)"),
    (["theory.delta=1"], "theory.delta=1", "(0, 1)"),
    (["optimizer.schedule=fast"], "optimizer.schedule=fast", "constant, inverse_k"),
    (["system=synthetic", "feature_map=polynomial", "feature_map.degree=0"],
     "feature_map.degree=0", "an integer >= 1"),
    # unknown keys, whatever the prefix
    (["+foo=1"], "unknown setting 'foo'", "M, N, T"),
    (["++foo=1"], "unknown setting 'foo'", "M, N, T"),
    (["+system.foo=1"], "unknown setting 'system.foo'", "system has:"),
    (["++data.foo=1"], "unknown setting 'data.foo'", "data has: source, shared_noise"),
    # removed keys
    (["~M"], "setting 'M' is missing", "an integer >= 1"),
    (["~seed"], "setting 'seed' is missing", "an integer >= 0"),
    (["~system"], "setting 'system' is missing", "a system option"),
    (["~data.shared_noise"], "setting 'data.shared_noise' is missing", "true or false"),
    # Hydra usage: sweeps without -m, interval sweeps, flags, empty arguments, folders
    (["M=1,2"], "M=1,2 is a sweep: add -m", "M=[...]"),
    (["-m", "lr=interval(0,1)"], "interval sweep", "lr=0.1,0.5"),
    (["-m", "M=1,2", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0", "-1 for all"),
    (["--config-name", "nosuch"], "--config-name nosuch: no such primary config", "config"),
    ([""], "argument '' is not a setting", "key=value"),
    (["--foo"], "unknown option '--foo'", "--help"),
    (["hydra.run.dir="], "hydra.run.dir is empty", "hydra.run.dir=outputs/myrun"),
    (["-m", "M=1,2", "hydra.sweep.dir="], "hydra.sweep.dir is empty", "outputs/myrun"),
    # a system's default of a knob is named as the system's, not as the knob
    (["system.knobs.R=0"], "system.knobs.R=0 is not allowed", "an integer >= 1"),
    # a wrong item of a list of numbers names the whole setting and its value
    (["system=synthetic", "system.A0=[[1,abc]]"], "system.A0=[[1,abc]] is not allowed: "
     "system.A0 must be", "each a finite number"),
    # 0 and 1 are not false and true; a section that may be absent is not null
    (["output.per_client=1"], "output.per_client=1 is not allowed", "auto, true, false"),
    (["system.solver.scale_features=0"], "system.solver.scale_features=0 is not allowed",
     "none, diagonal, zscore, whiten, true, false"),
    (["system.disturbance=null"], "system.disturbance=null is not allowed", "group of settings"),
    (["system=quadrotor", "system.controller=null"], "system.controller=null", "kp_z"),
    # the key that chooses a group's model, and a group given as a plain value
    (["data.source=nosuch"], "data.source=nosuch is not allowed", "allowed: simulated, files"),
    (["~data.source"], "data.source=null is not allowed", "allowed: simulated, files"),
    (["runtime.name=x"], "runtime.name=x is not allowed", "allowed: inprocess, flower"),
    # a sweep value checked like a single one
    (["-m", "data.shared_noise=true,maybe"], "data.shared_noise=maybe", "true or false"),
]


#: the cases that exercise the whole pre-run check (Hydra flags, sweeps, composition);
#: the others apply their override to a cached composed config and run the same check
THROUGH_PREFLIGHT = ("-m", "--config-name", "--foo", "M=1,2", "hydra.run.dir=", "~system", "+foo=1",
                     "data.shared_noise='false'", "system=quadrotor")


@functools.cache
def _composed(*groups: str):
    return compose_cfg(*groups)


def _check_overrides(args: list[str]) -> None:
    """The schema check of ``args`` applied to a cached config (group overrides composed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    from fnsysid.config.checks import check_run

    groups = tuple(a for a in args if a.split("=")[0] in ("system", "strategy", "feature_map"))
    cfg = _composed(*groups).copy()
    for o in OverridesParser.create().parse_overrides([a for a in args if a not in groups]):
        with open_dict(cfg):
            if o.is_delete():
                parent, _, leaf = o.key_or_group.rpartition(".")
                (OmegaConf.select(cfg, parent) if parent else cfg).pop(leaf)
            else:
                OmegaConf.update(cfg, o.key_or_group, o.value(), force_add=True)
    check_run(cfg)


@pytest.mark.parametrize("args, names, allowed", REFUSED)
def test_bad_setting_refused_in_one_line_naming_key_and_allowed_values(args, names, allowed):
    full = any(a.startswith(THROUGH_PREFLIGHT) if a else True for a in args)
    with pytest.raises(ConfigError) as info:
        preflight(args) if full else _check_overrides(args)
    msg = str(info.value)
    assert "\n" not in msg
    assert names in msg and allowed in msg


ACCEPTED = [
    ["theory.delta=0.1"],
    ["data.shared_noise=true"],
    ["output.per_client=false", "output.plot=false", "progress=false"],
    ["hydra.run.dir='q/M=5'"],
    ["hydra.run.dir='q/a,b'"],
    ["-m", "M=1,2", "hydra/launcher=basic"],
    ["-m", "M=1,2", "hydra.launcher.n_jobs=1"],
    ["R=3", "-m", "M=1,2"],                        # flags after overrides
    ["system.x0.scale=[0.5,0.5]", "lr=1"],         # an integer for a float
    ["+feature_map._target_=fnsysid.dynamics.features.Identity", "system=linear",
     "+feature_map.bias=true"],                    # a library given by class path
    ["+system.x0.clip=inf", "system.x0.kind=truncnormal"],
    ["experiment=pendulum_gd_M"],
    ["-m", 'strategy.weighting="uniform",samples'],      # a quoted item of a sweep
]


@pytest.mark.parametrize("args", ACCEPTED)
def test_valid_settings_pass_the_preflight(args):
    preflight(args)


def test_the_job_checks_the_composed_config_again(tmp_path):
    """A wrong type that reached a job (e.g. through the API) is refused before any file."""
    cfg = compose_cfg("system=pendulum", "M=2", "R=2", "data.shared_noise='false'")
    with pytest.raises(ConfigError, match="data.shared_noise='false'"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_composed_option_passes_the_schema():
    """The schema covers every option shipped in conf/ (nothing valid is refused). In make
    test, test_cli.py::test_every_group_option_composes_and_instantiates checks the same
    compositions (build checks each against the schema first)."""
    from fnsysid.config.checks import check_run

    fits = {"fourier": "synthetic", "polynomial": "linear", "affine": "linear",
            "combined": "synthetic"}
    # (every experiment is checked by test_experiments.py)
    for group in ("system", "feature_map", "optimizer", "strategy"):
        for option in options(group):
            extra = [f"system={fits[option]}"] if group == "feature_map" and option in fits \
                else []
            check_run(compose_cfg(f"{group}={option}", *extra))


def test_allowed_values_are_read_from_the_schema_and_shown_as_typed():
    from typing import Annotated, Literal

    from pydantic import Field

    assert allowed(bool) == "true or false"
    assert allowed(Annotated[int, Field(ge=1)]) == "an integer >= 1"
    assert allowed(Annotated[float, Field(gt=0, lt=1)]) == "a finite number in (0, 1)"
    assert allowed(Annotated[float, Field(ge=0, lt=1)]) == "a finite number in [0, 1)"
    assert allowed(Literal["sum", "mean"]) == "one of sum, mean"
    assert allowed(list[Annotated[int, Field(ge=0)]]) == "a list of values, each an integer >= 0"
    check_value("output.plot", True)
    check_value("system.dt", -1)        # inside a group: checked on the whole node
    check_value("nosuch", 1)
    with pytest.raises(ConfigError, match="data.shared_noise=1 is not allowed: "
                                          "data.shared_noise must be true or false"):
        check_value("data.shared_noise", 1)
    assert show("false") == "'false'" and show("3") == "'3'" and show("abc") == "abc"
    assert show([1, True, None]) == "[1,true,null]"
    assert set(TOP_LEVEL) >= {"M", "data", "theory", "output", "progress", "system"}


def test_unbounded_growth_is_divergence_not_ok(tmp_path):
    """pendulum lr=10 stays finite for 50 rounds (e_50 ~ 1e50) but diverges: rule in README."""
    cfg = compose_cfg("system=pendulum", "lr=10", "M=3", "repeats=2", "output.plot=true")
    summary = run_experiment(cfg, tmp_path)
    assert summary["status"] == "diverged"
    assert 1 <= summary["diverged_round"] <= 5
    assert not (tmp_path / "error.png").exists()
    # a converging run with the same settings is ok
    ok = run_experiment(compose_cfg("system=pendulum", "lr=0.5", "M=3", "repeats=2",
                                    "output.plot=false"), tmp_path / "ok")
    assert ok["status"] == "ok" and ok["final_e_max_mean"] < 0.01


def test_summary_is_strict_json_with_null_and_reason(tmp_path):
    """One sample per client makes Theorem 1's constants undefined: null, with the reason."""
    cfg = compose_cfg("system=pendulum", "strategy=fedavg", "M=1", "N=1", "T=1", "R=1",
                      "repeats=1", "output.plot=false")
    run_experiment(cfg, tmp_path)
    text = (tmp_path / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert summary["theorem1"]["noise_term"] is None
    assert "(not a finite number" in summary["null_values"]["theorem1.noise_term"]
    assert all(v is None or math.isfinite(v) for v in summary["theorem1"].values())


@pytest.mark.slow
@pytest.mark.parametrize("run", [cli_in_process, pytest.param(cli, marks=pytest.mark.slow)],
                         ids=["in_process", "fresh_interpreter"])
def test_sweep_with_a_diverged_job_names_it_and_exits_3(tmp_path, run):
    """The exit status of a sweep, in this process; through a fresh interpreter (``python
    run.py -m``) too in make test-slow. (No plots: nothing here reads them, and a job's plots
    are checked in test_cli.py and test_api.py.)"""
    res = run("-m", "system=pendulum", "lr=10,0.01", "M=2", "R=20", "repeats=1",
              "output.plot=false", "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path}")
    assert res.returncode == 3, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "diverged: " in lines[0] and "lr=10" in lines[0]
    assert "lr=0.01" not in lines[0]
    statuses = {p.parent.name: json.loads(p.read_text())["status"]
                for p in tmp_path.glob("*/summary.json")}
    assert sorted(statuses.values()) == ["diverged", "ok"]


@pytest.mark.parametrize("run", [cli_in_process, pytest.param(cli, marks=pytest.mark.slow)],
                         ids=["in_process", "fresh_interpreter"])
@pytest.mark.parametrize("args, message", [
    (["data.shared_noise='false'"], "data.shared_noise='false' is not allowed"),
    (["-m", "M=1,2", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0"),
    (["~system"], "setting 'system' is missing"),
])
def test_command_line_refusals_are_one_line_exit_2_nothing_written(tmp_path, run, args,
                                                                   message):
    """In this process; through ``python run.py`` too in make test-slow (make test runs
    one refusal through a fresh interpreter in test_cli.py)."""
    res = run(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == f"fnsysid: error: {res.stderr.strip()[16:]}"
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    assert list(tmp_path.iterdir()) == []


# --- resources: memory, disk, folders -----------------------------------------------------------

@pytest.mark.parametrize("args", [["M=100000000000000000000"], ["M=100000000", "N=1000"],
                                  ["N=1000000000"], ["T=1000000000"], ["repeats=100000000"]])
def test_huge_runs_refused_with_the_estimate_and_the_memory_available(args):
    with pytest.raises(ConfigError) as info:
        preflight(args)
    msg = str(info.value)
    assert msg.startswith("this run needs about ") and " is available (" in msg


def test_available_memory_is_the_smallest_of_psutil_the_cgroup_and_rlimit_as(monkeypatch):
    import resource
    from pathlib import Path
    from types import SimpleNamespace

    import psutil

    from fnsysid.app.resources import available_bytes

    cgroup = Path("/sys/fs/cgroup/memory.max")
    limit = cgroup.read_text().strip() if cgroup.exists() else "max"
    cap = int(limit) if limit.isdigit() else 2**62
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=12345))
    assert available_bytes() == 12345
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**62))
    assert available_bytes() <= cap
    getrlimit = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (
        (3 * 2**20, resource.RLIM_INFINITY) if which == resource.RLIMIT_AS else getrlimit(which)))
    assert available_bytes() == 3 * 2**20


@pytest.mark.slow
def test_memory_estimate_grows_with_clients_and_is_checked_against_the_limit(monkeypatch):
    from fnsysid.app.build import build
    from fnsysid.app.resources import estimate_bytes

    def est(*ov):
        cfg = compose_cfg("system=pendulum", *ov)
        model, opt, _ = build(cfg)
        return estimate_bytes(cfg, model, opt, False)

    gd1, gd2 = est("M=100000", "repeats=1"), est("M=200000", "repeats=1")
    per_client = (gd2 - gd1) / 100000
    assert 500 < per_client < 3000               # measured: 0.86 KB per client (README)
    sgd = (est("M=200000", "repeats=1", "optimizer=sgd")
           - est("M=100000", "repeats=1", "optimizer=sgd")) / 100000
    assert sgd > per_client + 8 * 50 * 3         # + N T (n_phi + n_y + 1) samples
    # twice the repeats costs what twice the clients costs: memory grows with repeats x M
    assert est("M=100000", "repeats=2") - gd1 == pytest.approx(gd2 - gd1, rel=1e-3)
    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", str(gd1 - 1))
    with pytest.raises(ConfigError, match="needs about .* but .* is available"):
        preflight(["M=100000", "repeats=1"])
    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", str(gd1 + 1))
    preflight(["M=100000", "repeats=1"])


@pytest.mark.slow
def test_memory_estimate_counts_per_client_maps_only_for_strategies_that_keep_them():
    """centralized_exact keeps each client's Gram and no per-client maps: its estimate is
    2 p^2 values a client and repeat (float64, doubled for temporaries) below fedavg's, and
    M = 10^6 with two repeats of the synthetic system (measured about 5 GB) is not refused
    for 25 GiB."""
    from fnsysid.app.build import build
    from fnsysid.app.resources import estimate_bytes

    def est(strategy, M=1000000, S=2):
        cfg = compose_cfg("system=synthetic", f"strategy={strategy}", f"M={M}",
                          f"repeats={S}", "data.val_N=0")
        model, opt, strat = build(cfg)
        return estimate_bytes(cfg, model, opt, False, strat), model.p

    fed, p = est("fedavg")
    exact, _ = est("centralized_exact")
    assert p == 15
    assert fed - exact == 2 * 8 * 2 * p * p * 2 * 1000000
    assert exact < 14 * 2**30 < fed
    assert est("oneshot")[0] == fed                  # its own fits' factors: counted as maps


@pytest.mark.parametrize("where, message", [
    ("/dev/null", "is a device, not a folder"),
    ("{tmp}/afile", "is a file, not a folder"),
    ("{tmp}/afile/sub", "afile is a file, so the folder cannot be made"),
    ("/proc/fnsysid-test", "is not writable"),
])
def test_results_folder_that_cannot_be_written_is_refused(tmp_path, where, message):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=message):
        preflight([f"hydra.run.dir={where.format(tmp=tmp_path)}", "R=2"])


def test_atomic_write_failure_names_path_and_cause_and_leaves_no_file(tmp_path):
    import errno

    from fnsysid.results.atomic import WriteError, write_atomic, write_json, write_text

    write_text(tmp_path / "a.csv", "old\n")

    def full(tmp):
        open(tmp, "w").write("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"cannot write .*a\.csv: No space left on device"):
        write_atomic(tmp_path / "a.csv", full)
    assert (tmp_path / "a.csv").read_text() == "old\n"          # the old file intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv"]   # no temporary left
    write_json(tmp_path / "s.json", {"x": float("inf"), "y": [1.0, float("nan")]})
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["x"] is None and data["y"] == [1.0, None]
    assert set(data["null_values"]) == {"x", "y[1]"}


def test_files_written_together_are_all_on_disk_before_the_first_is_renamed(tmp_path,
                                                                          monkeypatch):
    """A run's files (atomic.together): each synced before any is renamed, renamed in the
    order written (summary.json last), invisible until then; a failing block or sync leaves
    neither the new files nor a temporary, and the old file intact."""
    import errno
    import os
    from pathlib import Path

    from fnsysid.results.atomic import WriteError, together, write_json, write_text

    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("sync"), fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(Path(b).name),
                                                     replace(a, b))[1])
    with together():
        write_text(tmp_path / "config.yaml", "a: 1\n")
        with together():                                      # joins the outer block
            write_text(tmp_path / "errors.csv", "x\n1\n")
        write_json(tmp_path / "summary.json", {"status": "ok"})
        assert not any(p.name[0] != "." for p in tmp_path.iterdir())    # only temporaries
    assert events == ["sync"] * 3 + ["config.yaml", "errors.csv", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "errors.csv",
                                                          "summary.json"]
    assert (tmp_path / "errors.csv").read_text() == "x\n1\n"
    mask = os.umask(0)                      # the test reads the umask; the package does not
    os.umask(mask)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o666 & ~mask

    with pytest.raises(RuntimeError), together():
        write_text(tmp_path / "config.yaml", "a: 2\n")
        write_text(tmp_path / "new.csv", "y\n")
        raise RuntimeError("the run failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "errors.csv",
                                                          "summary.json"]
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n"

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(WriteError, match=r"cannot write .*config\.yaml: No space left"), \
            together():
        write_text(tmp_path / "config.yaml", "a: 3\n")
        write_text(tmp_path / "new.csv", "y\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "errors.csv",
                                                          "summary.json"]
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n"


@pytest.mark.slow
def test_file_size_limit_mid_run_is_one_line_and_no_summary(tmp_path):
    import resource
    import subprocess
    import sys

    from tests.test_cli import ROOT

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (250_000, resource.RLIM_INFINITY))

    out = tmp_path / "run"
    res = subprocess.run([sys.executable, str(ROOT / "run.py"), "system=synthetic", "M=20",
                          "R=100", "repeats=5", "output.plot=false", f"hydra.run.dir={out}"],
                         capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "clients.csv" in lines[0]
    assert "File too large" in lines[0] and "incomplete (no summary.json)" in lines[0]
    assert not (out / "summary.json").exists() and not (out / "clients.csv").exists()
    assert not list(out.glob(".*.tmp*"))


def test_files_written_together_in_two_threads_are_each_threads_own(tmp_path):
    """Two runs in threads of one process (joblib's threading backend, the Python API): a
    block publishes the files its own thread wrote when it ends, and another thread's failing
    block removes none of them."""
    import threading

    from fnsysid.results.atomic import together, write_text

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    a_wrote, b_done = threading.Event(), threading.Event()
    errors = []

    def long_run():
        try:
            with together():
                write_text(a / "errors.csv", "x\n")
                a_wrote.set()
                b_done.wait(10)
                raise RuntimeError("the long run failed")
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=long_run)
    t.start()
    assert a_wrote.wait(10)
    with together():                               # the short run, while the long one writes
        write_text(b / "summary.json", "{}\n")
    assert [p.name for p in b.iterdir()] == ["summary.json"]   # visible when its block ends
    b_done.set()
    t.join(10)
    assert len(errors) == 1
    assert [p.name for p in b.iterdir()] == ["summary.json"]   # kept after the other failed
    assert list(a.iterdir()) == []                  # the failed run left nothing
