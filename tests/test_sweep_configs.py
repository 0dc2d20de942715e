"""ReusingConfigLoader gives every job of a sweep the config Hydra itself composes, and an
experiment run in process through it writes the files that Hydra's own composition writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from fnsysid.config.groups import CONF_DIR, options
from fnsysid.config.sweep_configs import ReusingConfigLoader

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["progress=false", "output.plot=false"]


def sweep_jobs(loader, name: str, extra: list[str]):
    """The master config of ``experiment=name`` and each job's overrides, as Hydra's basic
    sweeper makes them."""
    master = loader.load_configuration(
        "config", [f"experiment={name}", "hydra/launcher=basic", *extra], RunMode.MULTIRUN)
    params = [f"{k}={v}" for k, v in master.hydra.sweeper.params.items()]
    parsed = OverridesParser.create().parse_overrides(params + [f"experiment={name}", *extra])
    return master, [list(job) for batch in BasicSweeper.split_arguments(parsed, None)
                    for job in batch]


def without_hydra(cfg):
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra")
    return OmegaConf.to_container(cfg, resolve=True)


def assert_same_configs(name: str, extra: list[str]) -> int:
    path = create_config_search_path(str(CONF_DIR))
    hydra_loader = ConfigLoaderImpl(config_search_path=path)
    reusing = ReusingConfigLoader(config_search_path=path)
    master, jobs = sweep_jobs(hydra_loader, name, extra)
    for job in jobs:
        want = hydra_loader.load_sweep_config(master, job)
        for _ in range(2):                    # the sweeper's check, then the launcher's
            got = reusing.load_sweep_config(master, job)
            assert OmegaConf.to_yaml(got) == OmegaConf.to_yaml(want), (name, job)
            assert without_hydra(got) == without_hydra(want), (name, job)
            assert got.hydra.sweep.subdir == want.hydra.sweep.subdir
            assert got.hydra.job.override_dirname == want.hydra.job.override_dirname
            assert OmegaConf.is_struct(got) and not OmegaConf.is_readonly(got.hydra)
    return len(jobs)


@pytest.mark.parametrize("name, extra", [
    ("sgd_vs_gd_pendulum", ["R=3", "hydra.sweeper.params.K='1,5'"]),  # a group, a value
    ("hetero_k_synthetic", ["K={kind:uniform_int,low:2,high:9}", "~theory"]),
])
def test_reused_composition_equals_hydras(name, extra):
    assert assert_same_configs(name, QUIET + extra) >= 3


def test_group_and_value_overrides_are_told_apart():
    loader = ReusingConfigLoader(config_search_path=create_config_search_path(str(CONF_DIR)))
    parse = OverridesParser.create().parse_override
    assert not loader._is_value(parse("strategy=fedavg"))               # a group
    assert loader._is_value(parse("strategy.fraction=0.5"))             # a key in a group
    assert loader._is_value(parse("M=4"))
    assert not loader._is_value(parse("hydra.sweep.dir=x"))             # part of the key


@pytest.mark.slow
@pytest.mark.parametrize("name", options("experiment"))
def test_every_experiment_job_is_composed_as_hydra_composes_it(name):
    assert assert_same_configs(name, QUIET) >= 3


def run_in_process(name: str, sweeps: Path, reuse: bool, extra: list[str]) -> Path:
    """``experiment=name`` through Hydra's multirun in this process (as make_figure runs it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_figure
    finally:
        sys.path.pop(0)
    make_figure.run_experiment(name, sweeps, ["R=3", "repeats=2", *extra], reuse=reuse)
    return sweeps / name


#: summary.json fields that measure time, not results
TIMING = {"runtime_s"}


