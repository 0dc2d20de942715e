"""Checks of user settings, each failing with a one-line message naming the setting."""

from __future__ import annotations

from fnsysid.config.schema import KNOBS, ConfigError, _is_int, check_config, show

__all__ = ["KNOBS", "ConfigError", "DataError", "check_knob", "check_run", "check_batch_size",
           "override_key", "plain"]


class DataError(ConfigError):
    """A trajectory or truth file that cannot be used as it is."""


def check_knob(name: str, value) -> None:
    """Raise :class:`ConfigError` if ``value`` is not allowed for knob ``name``."""
    meaning, spec = KNOBS[name]
    if not spec.ok(value):
        raise ConfigError(f"{name}={show(value)} is not allowed: {name} ({meaning}) must be "
                          f"{spec.allowed}")


def check_run(cfg) -> dict:
    """Check every knob and the cross-setting constraints of a composed run config; return
    the resolved settings of :func:`~fnsysid.config.schema.check_config`."""
    resolved = check_config(cfg)
    files = cfg.data.get("source", "simulated") == "files"
    if files:
        check_file_knobs(cfg)
    else:
        for key in ("M", "repeats"):
            if cfg[key] is None:
                raise ConfigError(f"{key}=null is not allowed: {key} ({KNOBS[key][0]}) "
                                  "must be an integer >= 1 (null only with data=files, whose "
                                  "files give it)")
    N = plain(cfg.N)
    if isinstance(N, list) and len(N) != cfg.M and not files:
        raise ConfigError(f"N has {len(N)} entries but M={cfg.M}: a list N gives one "
                          "trajectory count per client")
    K = plain(cfg.K)
    if isinstance(K, list) and len(K) != cfg.M and cfg.data.get("source") != "files":
        raise ConfigError(f"K has {len(K)} entries but M={cfg.M}: a list K gives one "
                          "step count per client")
    if isinstance(K, (list, dict)) and cfg.optimizer.get("batch_size") is not None:
        raise ConfigError("a list or distribution K (per-client local steps) needs "
                          "optimizer=gd")
    bs = cfg.optimizer.get("batch_size")
    if bs is not None and cfg.data.get("source", "simulated") == "simulated":
        # with data from files the check runs once the files are read
        check_batch_size(bs, (min(N) if isinstance(N, list) else N) * cfg.T)
    return resolved


#: knobs that describe simulated data; with data=files the files give them
FILE_KNOBS = ("N", "T", "eps")


def check_file_knobs(cfg) -> None:
    """With ``data=files``, refuse a value given for N, T or eps: the trajectories, their
    length and the clients' systems come from the files, so the value would be ignored.

    A knob left at its default is still the interpolation ``${system.knobs.<name>}``.
    """
    from omegaconf import OmegaConf

    for key in FILE_KNOBS:
        if key in cfg and not OmegaConf.is_interpolation(cfg, key):
            raise ConfigError(f"{key}={show(plain(cfg[key]))} does not apply with data=files: "
                              "the trajectories, their length and the clients' systems come "
                              "from the files; drop it")


def check_batch_size(bs, n_min: int | None = None) -> None:
    """``optimizer.batch_size`` must lie in ``1..N*T`` (``n_min`` = smallest N_i T, if known)."""
    if not (_is_int(bs) and bs >= 1 and (n_min is None or bs <= n_min)):
        upper = "N*T" if n_min is None else f"N*T = 1..{n_min}"
        raise ConfigError(f"optimizer.batch_size={bs} is not allowed: it must be an integer in "
                          f"1..{upper}")


def plain(v):
    """A config value as a plain Python object (a ListConfig becomes a list, a DictConfig a
    dict)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(v) if isinstance(v, (ListConfig, DictConfig)) else v


def override_key(line: str) -> str:
    """The setting an override line names: ``M`` for ``M=5``, ``+data.x=1`` or ``~M``."""
    return str(line).split("=", 1)[0].lstrip("+~")
