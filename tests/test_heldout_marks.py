"""The marks of held-out data (``summary.json: heldout``), by which ``fnsysid compare`` tells
runs scored on the same held-out data from runs scored on other data."""

import numpy as np

from fnsysid.data.heldout import heldout_fingerprint, heldout_marks


def _data(seed=0, S=2, m=4, J=2, L=6, n_x=2, n_u=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, m, J, L, n_x))
    u = rng.normal(size=(S, m, J, L - 1, n_u))
    mask = np.ones((S, m, J, L), bool)
    mask[:, 1, 1, 4:] = False                        # client 1's second run is shorter
    return x, u, mask


def test_a_mark_is_a_52_bit_integer_of_the_samples_alone():
    x, u, mask = _data()
    h = heldout_marks(x, u, mask)
    assert h.shape == (2, 4) and (h > 0).all() and (h == np.floor(h)).all()
    assert h.max() < 2.0 ** 52 and len(np.unique(h)) == h.size
    # padding: values where no sample exists do not count, nor does a longer padding
    x2 = x.copy()
    x2[:, 1, 1, 4:] = 99.0
    u2 = np.concatenate([u, np.full(u.shape[:3] + (3, 1), 7.0)], axis=3)
    x3 = np.concatenate([x2, np.zeros(x.shape[:3] + (3, 2))], axis=3)
    m3 = np.concatenate([mask, np.zeros(mask.shape[:3] + (3,), bool)], axis=3)
    np.testing.assert_array_equal(heldout_marks(x3, u2, m3), h)
    # a few ulps (the same sample computed in another order) give the same mark
    np.testing.assert_array_equal(heldout_marks(x * (1 + 4e-16), u, mask), h)


def test_any_change_of_the_held_out_samples_changes_the_fingerprint():
    x, u, mask = _data()
    base = heldout_fingerprint(heldout_marks(x, u, mask))
    shifted = x.copy()
    shifted[..., 0] += 1.0                           # another operating point, same spread
    flipped = -x                                     # mirrored states
    reordered = x[:, :, :, ::-1]                     # the samples in another order
    one = x.copy()
    one[1, 2, 0, 3, 1] *= 1 + 1e-6                   # one value of one client
    others = {heldout_fingerprint(heldout_marks(a, u, mask))
              for a in (shifted, flipped, reordered, one)}
    others.add(heldout_fingerprint(heldout_marks(x, 2 * u, mask)))     # other inputs
    others.add(heldout_fingerprint(heldout_marks(x[:1], u[:1], mask[:1])))   # fewer repeats
    assert base not in others and len(others) == 6


def test_a_mark_ignores_the_order_of_a_clients_trajectories():
    # trajectories named otherwise in a file come in another order: the same samples
    x, u, mask = _data(J=3)
    h = heldout_marks(x, u, mask)
    order = [2, 0, 1]
    np.testing.assert_array_equal(heldout_marks(x[:, :, order], u[:, :, order],
                                                mask[:, :, order]), h)
    # but samples moved from one trajectory to another are other data
    swapped = x.copy()
    swapped[:, :, 0, 2], swapped[:, :, 1, 2] = x[:, :, 1, 2], x[:, :, 0, 2]
    assert (heldout_marks(swapped, u, mask) != h).all()


def test_the_fingerprint_ignores_the_clients_order_and_those_without_held_out_data():
    x, u, mask = _data()
    h = heldout_marks(x, u, mask)
    base = heldout_fingerprint(h)
    assert heldout_fingerprint(h[:, ::-1]) == base                   # clients renamed
    assert heldout_fingerprint(np.concatenate([h, np.zeros((2, 3))], axis=1)) == base
    assert heldout_fingerprint(h[:, 1:]) != base                     # a client fewer
    assert heldout_fingerprint(np.zeros((2, 3))) is None
