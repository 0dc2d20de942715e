"""Random streams: heterogeneity draws, independence, invariance when M or N grows."""

import numpy as np
import pytest

from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import generate
from tests.conftest import make


def test_gamma_draws_lie_in_zero_eps():
    _, model, *_ = make("system=pendulum")
    data = generate(model, M=2000, N=1, T=1, eps=0.3, repeats=2, seed=0)
    gamma = data.theta_true - model.system.nominal              # directions = identity
    assert gamma.min() >= 0.0 and gamma.max() <= 0.3
    # uniform on [0, eps]: mean eps/2 and spread close to the ends
    assert abs(gamma.mean() - 0.15) < 0.01 and gamma.min() < 0.003 and gamma.max() > 0.297


def test_client_data_unchanged_when_m_grows_across_a_block():
    _, model, *_ = make("system=synthetic")
    small = generate(model, M=3, N=4, T=5, eps=0.1, repeats=2, seed=7)
    big = generate(model, M=rnd.BLOCK + 5, N=4, T=5, eps=0.1, repeats=2, seed=7)
    for name in ("theta_true", "H", "b", "yy"):
        np.testing.assert_array_equal(getattr(big, name)[:, :3], getattr(small, name))
    # clients of the second block are new draws, not copies of the first block
    assert not np.allclose(big.H[:, rnd.BLOCK], big.H[:, 0])


def test_blocks_double_up_to_block_then_stay_at_block():
    sizes = [rnd.block_size(b) for b in range(10)]
    assert sizes == [16, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024]
    ids = np.arange(3 * rnd.BLOCK + 7)
    of = rnd.block_of(ids)
    starts = np.array([rnd.block_start(b) for b in of])
    assert (starts <= ids).all() and (ids < starts + [rnd.block_size(b) for b in of]).all()
    assert (np.diff(of) >= 0).all() and [rnd.block_of(int(i)) for i in (0, 31, 32, 1024)] == \
        [0, 1, 2, 7]
    for m in (1, 16, 17, 100, rnd.BLOCK, rnd.BLOCK + 1, 5000):
        blks = rnd.blocks(m)
        covered = [i for _, lo, hi in blks for i in range(lo, hi)]
        assert covered == list(range(m))
        assert all(lo == rnd.block_start(b) for b, lo, _ in blks)
        drawn = sum(rnd.block_size(b) for b, _, _ in blks)
        assert drawn < max(2 * m, rnd.FIRST + 1) if m <= rnd.BLOCK else drawn < m + rnd.BLOCK
    runs = rnd.chunks(rnd.blocks(3000), rnd.BLOCK)
    assert [len(r) for r in runs] == [7, 1, 1] and sum(runs, []) == rnd.blocks(3000)


def test_client_data_unchanged_when_m_grows_across_small_blocks():
    """Clients 0..19 of 20 (blocks of 16 and 16) are those of 100 and of 3 (one block)."""
    _, model, *_ = make("system=pendulum")
    kw = dict(N=3, T=5, eps=0.1, repeats=2, seed=11)
    m20, m100 = generate(model, M=20, **kw), generate(model, M=100, **kw)
    m3 = generate(model, M=3, **kw)
    for name in ("theta_true", "H", "b", "yy"):
        np.testing.assert_array_equal(getattr(m100, name)[:, :20], getattr(m20, name))
        np.testing.assert_array_equal(getattr(m20, name)[:, :3], getattr(m3, name))
    assert not np.allclose(m100.H[:, 16], m100.H[:, 0])     # block 1 is not block 0 again
    assert not np.allclose(m100.H[:, 32], m100.H[:, 16])


