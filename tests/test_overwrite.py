"""``output.overwrite=true`` replaces an earlier run only once the new run has its summary: a run
refused or failed inside the job leaves the earlier run byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import fnsysid
from fnsysid.config.errors import ConfigError
from fnsysid.results.folder import STASH, settle_stash, stash_earlier
from tests.conftest import cli_in_process

QUIET = ("output.plot=false", "progress=false", "R=3")


def checksums(folder: Path) -> dict[str, str]:
    """Relative path -> md5 of every file below ``folder`` (the lock file left out)."""
    return {p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".fnsysid.lock"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    """Three clients' trajectories in the import format (a simulated run's export)."""
    sim = tmp_path_factory.mktemp("sim")
    res = cli_in_process("M=3", *QUIET, "output.trajectories=true", f"hydra.run.dir={sim}")
    assert res.returncode == 0, res.stderr
    return sim / "trajectories.parquet"


@pytest.fixture
def earlier(tmp_path) -> Path:
    out = tmp_path / "run"
    res = cli_in_process("M=3", *QUIET, f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize("refused, why", [
    (["M=7"], "M=7 does not match"),                      # found when the files are read
    (["data.ignore=[omega]"], "data.ignore"),             # a state named as ignored
])
@pytest.mark.slow
def test_a_refusal_inside_the_job_keeps_the_earlier_run(earlier, fleet, refused, why):
    before = checksums(earlier)
    assert {"summary.json", "errors.csv", "estimates.csv", "run.log"} <= set(before)
    res = cli_in_process("data=files", f"data.path={fleet}", *refused, *QUIET,
                         f"hydra.run.dir={earlier}", "output.overwrite=true")
    assert res.returncode == 2
    assert why in res.stderr and "the earlier run" in res.stderr
    assert checksums(earlier) == before
    assert not (earlier / STASH).exists()


@pytest.mark.slow
def test_a_finished_overwrite_replaces_the_earlier_run(earlier, fleet):
    assert "source: simulated" in (earlier / "config.yaml").read_text()
    res = cli_in_process("data=files", f"data.path={fleet}", *QUIET,
                         f"hydra.run.dir={earlier}", "output.overwrite=true")
    assert res.returncode == 0, res.stderr
    assert "source: files" in (earlier / "config.yaml").read_text()
    assert json.loads((earlier / "summary.json").read_text())["status"] == "ok"
    assert not (earlier / STASH).exists()
    assert "did not finish" not in res.stderr


def test_settle_restores_without_a_summary_and_drops_with_one(tmp_path):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("M: 3\n")
    (folder / "summary.json").write_text('{"status": "ok"}')
    (folder / "errors.csv").write_text("repeat,round,e_max\n0,0,1.0\n")
    (folder / "mine.txt").write_text("not a result file")
    before = checksums(folder)
    assert stash_earlier(folder) == [".hydra", "errors.csv", "summary.json"]
    assert sorted(p.name for p in folder.iterdir()) == [STASH, "mine.txt"]
    (folder / "errors.csv").write_text("half a table")          # what a failed run left
    assert settle_stash(folder) == "restored"
    assert checksums(folder) == before
    stash_earlier(folder)
    (folder / "summary.json").write_text('{"status": "refused"}')
    assert settle_stash(folder) == "restored" and checksums(folder) == before
    stash_earlier(folder)
    (folder / "summary.json").write_text('{"status": "diverged"}')
    assert settle_stash(folder) == "replaced"
    assert json.loads((folder / "summary.json").read_text()) == {"status": "diverged"}
    assert not (folder / STASH).exists() and not (folder / "errors.csv").exists()
    assert settle_stash(folder) is None                         # nothing kept: nothing to do


def test_a_stash_left_behind_is_not_overwritten(tmp_path):
    folder = tmp_path / "run"
    (folder / STASH).mkdir(parents=True)
    (folder / "summary.json").write_text('{"status": "ok"}')
    with pytest.raises(ConfigError, match="left from an overwrite that did not end"):
        stash_earlier(folder)


@pytest.mark.slow
def test_the_python_api_overwrite_keeps_no_stash(tmp_path):
    small = {"M": 3, "R": 2, "repeats": 1, "output.plot": False, "progress": False}
    out = tmp_path / "out"
    fnsysid.run(small, output_dir=out)
    fnsysid.run({**small, "seed": 1, "output.overwrite": True}, output_dir=out)
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
    assert not (out / STASH).exists()


@pytest.mark.slow
def test_a_sweep_whose_table_cannot_be_written_fails(tmp_path):
    """results.csv that cannot be written (here a folder stands in its place) is a failure of
    the command: one line naming it, exit status 2, not 0."""
    sweep = tmp_path / "sw"
    args = ("-m", "M=1,2", *QUIET, "hydra/launcher=basic", f"hydra.sweep.dir={sweep}")
    res = cli_in_process(*args)
    assert res.returncode == 0, res.stderr
    assert (sweep / "results.csv").is_file()
    (sweep / "results.csv").unlink()
    (sweep / "results.csv").mkdir()
    res = cli_in_process(*args, "output.resume=true")      # the jobs are done: only the table
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("fnsysid:")]
    assert len(lines) == 1 and "the sweep table" in lines[0] and "results.csv" in lines[0]


@pytest.fixture
def freeze(tmp_path):
    """``freeze(folder)``: nothing can be created in or removed from ``folder`` any more
    (``chattr +i``), as a folder made read-only during a run; unfrozen afterwards."""
    import shutil
    import subprocess

    frozen = []

    def _freeze(folder):
        if shutil.which("chattr") is None or \
                subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here (needs root and a file system with it)")
        frozen.append(folder)

    yield _freeze
    for folder in frozen:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_folder_made_read_only_during_the_writes_is_one_write_error(tmp_path, freeze):
    """The temporaries were made; the renames and their removal fail: the error is the
    write's, one line naming the file (it was the removal's PermissionError, a traceback)."""
    from fnsysid.results.atomic import WriteError, together, write_text

    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(WriteError, match=f"cannot write {folder}/errors.csv"):
        with together():
            write_text(folder / "errors.csv", "repeat,round\n")
            write_text(folder / "summary.json", "{}")
            freeze(folder)
    assert not (folder / "errors.csv").exists() and not (folder / "summary.json").exists()
