"""Checks of user settings, each failing with a one-line message naming the setting."""

from __future__ import annotations

import numbers


class ConfigError(ValueError):
    """A setting outside its allowed values."""


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


#: top-level knobs: name -> (meaning, predicate, what is allowed)
KNOBS = {
    "M": ("number of clients", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "N": ("trajectories per client",
          lambda v: (_is_int(v) and v >= 1) or (isinstance(v, (list, tuple)) and len(v) > 0
                                                and all(_is_int(x) and x >= 1 for x in v)),
          "an integer >= 1, or a list of M such integers"),
    "T": ("trajectory length", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "eps": ("heterogeneity", lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    "K": ("local steps per round", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "lr": ("learning rate", lambda v: _is_num(v) and v > 0 and v != float("inf"), "a number > 0"),
    "R": ("communication rounds", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "repeats": ("independent repetitions", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "seed": ("root random seed", lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
}


def check_knob(name: str, value) -> None:
    """Raise :class:`ConfigError` if ``value`` is not allowed for knob ``name``."""
    meaning, ok, allowed = KNOBS[name]
    if isinstance(value, (list, tuple)) and name != "N":
        ok_value = False
    else:
        try:
            ok_value = bool(ok(value))
        except TypeError:
            ok_value = False
    if not ok_value:
        raise ConfigError(f"{name}={_show(value)} is not allowed: {name} ({meaning}) must be "
                          f"{allowed}")


def _show(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def check_run(cfg) -> None:
    """Check every knob and the cross-setting constraints of a composed run config."""
    for name in KNOBS:
        check_knob(name, plain(cfg[name]))
    N = plain(cfg.N)
    if isinstance(N, list) and len(N) != cfg.M:
        raise ConfigError(f"N has {len(N)} entries but M={cfg.M}: a list N gives one "
                          "trajectory count per client")
    bs = cfg.optimizer.get("batch_size")
    if bs is not None and cfg.data.get("source", "simulated") == "simulated":
        # with data from files the check runs once the files are read
        check_batch_size(bs, (min(N) if isinstance(N, list) else N) * cfg.T)


def check_batch_size(bs, n_min: int | None = None) -> None:
    """``optimizer.batch_size`` must lie in ``1..N*T`` (``n_min`` = smallest N_i T, if known)."""
    if not (_is_int(bs) and bs >= 1 and (n_min is None or bs <= n_min)):
        upper = "N*T" if n_min is None else f"N*T = 1..{n_min}"
        raise ConfigError(f"optimizer.batch_size={bs} is not allowed: it must be an integer in "
                          f"1..{upper}")


def plain(v):
    """A config value as a plain Python object (lists of a ListConfig become lists)."""
    from omegaconf import ListConfig, OmegaConf

    return OmegaConf.to_container(v) if isinstance(v, ListConfig) else v
