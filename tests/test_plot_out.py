"""``fnsysid-plot --out``: a path that cannot hold the figure is refused in one line, exit 2,
before anything is drawn, and a write that fails leaves none of the files it began."""

from __future__ import annotations

import pytest

from fnsysid.app.plot_cli import main
from tests.conftest import cli_in_process


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sw")
    res = cli_in_process("-m", "M=1,2", "R=2", "output.plot=false", "progress=false",
                         "hydra/launcher=basic", f"hydra.sweep.dir={folder}")
    assert res.returncode == 0, res.stderr
    return folder


@pytest.mark.parametrize("out, words", [
    ("", "--out is empty"),
    ("b" * 300 + ".png", "a name longer than 255 bytes"),
    ("NO_SUCH_FOLDER/x.png", "the folder NO_SUCH_FOLDER does not exist"),
    ("/proc/x.png", "cannot be written"),
])
@pytest.mark.slow
def test_a_bad_out_is_one_line_and_exit_2(sweep, capsys, out, words):
    assert main([str(sweep), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fnsysid-plot: error: ") and words in err[0]


@pytest.mark.slow
def test_a_good_out_writes_the_three_files(sweep, tmp_path, capsys):
    assert main([str(sweep), "--out", str(tmp_path / "fig.png")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.csv", "fig.pdf", "fig.png"]


def test_a_sweep_subdir_part_over_255_bytes_is_refused_before_any_job(tmp_path):
    res = cli_in_process("-m", "M=1,2", "R=2", "output.plot=false",
                         f"hydra.sweep.dir={tmp_path}/sw",
                         "hydra.sweep.subdir=" + "a" * 300 + "${hydra.job.num}")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        "fnsysid: error: hydra.sweep.subdir: a part of it is longer than 255 bytes")
    assert not (tmp_path / "sw").exists()


def test_a_job_folder_named_by_long_overrides_is_cut_with_a_hash():
    from fnsysid.config.groups import job_dirname

    a, b = job_dirname("K=[" + "1," * 150 + "1]"), job_dirname("K=[" + "1," * 150 + "2]")
    assert a != b and len(a.encode()) <= 255 and a.startswith("K=[1,1,")
    assert job_dirname("M=5,seed=1") == "M=5,seed=1"
