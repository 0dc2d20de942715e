"""The Python API's overrides as the command line's text: a list of ``key=value`` strings or a
mapping of plain values (numpy scalars, lists and string-keyed mappings of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fnsysid.config.argv import encode
from fnsysid.config.errors import ConfigError


def as_overrides(overrides) -> list[str]:
    """Overrides as the command line's strings: a list of ``key=value`` or a mapping."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError("overrides must be a list of 'key=value' strings or a dict, not one "
                          "string")
    if isinstance(overrides, Mapping):
        for k in overrides:
            if not isinstance(k, str):
                raise ConfigError(f"overrides: the key {k!r} ({type(k).__name__}) is not a "
                                  "setting name; keys are strings such as 'M', 'system' or "
                                  "'data.states'")
        return [f"{k}={encode(plain(v, k))}" for k, v in overrides.items()]
    try:
        items = list(overrides)
    except TypeError:
        raise ConfigError(f"overrides: a value of type {type(overrides).__name__} is not a list "
                          "of 'key=value' strings or a dict") from None
    for n, o in enumerate(items, start=1):
        if not isinstance(o, str):
            raise ConfigError(f"overrides: item {n} (the {type(o).__name__} {o!r}) is not an "
                              "override string; allowed: 'key=value' strings such as 'M=20' (or "
                              "a dict {'M': 20})")
    return [str(o) for o in items]


def plain(value, key: str):
    """An override's value as plain Python (what :func:`encode` writes): numpy scalars become
    the int, float, bool or str they are; lists, tuples and string-keyed mappings are taken
    item by item; any other object is refused in one line naming ``key``."""
    if type(value).__module__ == "numpy":         # np.float64 is also a float: first
        import numpy as np

        if isinstance(value, np.generic) and isinstance(value.item(), (bool, int, float, str)):
            return value.item()
    if value is None or isinstance(value, (bool, str, Path)):
        return value
    if isinstance(value, (int, float)):             # an int or float of a subclass: plain
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, (list, tuple)):
        return [plain(v, key) for v in value]
    if isinstance(value, Mapping):
        for k in value:
            if not isinstance(k, str):
                raise ConfigError(f"{key}: the key {k!r} ({type(k).__name__}) is not a "
                                  "setting name; keys are strings")
        return {k: plain(v, f"{key}.{k}") for k, v in value.items()}
    hint = (" (a numpy array: give value.tolist())" if type(value).__name__ == "ndarray"
            else " (trajectories in a DataFrame: fnsysid.FederatedSysID().fit(df) takes them)"
            if type(value).__name__ == "DataFrame" else "")
    raise ConfigError(f"{key}: a value of type {type(value).__name__} is not a setting value"
                      f"{hint}; allowed: str, int, float, bool, None (numpy scalars too), and "
                      "lists and dicts of them")