def test_a_client_built_alone_has_the_data_it_has_among_all():
    """What a federated node holding one client draws: the same system and data."""
    _, model, *_ = make("system=pendulum")
    N = [2, 3, 1, 4]
    full = generate(model, M=rnd.BLOCK + 4, N=N * (rnd.BLOCK // 4 + 1), T=5, eps=0.2,
                    repeats=2, seed=5)
    for i in (0, 2, 17, 100, rnd.BLOCK - 1, rnd.BLOCK + 1):
        one = generate(model, M=rnd.BLOCK + 4, N=N * (rnd.BLOCK // 4 + 1), T=5, eps=0.2,
                       repeats=2, seed=5, clients=[i])
        assert one.shape == (2, 1)
        for name in ("theta_true", "H", "b", "yy", "n", "phi2max"):
            np.testing.assert_allclose(getattr(one, name)[:, 0], getattr(full, name)[:, i],
                                       rtol=1e-12, atol=1e-14)
    two = generate(model, M=4, N=N, T=5, eps=0.2, repeats=2, seed=5, clients=[3, 1])
    np.testing.assert_allclose(two.H, full.H[:, [3, 1]], rtol=1e-12, atol=1e-14)


def test_trajectories_unchanged_when_n_grows():
    _, model, *_ = make("system=pendulum")
    few = generate(model, M=2, N=2, T=5, eps=0.1, repeats=1, seed=3, keep_samples=True)
    many = generate(model, M=2, N=[5, 2], T=5, eps=0.1, repeats=1, seed=3, keep_samples=True)
    np.testing.assert_array_equal(many.Phi[:, :, :10], few.Phi)
    np.testing.assert_array_equal(many.theta_true, few.theta_true)
    assert many.n[0].tolist() == [25, 10]


def test_noise_is_independent_across_clients_repeats_and_seeds():
    _, model, *_ = make("system=linear")
    d = generate(model, M=3, N=2, T=5, eps=0.1, repeats=2, seed=0, keep_samples=True)
    assert not np.allclose(d.Phi[0, 0], d.Phi[0, 1])       # clients
    assert not np.allclose(d.Phi[0, 0], d.Phi[1, 0])       # repeats
    assert not np.allclose(d.theta_true[0], d.theta_true[1])
    other = generate(model, M=3, N=2, T=5, eps=0.1, repeats=2, seed=1, keep_samples=True)
    assert not np.allclose(other.Phi, d.Phi)
    again = generate(model, M=3, N=2, T=5, eps=0.1, repeats=2, seed=0, keep_samples=True)
    np.testing.assert_array_equal(again.Phi, d.Phi)


def test_shared_noise_gives_every_client_the_same_noise():
    _, model, *_ = make("system=linear", "system.x0.scale=0.0")
    d = generate(model, M=3, N=2, T=5, eps=0.0, repeats=1, seed=0, keep_samples=True,
                 shared_noise=True)
    np.testing.assert_array_equal(d.Phi[0, 0], d.Phi[0, 2])   # eps = 0: identical clients


def test_truncated_normal_respects_its_cut():
    z = rnd.Noise(kind="truncnormal", scale=1.0, clip=1.0).sample(np.random.default_rng(0),
                                                                   (20000,))
    assert np.abs(z).max() <= 1.0
    assert 0.25 < z.std() < 0.6          # std of N(0,1) cut at +-1 is 0.54


def test_stream_batch_gives_each_stream_its_own_sequence_of_draws():
    noises = [rnd.Noise("truncnormal", scale=(1.0, 0.5), clip=0.6), rnd.Noise("zero"),
              rnd.Noise("normal", scale=2.0, loc=1.0), rnd.Noise("truncnormal", clip=0.3)]
    gens = lambda: [rnd.stream(5, rnd.TRAJECTORY, 0, b, 1) for b in range(4)]  # noqa: E731
    batch = rnd.StreamBatch(gens(), reserve=8)              # small: forces extra draws
    together = [nz.sample(batch, (7, 2)) for nz in noises]
    for g, alone in enumerate(gens()):
        for nz, got in zip(noises, together, strict=True):
            np.testing.assert_array_equal(got[g], nz.sample(alone, (7, 2)))
    assert (np.abs(together[3]) <= 0.3).all()               # rejection respected


def test_simulating_blocks_together_changes_no_number(monkeypatch):
    from fnsysid.dynamics import model as model_module
    from fnsysid.dynamics.systems import System

    _, model, *_ = make("system=pendulum")
    kw = dict(M=2 * rnd.BLOCK + 3, N=[2, 3] * rnd.BLOCK + [1, 2, 3], T=4, eps=0.1, repeats=2,
              seed=11)
    monkeypatch.setenv("FNSYSID_THREADS", "2")
    together = generate(model, **kw)
    monkeypatch.setattr(model_module, "CHUNK_VALUES", 1)              # one block at a time
    monkeypatch.setenv("FNSYSID_THREADS", "1")                         # in this thread
    monkeypatch.setattr(System, "batchable", property(lambda self: False))  # stream by stream
    alone = generate(model, **kw)
    for name in ("theta_true", "H", "b", "yy", "n", "phi2max", "phi_mean", "y_mean"):
        np.testing.assert_array_equal(getattr(together, name), getattr(alone, name))


def test_thread_count_is_checked(monkeypatch):
    from fnsysid.dynamics.model import threads

    monkeypatch.setenv("FNSYSID_THREADS", "3")
    assert threads(10) == 3 and threads(2) == 2 and threads(0) == 1
    monkeypatch.setenv("FNSYSID_THREADS", "many")
    with pytest.raises(ValueError, match="FNSYSID_THREADS=many"):
        threads(4)


def test_map_on_threads_keeps_the_order_and_a_job_that_maps_again_runs_inline(monkeypatch):
    """map_on_threads returns each job's result in the order of the jobs on two threads; a
    job that maps again (on a pool thread) runs its own jobs in its thread instead of waiting
    for the pool's threads, which are busy with the outer jobs (it would never return)."""
    import threading

    from fnsysid.dynamics.model import POOL_PREFIX, map_on_threads

    monkeypatch.setenv("FNSYSID_THREADS", "2")
    names = []

    def inner(i: int, j: int) -> int:
        names.append(threading.current_thread().name)
        return 10 * i + j

    def outer(i: int) -> list:
        return map_on_threads(inner, [(i, j) for j in range(3)])

    assert map_on_threads(outer, [(i,) for i in range(4)]) == [
        [10 * i + j for j in range(3)] for i in range(4)]
    assert len(names) == 12 and all(n.startswith(POOL_PREFIX) for n in names)
    assert map_on_threads(lambda x: x * x, [(x,) for x in range(7)]) == [x * x for x in range(7)]


def test_a_stream_made_again_is_the_generator_its_seed_sequence_makes(monkeypatch):
    """stream() keeps each stream's PCG64 state: made again (or after the store was
    cleared), it is still PCG64(SeedSequence(seed, spawn_key=(purpose, *key))): the same
    state, numbers, spawned children, seed-sequence words and attributes."""
    from fnsysid.dynamics import random as rnd

    monkeypatch.setattr(rnd, "_STATES", {})
    monkeypatch.setattr(rnd, "_STATES_MAX", 3)
    keys = [(0, rnd.TRAJECTORY, 0, 0, 3), (7, rnd.PARAMS, 2, 5), (2**40, rnd.SHUFFLE, 1, 0, 9),
            (0, rnd.TRAJECTORY, 0, 0, 4)]
    for _ in range(2):
        for seed, purpose, *key in keys:
            ours = rnd.stream(seed, purpose, *key)
            ref = np.random.Generator(np.random.PCG64(
                np.random.SeedSequence(entropy=seed, spawn_key=(purpose, *key))))
            assert ours.bit_generator.state == ref.bit_generator.state
            assert (ours.standard_normal(5) == ref.standard_normal(5)).all()
            assert [c.bit_generator.state for c in ours.spawn(2)] == \
                [c.bit_generator.state for c in ref.spawn(2)]
            assert (ours.bit_generator.seed_seq.generate_state(3)
                    == ref.bit_generator.seed_seq.generate_state(3)).all()
            mine, theirs = ours.bit_generator.seed_seq, ref.bit_generator.seed_seq
            for name in ("entropy", "spawn_key", "pool_size", "n_children_spawned", "state"):
                assert getattr(mine, name) == getattr(theirs, name), name
            assert repr(mine) == repr(theirs)
        assert 1 <= len(rnd._STATES) <= 3                   # cleared when full
