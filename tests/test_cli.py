"""The command line end to end: outputs, --help, sweeps, bad input and divergence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fnsysid.app.build import build
from fnsysid.app.experiment import run_experiment
from fnsysid.config.checks import KNOBS, ConfigError, check_run
from fnsysid.config.groups import options
from fnsysid.config.schema import GROUPS
from tests.conftest import cli_in_process, compose_cfg

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_end_to_end_run_writes_tidy_outputs_and_error_falls(tmp_path):
    res = cli_in_process("system=synthetic", "M=5", "R=60", "repeats=2",
                         f"hydra.run.dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert "final e_R" in res.stdout and str(tmp_path) in res.stdout
    errors = pd.read_csv(tmp_path / "errors.csv")
    assert list(errors.columns) == ["repeat", "round", "e_max", "e_mean", "nrmse_1step_max",
                                    "nrmse_1step_mean", "nrmse_sim_max", "nrmse_sim_mean",
                                    "bytes_per_client"]
    assert len(errors) == 2 * 61 and errors["round"].max() == 60
    for _, e in errors.groupby("repeat"):
        assert e["e_max"].iloc[-1] < 0.5 * e["e_max"].iloc[0]
        assert (e["e_max"] >= e["e_mean"]).all()
    clients = pd.read_csv(tmp_path / "clients.csv")
    assert list(clients.columns) == ["repeat", "round", "client", "error"]
    last = clients[clients["round"] == 60].groupby("repeat")["error"].max()
    assert last.tolist() == errors[errors["round"] == 60]["e_max"].tolist()
    est = pd.read_csv(tmp_path / "estimates.csv")
    assert len(est) == 2 * 15 and set(est.columns) >= {"parameter", "estimate", "true_mean"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["system"] == "synthetic"
    assert summary["final_e_max_mean"] == pytest.approx(errors[errors["round"] == 60]["e_max"]
                                                        .mean())
    assert (tmp_path / "error.png").stat().st_size > 10_000
    assert "M: 5" in (tmp_path / "config.yaml").read_text()     # resolved config


@pytest.mark.slow
def test_a_single_run_writes_what_hydras_entry_point_writes(tmp_path):
    """A single run is run with the config its check composed (``fnsysid.app.cli.run_once``,
    one composition); its folder holds what Hydra's entry point (``task``) writes for the
    same command: the job's config, Hydra's config and the overrides, the same results."""
    args = ["system=synthetic", "M=3", "R=4", "repeats=2", "output.plot=false"]
    once, entry = tmp_path / "once", tmp_path / "entry"
    res = cli_in_process(*args, f"hydra.run.dir={once}")
    assert res.returncode == 0, res.stderr
    code = ("import sys; from fnsysid.app.cli import task; "
            f"sys.argv[1:] = {[*args, f'hydra.run.dir={entry}']!r}; task()")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for name in ("config.yaml", "overrides.yaml"):
        assert (once / ".hydra" / name).read_text() == (entry / ".hydra" / name).read_text()
    hydra_yaml = (once / ".hydra" / "hydra.yaml").read_text()
    assert "name: cli" in hydra_yaml and "- hydra.mode=RUN" in hydra_yaml
    assert hydra_yaml.replace(str(once), str(entry)) == \
        (entry / ".hydra" / "hydra.yaml").read_text()
    for name in ("errors.csv", "estimates.csv", "clients.csv", "config.yaml"):
        assert (once / name).read_bytes() == (entry / name).read_bytes(), name
    assert "final e_R" in (once / "run.log").read_text()


@pytest.mark.slow
def test_the_command_line_module_leaves_numpy_unimported():
    """``fnsysid.app.cli.main`` sets ``OPENBLAS_NUM_THREADS=1`` before numpy loads OpenBLAS
    (which reads it once): importing the module must not import numpy."""
    code = "import sys, fnsysid.app.cli; print(sorted(m for m in ('numpy', 'pandas', " \
           "'matplotlib', 'scipy') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_same_config_writes_byte_identical_csvs(tmp_path):
    cfg = compose_cfg("system=pendulum", "M=3", "R=5", "repeats=2", "output.plot=false")
    run_experiment(cfg, tmp_path / "a")
    run_experiment(cfg, tmp_path / "b")
    for name in ("errors.csv", "clients.csv", "estimates.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_large_m_writes_no_per_client_rows(tmp_path):
    cfg = compose_cfg("system=pendulum", "M=21", "R=2", "repeats=1", "output.plot=false")
    run_experiment(cfg, tmp_path)
    assert not (tmp_path / "clients.csv").exists()


#: a system each feature map fits
FITS = {"default": "pendulum", "fourier": "synthetic", "polynomial": "linear", "affine": "linear",
        "combined": "synthetic"}


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS[:-1])
def test_every_group_option_composes_and_instantiates(group):
    for option in options(group):
        system = FITS[option] if group == "feature_map" else "pendulum"
        extra = [] if group == "system" else [f"system={system}"]
        if option == "generic":       # unknown dynamics: named columns of trajectory files
            extra = ["data=files", "data.path=logs", "data.states=[x1,x2]", "data.inputs=[u]"]
        if option == "files":
            extra += ["data.path=logs"]
        if group == "privacy":        # perturbs the release of the closed-form strategies
            extra += ["strategy=centralized_exact"]
        model, optimizer, strategy = build(compose_cfg(f"{group}={option}", *extra))
        assert model.p >= 2 and optimizer is not None and strategy is not None
        if option == "generic":       # the schema takes it composed alone too (simulated data)
            check_run(compose_cfg("system=generic"))
        if group == "feature_map" and option != "default":
            assert model.library is not None and model.p > len(model.system.param_names)


@pytest.mark.slow
def test_help_lists_groups_options_and_knobs():
    res = cli_in_process("--help")
    assert res.returncode == 0
    for group in GROUPS[:-1]:
        assert f"{group}: {', '.join(options(group))}" in res.stdout
    for knob in KNOBS:
        assert f"\n  {knob}=" in res.stdout
    from fnsysid.learning.optim import SCALINGS

    assert f"optimizer.scale_features={'|'.join(SCALINGS)}\n" in res.stdout   # every scaling
    # the exit statuses, with the growth rule's factor the code applies
    from fnsysid.results.history import GROWTH_FACTOR

    assert f"growing (final error above {GROWTH_FACTOR:g} x max(1, start))" in \
        " ".join(res.stdout.split())


BAD = [
    (["system=pendulum", "data=files", "data.path=logs/fleet.csv", "hydra.job.chdir=true"],
     "data.path=logs/fleet.csv is relative, and hydra.job.chdir=true runs each job in its "
     "results folder"),
    (["-m", "M=1,2", "output.resume=true", "output.overwrite=true"],
     "output.resume=true and output.overwrite=true ask for opposites"),
    (["M=0"], "M=0 is not allowed"),
    (["N=0"], "N=0 is not allowed"),
    (["T=0"], "T=0 is not allowed"),
    (["K=0"], "K=0 is not allowed"),
    (["R=0"], "R=0 is not allowed"),
    (["repeats=0"], "repeats=0 is not allowed"),
    (["lr=0"], "lr=0 is not allowed"),
    (["lr=-1e-3"], "lr=-0.001 is not allowed"),
    (["eps=-0.1"], "eps=-0.1 is not allowed"),
    (["optimizer=sgd", "optimizer.batch_size=0"], "optimizer.batch_size=0"),
    (["optimizer=sgd", "optimizer.batch_size=51"], "1..N*T = 1..50"),
    (["system=quadcopter"], "allowed: generic, linear, pendulum, quadrotor, synthetic"),
    (["optimizer=adam"], "allowed: gd, sgd"),
    (["system=synthetic", "feature_map=polynomial"],
     "options that fit: combined, default, fourier"),
    (["system=pendulum", "feature_map=affine"], "options that fit: default"),
    (["-m", "M=1,0"], "M=0 is not allowed"),
    (["N=[1,2]"], "N has 2 entries but M=20"),
    (["Mx=3"], "unknown setting 'Mx'"),
    (["data.holdout=0.3"], "unknown setting 'data.holdout' with data=simulated; data=simulated "
     "has: source, shared_noise, val_N, states, inputs; it is a setting of data=files"),
    (["strategy.mu=1"], "it is a setting of strategy=fedprox"),
    (["data=files", "data.path=nowhere.csv", "data.val_N=3"], "unknown setting 'data.val_N' "
     "with data=files; data=files has: source, path,"),     # the group's other settings given
    (["system=null"], "system=null is not an option; allowed: generic, linear, pendulum"),
    (["-m", "system=pendulum,null"], "system=null is not an option"),
    (["hydra/launcher=null"], "hydra/launcher=null is not an option"),
    (["-m", 'data.shared_noise=false,"false"'], "data.shared_noise='false' is not allowed"),
    (["-m", "system=pendulum,synthetic", "system.m=1"], "unknown setting 'system.m' with "
     "system=synthetic; system=synthetic has: A0,"),
]


def fresh_first(cases: list) -> list:
    """``cases`` with all but the first marked slow: the first runs in a fresh interpreter in
    ``make test`` too, every one in ``make test-slow``."""
    return [c if i == 0 else pytest.param(*c, marks=pytest.mark.slow)
            for i, c in enumerate(cases)]


#: commands Hydra itself would end with a traceback or its own multi-line message: the first
#: words of the one line printed instead
BAD_FOR_HYDRA = [
    (["M=3", "hydra.job.env_copy=[FNSYSID_UNSET_VAR]"],
     "hydra.job.env_copy=[FNSYSID_UNSET_VAR]: FNSYSID_UNSET_VAR not set in the environment"),
    (["-m", "--cfg", "job", "M=1,2"], "-m and --cfg cannot be used together"),
    (["--resolve", "M=3"], "--resolve works only with --cfg or --help"),
    (["--cfg", "job", "system=linear,pendulum"], "system=linear,pendulum is a sweep: --cfg "
     "prints the config of one job; give one value (e.g. system=linear)"),
    (["-m", "M=3", "+hydra.sweeper.params.seed=1,2"],
     "+hydra.sweeper.params.seed=1,2: a hydra.* setting takes one value, not a sweep"),
    (["-m", "M=3", '+hydra.sweeper.params={seed:"1,2"}'],
     '+hydra.sweeper.params={seed:"1,2"}: hydra.sweeper.params is null in this config'),
    (["-m", "M=3", "hydra.sweeper.params.seed='1,2'"],
     "hydra.sweeper.params.seed='1,2': hydra.sweeper.params is null in this config"),
    (["experiment=synthetic_gd_M", "hydra.sweeper.params.M=2,3"],
     "hydra.sweeper.params.M=2,3: a hydra.* setting takes one value, not a sweep: quote it"),
    (["-cp", "nosuch", "M=3"], f"--config-path {ROOT / 'nosuch'}: no such folder (e.g. "
     "--config-path "),
    (["-cp", "/nonexistent/conf", "M=3"], "--config-path /nonexistent/conf: no such folder"),
]


def assert_bad_input(res, tmp_path: Path, message: str, starts: bool = False) -> None:
    """One line on stderr holding ``message`` (right after ``fnsysid: error:`` when
    ``starts``), exit 2, no traceback and nothing written."""
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fnsysid: error: "), res.stderr
    assert (lines[0].startswith(f"fnsysid: error: {message}") if starts
            else message in lines[0]), lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert list(tmp_path.iterdir()) == []


#: every refusal: (arguments, expected text, whether the line starts with it)
REFUSED = [(a, m, False) for a, m in BAD] + [(a, m, True) for a, m in BAD_FOR_HYDRA]


@pytest.mark.slow
@pytest.mark.parametrize("args, message, starts", REFUSED)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message, starts):
    res = cli_in_process(*args, f"hydra.run.dir={tmp_path}/run",
                         f"hydra.sweep.dir={tmp_path}/sweep")
    assert_bad_input(res, tmp_path, message, starts)


@pytest.mark.parametrize("args, message, starts", fresh_first(REFUSED[:len(BAD)])
                         + fresh_first(REFUSED[len(BAD):]))
def test_bad_input_from_a_fresh_interpreter(tmp_path, args, message, starts):
    """The same through ``python run.py`` (nothing on stderr from start-up or exit)."""
    res = cli(*args, f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep")
    assert_bad_input(res, tmp_path, message, starts)


@pytest.mark.parametrize("edit, start", [
    (("    chdir: false\n", "    chdir: false\n    env_copy: [FNSYSID_UNSET_VAR]\n"),
     "hydra.job.env_copy: FNSYSID_UNSET_VAR not set in the environment"),
    (("hydra:\n", "hydra:\n  job:\n    chdir: false\n"), "while constructing a mapping"),
])
def test_a_config_file_hydra_refuses_is_one_line_exit_2_and_writes_nothing(tmp_path, edit, start):
    """A primary config of one's own that names an unset variable in hydra.job.env_copy, or
    that is not valid YAML (a key given twice)."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    text = (conf / "config.yaml").read_text()
    assert edit[0] in text
    (conf / "config.yaml").write_text(text.replace(edit[0], edit[1], 1))
    out = tmp_path / "out"
    res = cli_in_process("--config-path", str(conf), "M=3", f"hydra.run.dir={out}")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"fnsysid: error: {start}")
    assert "Traceback" not in res.stderr + res.stdout and not out.exists()


