"""File data whose clients differ widely in length: statistics and held-out data built per
length class, not padded to the longest client; the memory estimate and FNSYSID_MEMORY_LIMIT
for file data."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest

import fnsysid.data.source as source
from fnsysid.app.build import build
from fnsysid.app.experiment import run_experiment
from fnsysid.data.heldout import heldout_from_trajectories
from fnsysid.dynamics.model import ragged_chunks, ragged_stats, sample_stats
from tests.conftest import cli_in_process, compose_cfg

A = np.array([[0.9, 0.2], [-0.1, 0.8]])
B = np.array([0.0, 0.5])
GENERIC = ["system=generic", "data=files", "data.states=[x1,x2]", "data.inputs=[u]",
           "output.plot=false"]


def ragged_fleet(path, shape, noise=0.05, seed=0):
    """One CSV of clients ``shape`` = [(trajectories, samples per trajectory), ...] of
    x+ = A_c x + B u + noise (A_c a little different per client); returns the truth table."""
    rng = np.random.default_rng(seed)
    parts, truth = [], []
    for c, (n_traj, length) in enumerate(shape):
        Ac = A + 0.02 * rng.standard_normal(A.shape)
        for j in range(n_traj):
            x = np.empty((length, 2))
            x[0] = rng.standard_normal(2)
            u = rng.standard_normal(length)
            w = noise * rng.standard_normal((length, 2))
            for t in range(length - 1):
                x[t + 1] = Ac @ x[t] + B * u[t] + w[t]
            parts.append(pd.DataFrame({"client": f"c{c:04d}", "trajectory": j,
                                       "t": np.arange(length), "x1": x[:, 0], "x2": x[:, 1],
                                       "u": u}))
        theta = np.concatenate([Ac, B[:, None]], axis=1)
        truth += [{"client": f"c{c:04d}", "parameter": f"{s}+:{f}", "value": theta[i, k]}
                  for i, s in enumerate(["x1", "x2"]) for k, f in enumerate(["x1", "x2", "u"])]
    pd.concat(parts).to_csv(path, index=False)
    return pd.DataFrame(truth)


def padded_stats(model, Phi, Y, count):
    """The statistics as they were built before: every segment padded to the longest."""
    seg = np.repeat(np.arange(len(count)), count)
    pos = np.arange(len(seg)) - np.concatenate([[0], np.cumsum(count)[:-1]])[seg]
    n_max = int(count.max())
    P = np.zeros((len(count), n_max, Phi.shape[1]))
    Yp = np.zeros((len(count), n_max, Y.shape[1]))
    W = np.zeros((len(count), n_max))
    P[seg, pos], Yp[seg, pos], W[seg, pos] = Phi, Y, 1.0
    return sample_stats(model, P, Yp, W)


def padded_heldout(model, rows, S, M, states, inputs):
    """The held-out data as they were built before: every client padded to the most
    trajectories and the longest trajectory of the fleet."""
    (rep, cl, jj, t_pos), _ = source._heldout_layout(rows, M)
    J, L = int(jj.max()) + 1, int(t_pos.max()) + 1
    x = np.zeros((S, M, J, L, len(states)))
    u = np.zeros((S, M, J, L, len(inputs)))
    mask = np.zeros((S, M, J, L), bool)
    at = (rep, cl, jj, t_pos)
    x[at], u[at], mask[at] = rows[states].to_numpy(float), rows[inputs].to_numpy(float), True
    return heldout_from_trajectories(model, x, u[..., :-1, :], mask)


@pytest.mark.parametrize("count, bitwise", [
    (np.full(300, 37), True),                          # one length: one padded call, as before
    (np.r_[np.full(200, 2), 2000], False),             # one segment 1000 times the others
    (np.random.default_rng(1).integers(1, 600, 400), False),
])
@pytest.mark.slow
def test_ragged_statistics_equal_the_padded_ones(count, bitwise):
    model = build(compose_cfg(*GENERIC, "data.path=x", "feature_map=polynomial"))[0]
    rng = np.random.default_rng(0)
    n_y, n_phi = model.structure.shape[:2]
    Phi, Y = rng.standard_normal((count.sum(), n_phi)), rng.standard_normal((count.sum(), n_y))
    got, want = ragged_stats(model, Phi, Y, count), padded_stats(model, Phi, Y, count)
    for g, w in zip(got, want, strict=True):
        if bitwise:
            assert np.array_equal(g, w)
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())
    # the chunks cover every segment once, each within a factor 2 of its chunk's longest
    chunks = ragged_chunks(count, 10)
    assert np.array_equal(np.sort(np.concatenate(chunks)), np.arange(len(count)))
    assert all(count[c].max() < 2 * count[c].min() or count[c].max() <= 2 for c in chunks)


@pytest.mark.slow
def test_ragged_fleet_gives_the_results_of_the_padded_path(tmp_path, monkeypatch):
    # clients of 3 to 8 trajectories of 3 to 400 samples: several length classes in training
    # and in held-out data
    shape = [(3, 3)] * 6 + [(4, 40)] * 3 + [(5, 400), (8, 17), (3, 150)]
    truth = ragged_fleet(tmp_path / "fleet.csv", shape)
    truth.to_csv(tmp_path / "truth.csv", index=False)
    over = [*GENERIC, f"data.path={tmp_path / 'fleet.csv'}", f"data.truth={tmp_path / 'truth.csv'}",
            "R=40", "output.eval_every=10", "output.per_client=true"]
    run_experiment(compose_cfg(*over), tmp_path / "ragged")
    cfg = compose_cfg(*over)
    model, optimizer, _ = build(cfg)
    ho = source.load_data(cfg, model, optimizer).heldout
    assert len(ho.blocks) > 1                      # the held-out data are in several blocks
    monkeypatch.setattr(source, "ragged_stats", padded_stats)
    monkeypatch.setattr(source, "_heldout", padded_heldout)
    run_experiment(compose_cfg(*over), tmp_path / "padded")
    ref = source.load_data(cfg, model, optimizer).heldout
    assert len(ref.blocks) == 1
    (x, u, mask), (x_ref, u_ref, mask_ref) = ho.padded(), ref.padded()
    assert np.array_equal(x, x_ref) and np.array_equal(mask, mask_ref)
    used = mask[..., 1:]                        # inputs of a sample with a successor
    assert np.array_equal(u[used], u_ref[used])
    for name in ("errors.csv", "clients.csv", "estimates.csv"):
        a, b = pd.read_csv(tmp_path / "ragged" / name), pd.read_csv(tmp_path / "padded" / name)
        assert a.columns.tolist() == b.columns.tolist() and len(a) == len(b)
        num = a.select_dtypes("number").columns
        assert a[num].isna().equals(b[num].isna())
        np.testing.assert_allclose(a[num], b[num], rtol=1e-12, atol=1e-14)
    errors = pd.read_csv(tmp_path / "ragged" / "errors.csv")
    assert errors["e_max"].iloc[-1] < 0.5 * errors["e_max"].iloc[0]


@pytest.mark.slow
def test_very_ragged_fleet_is_built_within_its_estimate(tmp_path):
    # 200 clients of 2 trajectories of 2 samples and one of 2 trajectories of 20000
    ragged_fleet(tmp_path / "fleet.csv", [(2, 2)] * 200 + [(2, 20000)])
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'fleet.csv'}", "data.holdout=0.5")
    model, optimizer, _ = build(cfg)
    needs = []
    tracemalloc.start()
    try:
        ds = source.load_data(cfg, model, optimizer, budget=lambda need, what: needs.append(need))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows, n_phi = 201 * 2 * 2 + 2 * 20000, 3
    # clients x longest, as before: training samples and held-out trajectories
    padded = 201 * 20000 * 8 * ((n_phi + 2 + 1) + (2 + 1 + 1))
    arrays = [a for part in (ds.train, ds.heldout, *ds.heldout.blocks)
              for a in vars(part).values() if isinstance(a, np.ndarray)]
    built = sum(a.nbytes for a in arrays)
    assert ds.train.n[0, -1] == 19999 and ds.heldout.n[0, -1] == 19999
    assert built < 20 * rows * 8 * (n_phi + 2 + 3)    # a few values per row and client
    assert built < padded / 50
    assert len(needs) == 1 and peak < needs[0] < padded / 5, (peak, needs, padded)
    # held-out: the long client in a block of its own, the short ones padded to 2 samples
    sizes = sorted(b.mask.shape[1:] for b in ds.heldout.blocks)
    assert sizes == [(1, 1, 20000), (200, 1, 2)]


@pytest.mark.slow
def test_file_data_over_the_memory_limit_are_refused_before_reading(tmp_path, monkeypatch):
    ragged_fleet(tmp_path / "fleet.csv", [(2, 2)] * 50 + [(1, 3000)])
    out = tmp_path / "out"
    run = [*GENERIC, f"data.path={tmp_path / 'fleet.csv'}", f"hydra.run.dir={out}"]
    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", "1e6")
    res = cli_in_process(*run)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fnsysid: error: data.path={tmp_path / 'fleet.csv'}: reading its 3200 rows needs about")
    assert "above the limit of 977 KiB (FNSYSID_MEMORY_LIMIT=1e6)" in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_sgd_on_a_ragged_fleet_over_the_limit_is_refused_once_read(tmp_path, monkeypatch):
    from fnsysid.app.resources import estimate_file_bytes

    ragged_fleet(tmp_path / "fleet.csv", [(2, 2)] * 300 + [(1, 5000)])
    out = tmp_path / "out"
    run = [*GENERIC, f"data.path={tmp_path / 'fleet.csv'}", f"hydra.run.dir={out}",
           "optimizer=sgd", "optimizer.batch_size=1", "R=2"]
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'fleet.csv'}")
    reading = estimate_file_bytes(cfg, build(cfg)[0])[0]
    # the rows fit; SGD's samples padded to the longest client (301 x 5000) do not
    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", str(reading + 20 * 2**20))
    res = cli_in_process(*run)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"fnsysid: error: data.path={tmp_path / 'fleet.csv'} (6200 rows, "
                               "301 clients, the longest client 5000 samples; optimizer=sgd")
    assert "these data need about" in lines[0] and "above the limit of" in lines[0]
    assert not out.exists()
    # with full-batch GD the same data fit and run
    res = cli_in_process(*run[:-3], "R=2")
    assert res.returncode == 0, res.stderr
    assert (out / "summary.json").exists()


def test_rows_are_counted_without_reading_the_data(tmp_path):
    import os

    from fnsysid.data.memory import file_counts

    df = pd.DataFrame({"t": range(7), "x1": 0.5, "x2": 1.5, "u": 2.5})
    df.to_parquet(tmp_path / "a.parquet", index=False)
    df.to_csv(tmp_path / "b.csv", index=False)
    (tmp_path / "c.csv").write_text("t,x1\n0,1\n1,2")          # no newline at the end
    assert file_counts([tmp_path / "a.parquet"]) == (7, 4)
    assert file_counts([tmp_path / "b.csv"]) == (7, 4)
    assert file_counts([tmp_path / "c.csv"]) == (2, 2)
    # a FIFO is not opened (it would block), a missing file counts nothing
    os.mkfifo(tmp_path / "d.csv")
    assert file_counts([tmp_path / "d.csv", tmp_path / "e.csv", tmp_path / "a.parquet"]) == (7, 4)
