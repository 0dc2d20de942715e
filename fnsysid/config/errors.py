"""The errors of bad input, and values shown as a user would type them."""

from __future__ import annotations

from collections.abc import Mapping


class ConfigError(ValueError):
    """A setting, a combination of settings or an argument that is not allowed (its message
    is one line naming the setting and what is allowed)."""


class DataError(ConfigError):
    """A trajectory or truth file that cannot be used as it is."""


def some(items, n: int) -> list:
    """The first ``n`` of ``items``, and ``"..."`` after them if there are more (lists of
    names in messages and summaries)."""
    items = list(items)
    return items[:n] + ["..."] * (len(items) > n)


def show(value) -> str:
    """A value as the user would type it on the command line (``'false'`` for the string,
    ``false`` for the boolean)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"'{value}'" if _looks_typed(value) else value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _looks_typed(text: str) -> bool:
    """True if Hydra would read ``text`` unquoted as a number, boolean or null (or it is blank)."""
    if text.strip() != text or not text or " " in text:
        return True
    if text.lower() in ("true", "false", "null", "nan", "inf", "-inf", "+inf"):
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (Hydra and OmegaConf messages span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "reference_type="))]
    return "; ".join(keep[:3]) if keep else type(exc).__name__