def folder_files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (but run.log) by relative path, with the root's path and the
    timings of summary.json taken out."""
    files = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == "run.log":
            continue
        text = p.read_text().replace(str(root.resolve()), "<sweep>").replace(str(root), "<sweep>")
        if p.name == "summary.json":
            text = json.dumps({k: v for k, v in json.loads(text).items() if k not in TIMING})
        files[str(p.relative_to(root))] = text
    return files


def test_in_process_sweep_writes_what_hydras_composition_writes(tmp_path):
    two_k = ["hydra.sweeper.params.K='1,5'", "hydra.sweeper.params.optimizer=sgd"]  # 2 jobs
    fast = folder_files(run_in_process("sgd_vs_gd_pendulum", tmp_path / "reuse", True, two_k))
    plain = folder_files(run_in_process("sgd_vs_gd_pendulum", tmp_path / "plain", False, two_k))
    assert "results.csv" in fast and "multirun.yaml" in fast
    assert sum(k.endswith(".hydra/hydra.yaml") for k in fast) == 2
    assert sum(k.endswith("summary.json") for k in fast) == 2
    assert fast.keys() == plain.keys()
    for k in fast:
        assert fast[k] == plain[k], k


def test_a_sweep_config_composed_once_is_still_checked_for_hydra_sweeps():
    from hydra.errors import ConfigCompositionException

    loader = ReusingConfigLoader(config_search_path=create_config_search_path(str(CONF_DIR)))
    ovr = ["experiment=pendulum_gd_M", "hydra.job.name=a,b"]
    first = loader.load_configuration("config", ovr, RunMode.MULTIRUN,
                                      validate_sweep_overrides=False)
    assert first.hydra.sweeper.params.M == "1,9,25,49,64,81"
    with pytest.raises(ConfigCompositionException, match="Sweeping over Hydra's configuration"):
        loader.load_configuration("config", ovr, RunMode.MULTIRUN)
    again = loader.load_configuration("config", ovr[:1], RunMode.MULTIRUN)
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(
        ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
        .load_configuration("config", ovr[:1], RunMode.MULTIRUN))


def test_runs_with_the_same_simulation_settings_share_one_read_only_dataset():
    import numpy as np

    from fnsysid.app.experiment import execute
    from fnsysid.data.source import load_data, reuse_simulations
    from tests.conftest import make

    cfg_a, model, opt, _ = make("system=pendulum", "M=3", "R=4", "repeats=2")
    cfg_b = make("system=pendulum", "M=3", "R=4", "repeats=2", "strategy=scaffold", "K=3")[0]
    cfg_c = make("system=pendulum", "M=4", "R=4", "repeats=2")[0]
    fresh = load_data(cfg_a, model, opt)
    with reuse_simulations():
        first = load_data(cfg_a, model, opt)
        assert load_data(cfg_b, model, opt) is first             # strategy and K: same data
        assert load_data(cfg_c, model, opt).train.shape == (2, 4)  # M: new data
        with reuse_simulations():                                 # nested: the same store
            assert load_data(cfg_a, model, opt) is first
        with pytest.raises(ValueError, match="read-only"):
            first.train.H[0, 0, 0, 0] = 1.0
        shared = execute(cfg_b, choices={})
    np.testing.assert_array_equal(first.train.H, fresh.train.H)
    np.testing.assert_array_equal(first.heldout.x, fresh.heldout.x)
    alone = execute(cfg_b, choices={})
    for name in ("errors", "estimates", "theory"):
        assert shared.tables[name].equals(alone.tables[name]), name
    assert load_data(cfg_a, model, opt) is not first             # off after the block


@pytest.mark.slow
def test_in_process_sweep_writes_what_the_command_line_writes(tmp_path):
    """make_figure's path against ``run.py experiment=...`` (joblib launcher): the same job
    folders, configs, overrides, tables and summaries; only Hydra's records of the launcher
    (hydra.yaml, multirun.yaml) differ."""
    import subprocess

    extra = ["R=3", "repeats=2", "hydra.sweeper.params.K='1,5'"]
    fast = folder_files(run_in_process("sgd_vs_gd_pendulum", tmp_path / "fast", True, extra))
    cli = tmp_path / "cli"
    res = subprocess.run([sys.executable, str(ROOT / "run.py"), "experiment=sgd_vs_gd_pendulum",
                          f"hydra.sweep.dir={cli}", *QUIET, *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    cli_files = folder_files(cli)
    launcher_records = {k for k in fast if k.endswith("hydra.yaml") or k == "multirun.yaml"}
    assert len(launcher_records) == 5 and fast.keys() == cli_files.keys()
    for k in fast.keys() - launcher_records:
        assert fast[k] == cli_files[k], k


def test_the_launcher_gets_the_config_the_batch_check_composed_once():
    from types import SimpleNamespace

    from hydra.plugins.sweeper import Sweeper

    from fnsysid.config.sweep_configs import reuse_compositions

    path = create_config_search_path(str(CONF_DIR))
    hydra_loader = ConfigLoaderImpl(config_search_path=path)
    master, jobs = sweep_jobs(hydra_loader, "sgd_vs_gd_pendulum", QUIET)
    reusing = ReusingConfigLoader(config_search_path=path)
    sweeper = SimpleNamespace(hydra_context=SimpleNamespace(config_loader=reusing),
                              config=master)
    with reuse_compositions():
        Sweeper.validate_batch_is_legal(sweeper, jobs[:2])
    assert len(reusing._checked) == 2
    for job in jobs[:2]:
        got = reusing.load_sweep_config(master, job)          # the launcher's: the kept one
        assert OmegaConf.to_yaml(got) == OmegaConf.to_yaml(
            hydra_loader.load_sweep_config(master, job))
        got.hydra.job.num = 7                                  # as the launcher sets it
        again = reusing.load_sweep_config(master, job)         # used once: composed anew
        assert again is not got and OmegaConf.is_missing(again.hydra.job, "num")
    assert not reusing._checked
    other = OmegaConf.create(master)                           # another sweep's config
    reusing.check_batch(master, jobs[:1])
    assert reusing.load_sweep_config(other, jobs[0]) is not reusing._checked[
        (id(master), tuple(jobs[0]))][1][0]
    # outside the block the sweeper's check is Hydra's own, keeping nothing
    Sweeper.validate_batch_is_legal(sweeper, jobs[1:2])
    assert list(reusing._checked) == [(id(master), tuple(jobs[0]))]


def test_config_files_kept_within_a_block_give_hydras_compositions(tmp_path, monkeypatch):
    import shutil

    from hydra._internal.core_plugins.file_config_source import FileConfigSource

    from fnsysid.config.sweep_configs import ComposeOnceLoader, keep_config_files

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    path = create_config_search_path(str(conf))
    reads = []
    load = FileConfigSource.load_config
    monkeypatch.setattr(FileConfigSource, "load_config",
                        lambda self, config_path: reads.append(config_path) or load(
                            self, config_path))
    ovr = ["experiment=pendulum_gd_M", *QUIET]

    def both(overrides, mode=RunMode.MULTIRUN):
        """(kept composition, Hydra's, files the kept one read)"""
        want = ConfigLoaderImpl(config_search_path=path).load_configuration(
            "config", overrides, mode)
        reads.clear()
        got = ComposeOnceLoader(config_search_path=path).load_configuration(
            "config", overrides, mode)
        return OmegaConf.to_yaml(got), OmegaConf.to_yaml(want), list(reads)

    with keep_config_files():
        got, want, first = both(ovr)
        assert got == want and "config" in first and "system/pendulum" in first
        for overrides in ([*ovr, "system=synthetic", "M=3"], ovr):
            got, want, _ = both(overrides)
            assert got == want
        got, want, read = both([*ovr, "strategy=scaffold", "M=3"], RunMode.RUN)
        assert got == want and read == ["strategy/scaffold"]     # only the file not read yet
    # a file changed after the block is read again by the next block
    (conf / "system" / "pendulum.yaml").write_text(
        (conf / "system" / "pendulum.yaml").read_text() + "\ndt_changed_marker: 1\n")
    with keep_config_files():
        got, want, read = both(ovr)
        assert got == want and "dt_changed_marker" in got and "system/pendulum" in read