@pytest.mark.slow
def test_the_forms_the_messages_suggest_pass_the_check(tmp_path):
    from fnsysid.app.preflight import preflight

    out = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
    res = cli_in_process("-m", "M=3", "hydra.sweeper.params.seed=1,2", *out)
    assert "quote it to change an experiment's sweep (hydra.sweeper.params.seed='1,2'), or sweep" \
        " on the command line (-m seed=1,2, which wins over the experiment's sweep of seed)" \
        in res.stderr
    preflight(["experiment=synthetic_gd_M", "hydra.sweeper.params.M='2,3'", *out])
    preflight(["-cp", str(ROOT / "conf"), "M=3", *out])
    preflight(["-m", "M=3", "seed=1,2", *out])
    assert "e.g. --config-path " + str(ROOT / "conf") in \
        cli_in_process("-cp", "nosuch", *out).stderr
    assert list(tmp_path.iterdir()) == []


def test_a_relative_config_path_is_a_folder_of_the_working_folder(tmp_path):
    import shutil

    shutil.copytree(ROOT / "conf", tmp_path / "myconf")
    (tmp_path / "myconf" / "config.yaml").write_text(
        (ROOT / "conf" / "config.yaml").read_text().replace("M: 20 ", "M: 3  "))
    res = cli_in_process("-cp", "myconf", "R=2", "repeats=1", "output.plot=false",
                         "hydra.run.dir=out", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "M: 3" in (tmp_path / "out" / "config.yaml").read_text()


def test_settings_checked_inside_a_job_leave_no_folder(tmp_path):
    """A cross-setting error met only at run time removes Hydra's job folder too."""
    from fnsysid.app.cli import _remove_outputs

    job = tmp_path / "sweep" / "M=1"
    (job / ".hydra").mkdir(parents=True)
    (tmp_path / "sweep" / "multirun.yaml").write_text("x")
    cfg = compose_cfg("N=[1,2]", "M=3")
    with pytest.raises(ConfigError, match="N has 2 entries"):
        run_experiment(cfg, job)
    _remove_outputs(job)
    assert not (tmp_path / "sweep").exists()


def test_divergence_is_reported_rows_kept_and_not_plotted(tmp_path):
    res = cli_in_process("system=synthetic", "lr=0.05", "M=2", "R=30", "repeats=1",
                         f"hydra.run.dir={tmp_path}")
    assert res.returncode == 3
    assert "diverged at round" in res.stdout and "smaller lr" in res.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged"
    r = summary["diverged_round"]
    errors = pd.read_csv(tmp_path / "errors.csv")
    assert 1 < r <= 30 and errors["round"].max() == r - 1 == summary["rounds_completed"]
    assert errors["e_max"].notna().all()
    assert not (tmp_path / "error.png").exists()


@pytest.mark.slow
def test_a_diverged_repeat_is_left_out_and_the_others_run_on(tmp_path):
    """FedLin on the pendulum at lr 0.05, K = 20 (compare_pendulum): repeat 0 diverges at
    r = 22, the four others run to R with their errors kept; the run is still diverged."""
    summary = run_experiment(compose_cfg(
        "system=pendulum", "M=20", "N=2", "eps=2", "K=20", "lr=0.05", "R=40", "repeats=5",
        "optimizer.reduction=mean", "optimizer.scale_features=diagonal", "strategy=fedlin",
        "output.plot=false"), tmp_path)
    assert summary["status"] == "diverged" and summary["diverged_round"] == 22
    assert summary["repeat_status"] == ["diverged", "ok", "ok", "ok", "ok"]
    assert summary["repeat_diverged_round"] == [22, None, None, None, None]
    assert summary["rounds_completed"] == 40 and summary["final_e_max_mean"] is None
    e = pd.read_csv(tmp_path / "errors.csv").set_index(["repeat", "round"])
    kept = ["e_max", "e_mean", "nrmse_1step_max"]
    assert e.loc[0].loc[:21, kept].notna().all().all() and e.loc[0].loc[22:, "e_max"].isna().all()
    assert e.loc[0].loc[22:].isna().all().all()                     # free run included
    rest = e.loc[1:].xs(40, level="round")["e_max"]
    assert rest.notna().all() and rest.max() < 0.1                   # the others converged
    assert not (tmp_path / "estimates.csv").exists()
    ok = run_experiment(compose_cfg("system=synthetic", "M=2", "R=3", "repeats=2",
                                    "output.plot=false"), tmp_path / "ok")
    assert ok["repeat_status"] == ["ok", "ok"] and ok["status"] == "ok"
    res = cli_in_process("system=pendulum", "M=20", "N=2", "eps=2", "K=20", "lr=0.05", "R=25",
                         "repeats=5", "optimizer.reduction=mean",
                         "optimizer.scale_features=diagonal", "strategy=fedlin",
                         f"hydra.run.dir={tmp_path / 'cli'}")
    assert res.returncode == 3
    assert ("1 of 5 repeats diverged (repeat 0 at round 22; an error not finite or above 1000 "
            "times its start): their rows are empty from that round on, the other repeats' rows "
            "are kept up to round 25; try a smaller lr than 0.05" in res.stdout), res.stdout
    assert "run diverged at round" not in res.stdout


def test_the_divergence_line_never_contradicts_itself():
    from fnsysid.app.cli import divergence_line

    one = {"diverged_round": 3, "rounds_completed": 2, "repeat_diverged_round": [3]}
    assert divergence_line(one, 0.5) == (
        "run diverged at round 3 (an error not finite or above 1000 times its start): results "
        "up to round 2 kept; try a smaller lr than 0.5")
    every = {"diverged_round": 1, "rounds_completed": 49, "repeat_diverged_round": [1, 50]}
    assert divergence_line(every, 0.5) == (
        "run diverged in every repeat (repeat 0 at round 1, repeat 1 at round 50; an error not "
        "finite or above 1000 times its start): each repeat's rows are kept up to the round "
        "before its own; try a smaller lr than 0.5")


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_bad_fnsysid_threads_is_one_line_exit_2_nothing_written(tmp_path, monkeypatch, value):
    monkeypatch.setenv("FNSYSID_THREADS", value)
    res = cli_in_process("M=3", "R=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == (f"fnsysid: error: FNSYSID_THREADS={value}; allowed: an "
                                  "integer >= 1")
    assert list(tmp_path.iterdir()) == []


def test_bench_refuses_an_unknown_case():
    """scripts/bench.py --cases nosuch ran nothing, wrote an empty bench.json and exited 0."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--cases",
                          "M,nosuch"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "bench.py: error: argument --cases: nosuch is not a case; allowed: paper,M,K,p,ragged,"
        "flower,oneshot,personalize,modelcheck,sparsity,startup")


@pytest.mark.slow
def test_bench_startup_times_the_small_run_beside_a_hydra_app_that_does_nothing(tmp_path):
    """The startup case runs each of its five commands (the small run, the interpreter,
    numpy's import, a Hydra application doing nothing with and without numpy) and gives their
    medians; a command that fails stops the bench (so a broken bare application cannot pass
    for a fast one)."""
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--cases",
                          "startup", "--quick", "--json", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["cases"]["startup"]
    assert list(rows) == ["interpreter (python -c pass)", "import numpy",
                          "Hydra app doing nothing, two settings", "the same after import numpy",
                          "run.py M=5 R=5 output.plot=false"]
    walls = [r["wall_s"] for r in rows.values()]
    assert all(w > 0 for w in walls) and walls[0] < walls[2] < walls[4]
    assert "goal: small run" in res.stdout
