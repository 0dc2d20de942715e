"""The marks of held-out data (``summary.json: heldout``), by which ``fnsysid compare`` tells
runs scored on the same held-out data from runs scored on other data."""

import numpy as np

from fnsysid.data.heldout import heldout_fingerprint, heldout_marks


def _data(seed=0, S=2, M=4, n_x=3):
    rng = np.random.default_rng(seed)
    return rng.integers(5, 50, size=(S, M)), rng.uniform(0.1, 10.0, size=(S, M, n_x))


def test_a_mark_is_a_52_bit_integer_and_0_without_held_out_data():
    n, std = _data()
    n[1, 2] = 0
    h = heldout_marks(n, std)
    assert h.shape == n.shape and h[1, 2] == 0.0 and (np.delete(h.ravel(), 6) > 0).all()
    assert (h == np.floor(h)).all() and h.max() < 2.0 ** 52
    assert len(np.unique(h)) == h.size                       # every client its own mark
    assert heldout_fingerprint(np.zeros((2, 3))) is None


def test_the_fingerprint_sees_any_change_of_the_samples_but_not_round_off():
    n, std = _data()
    base = heldout_fingerprint(heldout_marks(n, std))
    assert len(base) == 16 and base == heldout_fingerprint(heldout_marks(n, std.copy()))
    # the same spreads summed in another order differ by a few ulps: the same data
    assert heldout_fingerprint(heldout_marks(n, std * (1 + 4e-16))) == base
    changed = std.copy()
    changed[0, 1, 2] *= 1 + 1e-6                             # one state of one client
    fewer = n.copy()
    fewer[1, 3] -= 1                                         # one transition fewer
    swapped = std[:, [1, 0, 2, 3]]                           # two clients' data exchanged
    others = {heldout_fingerprint(heldout_marks(n, changed)),
              heldout_fingerprint(heldout_marks(fewer, std)),
              heldout_fingerprint(heldout_marks(n, swapped)),
              heldout_fingerprint(heldout_marks(n[:1], std[:1]))}     # fewer repeats
    assert base not in others and len(others) == 4
