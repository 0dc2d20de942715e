"""A command composes its config once (fnsysid.config.sweep_configs.ComposeOnceLoader): the check
before the run, Hydra's reading of ``hydra.mode`` and the run itself get the config that Hydra's
own composition gives, field for field, including Hydra's node."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobRuntime
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

import fnsysid.app.cli as cli
import fnsysid.app.experiment
import fnsysid.results.sweep
from fnsysid.config.groups import CONF_DIR
from fnsysid.config.sweep_configs import ComposeOnceLoader, _Store
from tests.test_data_files import linear_fleet, write_per_client

QUIET = ["progress=false", "output.plot=false", "R=2", "repeats=1"]


def run_main(monkeypatch, args: list[str], reuse: bool) -> dict:
    """``run.py args`` in this process with a stand-in for the experiment: what every Hydra
    composition returned, what each job received and the sweep's own config, and how many
    times Hydra composed."""
    got = {"composed": [], "jobs": [], "master": None, "count": 0}
    impl = ConfigLoaderImpl._load_configuration_impl
    compose_config = Hydra.compose_config

    def counting(self, *a, **k):
        got["count"] += 1
        return impl(self, *a, **k)

    def recording(self, *a, **k):
        cfg = compose_config(self, *a, **k)
        got["composed"].append((k.get("run_mode"), OmegaConf.to_container(cfg, resolve=False)))
        return cfg

    def job(cfg, out):
        from hydra.core.hydra_config import HydraConfig

        got["jobs"].append((OmegaConf.to_container(cfg, resolve=False),
                            OmegaConf.to_container(HydraConfig.get(), resolve=False)))
        repeats = cfg.repeats or 1       # a finished job's files: errors.csv, then summary
        (Path(out) / "errors.csv").write_text("repeat,round,e_max\n" + "".join(
            f"{s},{r},1\n" for s in range(repeats) for r in range(cfg.R + 1)))
        (Path(out) / "summary.json").write_text(json.dumps(
            {"status": "ok", "rounds_completed": cfg.R, "repeats": cfg.repeats}))
        return {"status": "ok", "final_e_max_mean": None, "final_nrmse_1step_max": None}

    def master(self, config, **kwargs):
        got["master"] = OmegaConf.to_container(config, resolve=False)

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", counting)
    monkeypatch.setattr(Hydra, "compose_config", recording)
    monkeypatch.setattr(fnsysid.app.experiment, "run_experiment", job)
    monkeypatch.setattr(fnsysid.results.sweep.SweepTable, "on_multirun_end", master)
    monkeypatch.setattr(cli.interrupt, "parent_handlers", lambda: None)
    monkeypatch.setattr(cli.interrupt, "job_handlers", lambda: None)
    if not reuse:
        monkeypatch.setattr(cli, "reuse_compositions", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    try:
        cli.main()
    finally:
        GlobalHydra.instance().clear()
        monkeypatch.undo()
    return got


def own_option(folder: Path) -> Path:
    """A config folder with a strategy option of its own (fedavg under another name)."""
    (folder / "strategy").mkdir(parents=True)
    text = (CONF_DIR / "strategy" / "fedavg.yaml").read_text()
    (folder / "strategy" / "myavg.yaml").write_text(text)
    return folder


def commands(tmp: Path) -> dict[str, tuple[list[str], int, int]]:
    """Commands with (compositions of plain Hydra, compositions with reuse)."""
    own = own_option(tmp / "own")
    files = write_per_client(linear_fleet(n_clients=2, n_traj=2, length=8)[0], tmp / "files")
    basic = "hydra/launcher=basic"
    return {
        "plain": (["system=pendulum", "M=3"], 3, 1),
        "groups": (["system=synthetic", "strategy=scaffold", "optimizer=sgd", "K=2"], 3, 1),
        "config-dir": (["--config-dir", str(own), "strategy=myavg", "M=3"], 3, 1),
        "searchpath": ([f"hydra.searchpath=[file://{own}]", "strategy=myavg"], 3, 1),
        "files": (["system=generic", "data=files", f"data.path={files}", "data.states=[x1,x2]",
                   "data.inputs=[u]"], 3, 1),
        # sweeps: the master (check, hydra.mode, multirun) then 2 compositions per job
        "experiment": (["experiment=pendulum_gd_M", basic, "hydra.sweeper.params.M='2,3'"],
                       3 + 4, 1 + 4),
        "multirun": (["-m", "M=2,3", basic], 3 + 4, 2 + 4),   # the check composes M=2 alone
        "multirun-one": (["-m", "M=2", basic], 3 + 2, 1 + 2),
    }


@pytest.mark.parametrize("name", ["plain", "config-dir", "files", "multirun-one", *(
    pytest.param(name, marks=pytest.mark.slow)
    for name in ("groups", "searchpath", "experiment", "multirun"))])
def test_a_command_is_composed_once_into_the_config_hydra_composes(tmp_path, monkeypatch, name):
    args, plain_count, reuse_count = commands(tmp_path)[name]
    multirun = name in ("experiment", "multirun", "multirun-one")
    folder = f"hydra.{'sweep' if multirun else 'run'}.dir={tmp_path / 'out'}"
    runs = {}
    for reuse in (False, True):
        runs[reuse] = run_main(monkeypatch, [*args, *QUIET, folder], reuse)
        (tmp_path / "out").rename(tmp_path / f"out-{reuse}")    # the same folder for both
    plain, reused = runs[False], runs[True]
    assert (plain["count"], reused["count"]) == (plain_count, reuse_count)
    # every composition Hydra's entry point asked for (check, hydra.mode, run or multirun)
    assert [m for m, _ in reused["composed"]] == [m for m, _ in plain["composed"]]
    assert len(plain["composed"]) == 3
    for (_, want), (_, got) in zip(plain["composed"], reused["composed"], strict=True):
        assert got == want
    assert reused["jobs"] == plain["jobs"]
    assert len(plain["jobs"]) == {"experiment": 2, "multirun": 2}.get(name, 1)
    assert reused["master"] == plain["master"]
    assert (plain["master"] is not None) == multirun
    _, hydra_node = reused["jobs"][0]
    assert hydra_node["job"]["name"] == "cli" and hydra_node["runtime"]["cwd"]
    if name in ("config-dir", "searchpath"):
        assert reused["jobs"][0][0]["strategy"] == plain["jobs"][0][0]["strategy"]
        assert hydra_node["runtime"]["choices"]["strategy"] == "myavg"
        assert any(str(tmp_path / "own") in s["path"]
                   for s in hydra_node["runtime"]["config_sources"])
    if not multirun:
        assert hydra_node["overrides"]["hydra"][-1] == "hydra.mode=RUN"   # added by Hydra
        assert hydra_node["mode"] == RunMode.RUN


def loader(store: _Store, extra: Path | None = None) -> ComposeOnceLoader:
    path = create_config_search_path(str(CONF_DIR))
    if extra is not None:
        path.append("test", f"file://{extra}", anchor=SearchPathQuery(provider="main"))
    compose_once = ComposeOnceLoader(config_search_path=path)
    compose_once._store = store
    return compose_once


def test_a_multirun_composition_does_not_stand_for_a_run_with_a_group_left_missing(tmp_path):
    (tmp_path / "missing.yaml").write_text("defaults:\n  - _self_\n  - strategy: ???\nx: 1\n")
    once = loader(_Store([]), tmp_path)
    skipped = once.load_configuration("missing", [], RunMode.MULTIRUN)
    assert "strategy" not in skipped and skipped.x == 1
    with pytest.raises(ConfigCompositionException, match="You must specify 'strategy'"):
        once.load_configuration("missing", [], RunMode.RUN)
    sweep = once.load_configuration("config", ["M=2,3"], RunMode.MULTIRUN,
                                    validate_sweep_overrides=False)         # as get_mode asks
    assert sweep.hydra.overrides.task == ["M=2,3"]
    with pytest.raises(ConfigCompositionException, match="add --multirun"):
        once.load_configuration("config", ["M=2,3"], RunMode.RUN)
    run = once.load_configuration("missing", ["strategy=fedavg"], RunMode.RUN)
    assert run.strategy == OmegaConf.load(CONF_DIR / "strategy" / "fedavg.yaml")


def test_a_kept_composition_is_redone_for_another_job_name_or_environment(monkeypatch):
    command = ["M=3", "hydra.job.env_copy=[FNSYSID_TEST_VAR]"]
    monkeypatch.setenv("FNSYSID_TEST_VAR", "a")
    counted = []
    impl = ConfigLoaderImpl._load_configuration_impl
    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl",
                        lambda self, *a, **k: counted.append(1) or impl(self, *a, **k))
    name = JobRuntime().get("name")
    try:
        once = loader(_Store(command))
        JobRuntime().set("name", "first")
        first = once.load_configuration("config", command, RunMode.RUN)
        again = once.load_configuration("config", [*command, "hydra.mode=RUN"], RunMode.RUN)
        assert len(counted) == 1 and again.hydra.mode == RunMode.RUN and first.hydra.mode is None
        assert again.hydra.overrides.hydra == [command[1], "hydra.mode=RUN"]
        JobRuntime().set("name", "second")
        assert once.load_configuration("config", command, RunMode.RUN).hydra.job.name == "second"
        monkeypatch.setenv("FNSYSID_TEST_VAR", "b")
        env = once.load_configuration("config", command, RunMode.MULTIRUN).hydra.job.env_set
        assert env.FNSYSID_TEST_VAR == "b" and len(counted) == 3
    finally:
        JobRuntime().set("name", name)
