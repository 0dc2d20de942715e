"""feature_map=combined: libraries named by kind side by side, each feature once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fnsysid.dynamics.features import Combined, Fourier, Identity, Library, Polynomial
from tests.conftest import engine


class StatesAndSines(Library):
    """The hand-written map a pendulum fleet needed: the states, the inputs, sin of the states."""

    def transform(self, x, u):
        return np.concatenate([x, u, np.sin(x)], axis=-1)

    def feature_names(self, n_x, n_u):
        return ([f"x{j}" for j in range(n_x)] + [f"u{j}" for j in range(n_u)]
                + [f"sin(x{j})" for j in range(n_x)])


def test_identity_and_sin_are_the_hand_written_map_of_states_and_sines():
    rng = np.random.default_rng(0)
    x, u = rng.standard_normal((3, 7, 2)), rng.standard_normal((3, 7, 1))
    combined, own = Combined(["identity", "sin"]), StatesAndSines()
    assert combined.feature_names(2, 1) == own.feature_names(2, 1) == [
        "x0", "x1", "u0", "sin(x0)", "sin(x1)"]
    np.testing.assert_array_equal(combined.transform(x, u), own.transform(x, u))


def test_a_feature_two_libraries_make_is_kept_once_where_it_first_appears():
    rng = np.random.default_rng(1)
    x, u = rng.standard_normal((5, 2)), rng.standard_normal((5, 1))
    lib = Combined([{"kind": "identity", "bias": True}, "polynomial",
                    {"kind": "fourier", "n_frequencies": 2}, "sin"])
    names = lib.feature_names(2, 1)
    poly = Polynomial(degree=2).feature_names(2, 1)            # 1, x0, x1, u0, x0^2, ...
    fourier = Fourier(n_frequencies=2).feature_names(2, 1)     # sin(x0) ... cos(2x1)
    assert names == poly + fourier                             # identity's and sin's all seen
    assert len(set(names)) == len(names)
    full = np.concatenate([Polynomial(degree=2).transform(x, u),
                           Fourier(n_frequencies=2).transform(x, u)], axis=-1)
    np.testing.assert_array_equal(lib.transform(x, u), full)
    # a Combined inside a sum keeps its own features once
    assert (lib + Identity(variables="u")).feature_names(2, 1) == names + ["u0"]


@pytest.mark.parametrize("entry, words", [
    ("sine", "is not a library; allowed: identity, polynomial, fourier, sin, cos"),
    ({"kind": "sin", "cos": True}, "kind sin sets cos itself"),
])
def test_a_wrong_entry_is_named(entry, words):
    with pytest.raises(ValueError, match=words):
        Combined(["identity", entry])


def _pendulum_fleet(folder, clients=3, trajectories=5, T=40, dt=0.05):
    """Damped pendulums with a torque input, one CSV per client (theta, omega, u)."""
    rng = np.random.default_rng(2)
    folder.mkdir()
    for c in range(clients):
        a, d, b = 9.8 * (1 + 0.1 * c), 0.3 + 0.05 * c, 1.0 + 0.2 * c
        rows = []
        for k in range(trajectories):
            th, om = rng.uniform(-2, 2), rng.uniform(-1, 1)
            for t in range(T + 1):
                u = rng.standard_normal()
                rows.append((k, t, th, om, u))
                th, om = th + dt * om, om + dt * (-a * np.sin(th) - d * om + b * u)
        pd.DataFrame(rows, columns=["trajectory", "t", "theta", "omega", "u"]).to_csv(
            folder / f"robot{c}.csv", index=False)


@pytest.mark.slow
def test_combined_on_a_pendulum_fleet_equals_the_hand_written_map(tmp_path):
    _pendulum_fleet(tmp_path / "logs")
    base = ["system=generic", "data=files", f"data.path={tmp_path / 'logs'}",
            "data.states=[theta,omega]", "data.inputs=[u]", "R=30", "lr=0.1",
            "optimizer.reduction=mean", "progress=false"]
    combined = engine(*base, "feature_map=combined")
    own = engine(*base, f"+feature_map._target_={__name__}.StatesAndSines")
    assert combined.summary["status"] == own.summary["status"] == "ok"
    pd.testing.assert_frame_equal(combined.errors, own.errors, rtol=1e-12)
    pd.testing.assert_frame_equal(combined.estimates, own.estimates, rtol=1e-12)
    assert combined.summary["parameters"] == own.summary["parameters"]
    assert "omega+:sin(theta)" in combined.summary["parameters"]
    assert combined.errors["nrmse_1step_mean"].iloc[-1] < 0.5 * \
        combined.errors["nrmse_1step_mean"].iloc[0]            # it learns


@pytest.mark.parametrize("libraries, line", [
    ("[identity,sine]", "feature_map.libraries[1]=sine is not allowed: feature_map.libraries[1] "
     "must be a library kind (identity, polynomial, fourier, sin, cos), {kind: ..., <its keys>} "
     "or {_target_: ...}"),
    ("[identity,{kind:sine}]", "feature_map.libraries[1].kind=sine is not allowed: "
     "feature_map.libraries[1].kind must be one of identity, polynomial, fourier, sin, cos"),
    ("[{kind:sin,degree:2}]", "unknown setting 'feature_map.libraries[0].degree'; "
     "feature_map.libraries[0] has: kind, variables, n_frequencies"),
    ("[identity,{kind:polynomial,degree:0}]", "feature_map.libraries[1].degree=0 is not "
     "allowed: feature_map.libraries[1].degree must be an integer >= 1"),
])
def test_the_check_names_a_wrong_library_in_one_line(tmp_path, libraries, line):
    from fnsysid.app.preflight import preflight
    from fnsysid.config.checks import ConfigError

    with pytest.raises(ConfigError) as info:
        preflight(["system=synthetic", "feature_map=combined",
                   f"feature_map.libraries={libraries}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert str(info.value) == line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, line", [
    (["feature_map=combined", "feature_map.libraries=[identity]"],
     "feature_map=combined with feature_map.libraries=[identity] does not fit system=synthetic: "
     "its features lack sin(x0), sin(x1), sin(x2); options that fit: combined with its default "
     "libraries=[identity,sin], default, fourier"),
    (["feature_map=polynomial", "feature_map.degree=4"],
     "feature_map=polynomial with feature_map.degree=4 does not fit system=synthetic: its "
     "features lack sin(x0), sin(x1), sin(x2); options that fit: combined, default, fourier"),
    (["feature_map=polynomial"],
     "feature_map=polynomial does not fit system=synthetic: its features lack sin(x0), sin(x1), "
     "sin(x2); options that fit: combined, default, fourier"),
])
@pytest.mark.slow
def test_a_map_that_does_not_fit_is_named_as_chosen(tmp_path, overrides, line):
    from fnsysid.app.preflight import preflight
    from fnsysid.config.checks import ConfigError

    with pytest.raises(ConfigError) as info:
        preflight(["system=synthetic", *overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    assert str(info.value) == line
    assert not (tmp_path / "run").exists()


def test_the_default_combined_map_fits_the_dense_systems():
    from tests.conftest import make

    for system, own in (("synthetic", ["sin(x0)", "u0"]), ("linear", ["x0", "u0"])):
        model = make(f"system={system}", "feature_map=combined")[1]    # refused if no fit
        assert isinstance(model.library, Combined)
        assert set(own) <= set(model.library.feature_names(model.system.n_x,
                                                           model.system.n_u))


def test_generic_names_every_feature_by_its_columns(tmp_path):
    _pendulum_fleet(tmp_path / "logs", clients=2, trajectories=3, T=10)
    res = engine("system=generic", "data=files", f"data.path={tmp_path / 'logs'}",
                 "data.states=[theta,omega]", "data.inputs=[u]", "R=1", "progress=false",
                 "feature_map=combined",
                 "feature_map.libraries=[identity,{kind:sin,n_frequencies:2},"
                 "{kind:polynomial,bias:false}]")
    names = [p.split(":", 1)[1] for p in res.summary["parameters"] if p.startswith("omega+:")]
    assert names == ["theta", "omega", "u", "sin(theta)", "sin(omega)", "sin(2theta)",
                     "sin(2omega)", "theta^2", "theta*omega", "theta*u", "omega^2", "omega*u",
                     "u^2"]
