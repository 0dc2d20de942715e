"""Feature libraries: names, values, composition and argument checks."""

import numpy as np
import pytest

from fnsysid.dynamics.features import Concat, Fourier, Identity, Polynomial


def test_polynomial_values_and_names():
    lib = Polynomial(degree=2, variables="xu", bias=True)
    names = lib.feature_names(2, 1)
    assert names == ["1", "x0", "x1", "u0", "x0^2", "x0*x1", "x0*u0", "x1^2", "x1*u0", "u0^2"]
    x, u = np.array([[2.0, 3.0]]), np.array([[5.0]])
    np.testing.assert_allclose(lib.transform(x, u)[0], [1, 2, 3, 5, 4, 6, 10, 9, 15, 25])


def test_fourier_and_identity_compose_with_plus():
    lib = Fourier("x", n_frequencies=2) + Identity("u", bias=True)
    assert isinstance(lib, Concat)
    assert lib.feature_names(1, 1) == ["sin(x0)", "cos(x0)", "sin(2x0)", "cos(2x0)", "1", "u0"]
    out = lib.transform(np.array([[np.pi / 2]]), np.array([[7.0]]))[0]
    np.testing.assert_allclose(out, [1, 0, 0, -1, 1, 7], atol=1e-12)


def test_batch_axes_are_kept():
    lib = Polynomial(3)
    assert lib.transform(np.zeros((4, 6, 2)), np.zeros((4, 6, 1))).shape == (4, 6, 20)


@pytest.mark.parametrize("make, word", [
    (lambda: Polynomial(degree=0), "degree"),
    (lambda: Identity(variables="y"), "variables"),
    (lambda: Fourier(sin=False, cos=False), "sin"),
    (lambda: Concat([]), "libraries"),
])
def test_bad_arguments_are_refused(make, word):
    with pytest.raises(ValueError, match=word):
        make()
