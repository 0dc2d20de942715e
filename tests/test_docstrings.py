"""The public API's docstrings are typed numpydoc: every parameter of the signature listed as
``name : type`` (``, default=<the signature's default>`` where it has one, and only there),
nothing listed that the signature does not take, and a Returns section."""

from __future__ import annotations

import inspect
import re

import pytest

import fnsysid
from fnsysid.app.estimator import FederatedSysID
from fnsysid.app.experiment import Result

#: the public callables (fnsysid's names, the estimator's methods, Result's methods)
PUBLIC = {
    "fnsysid.run": fnsysid.run,
    "fnsysid.load_trajectories": fnsysid.load_trajectories,
    **{f"FederatedSysID.{name}": getattr(FederatedSysID, name)
       for name in ("fit", "load", "get_params", "set_params", "coefficients", "equations",
                    "predict", "simulate", "score", "nrmse", "plot_fit")},
    "Result.plot_fit": Result.plot_fit,
    "Result.plot_errors": Result.plot_errors,
}

#: ``name : type`` at the section's indentation (names may be a comma-separated list)
ENTRY = re.compile(r"^(?P<names>\*{0,2}[A-Za-z_][\w, *]*?) : (?P<type>.+)$")


def sections(doc: str) -> dict[str, list[str]]:
    """numpydoc sections of a cleaned docstring: title -> its lines."""
    out, title = {}, None
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"} and line.strip():
            title = line.strip()
            out[title] = []
        elif title is not None and not set(line.strip()) == {"-"}:
            out[title].append(line)
    return out


def documented(doc: str) -> dict[str, str]:
    """Parameter name -> its type line, from the Parameters section."""
    entries = {}
    for line in sections(doc).get("Parameters", []):
        if line.startswith(" ") or not line.strip():
            continue                                  # a description line
        m = ENTRY.match(line)
        assert m, f"not 'name : type': {line!r}"
        for name in m["names"].split(","):
            entries[name.strip().lstrip("*")] = m["type"]
    return entries


def signature(f) -> dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(f).parameters.items() if k not in ("self", "cls")}


def check(doc: str, params: dict[str, inspect.Parameter], returns: bool = True) -> None:
    entries = documented(doc)
    assert set(entries) == set(params), (set(entries) ^ set(params))
    for name, p in params.items():
        default = re.search(r", default=(.+)$", entries[name])
        if p.kind is p.VAR_KEYWORD or p.default is p.empty:
            assert default is None, f"{name}: no default in the signature"
        else:
            assert default, f"{name}: the signature's default {p.default!r} is not stated"
            assert default[1] == repr(p.default).replace("'", '"'), (name, default[1])
    if returns:
        assert sections(doc).get("Returns"), "no Returns section"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_callables_are_typed_numpydoc(name):
    f = PUBLIC[name]
    check(inspect.getdoc(f), signature(f))


def test_the_estimators_constructor_is_documented_in_its_class_docstring():
    check(inspect.getdoc(FederatedSysID), signature(FederatedSysID.__init__), returns=False)


def test_the_check_sees_a_missing_or_wrong_entry():
    """The check itself: a parameter left out, one too many, a default not stated or a
    different one each fail."""
    def f(a, b=0.01, *, kind="one_step"):
        pass

    good = """Summary.

    Parameters
    ----------
    a : int
        A.
    b : float, default=0.01
        B.
    kind : {"one_step", "free_run"}, default="one_step"
        Kind.

    Returns
    -------
    int
    """
    check(inspect.cleandoc(good), signature(f))
    for bad in (good.replace("    a : int\n        A.\n", ""),
                good.replace("    a : int\n", "    a : int\n    c : int\n"),
                good.replace("float, default=0.01", "float"),
                good.replace("default=0.01", "default=0.1"),
                good.replace("    a : int", "    a : int, default=1"),
                good.split("    Returns")[0]):
        with pytest.raises(AssertionError):
            check(inspect.cleandoc(bad), signature(f))
