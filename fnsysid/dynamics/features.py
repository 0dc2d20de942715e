"""Feature libraries phi(x, u) for the dense (matrix-parameter) systems, in the style of PySINDy.

A library maps states ``x`` (..., n_x) and inputs ``u`` (..., n_u) to features (..., n_phi) and
names its features, so a system's true model can be located inside any library that contains
its features. Libraries compose with ``+``.

Examples
--------
>>> import numpy as np
>>> lib = Fourier(variables="x", cos=False) + Identity(variables="u")
>>> lib.feature_names(2, 1)
['sin(x0)', 'sin(x1)', 'u0']
>>> lib.transform(np.zeros((4, 2)), np.ones((4, 1))).shape
(4, 3)
"""

from __future__ import annotations

from itertools import combinations_with_replacement

import numpy as np

from fnsysid.config.registry import Registered

_VARIABLES = ("x", "u", "xu")


def _check_variables(variables: str) -> str:
    if variables not in _VARIABLES:
        raise ValueError(f"variables={variables!r}; allowed: {', '.join(_VARIABLES)}")
    return variables


def _inputs(variables: str, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    parts = {"x": [x], "u": [u], "xu": [x, u]}[variables]
    return np.concatenate(parts, axis=-1)


def _names(variables: str, n_x: int, n_u: int) -> list[str]:
    xs = [f"x{j}" for j in range(n_x)]
    us = [f"u{j}" for j in range(n_u)]
    return {"x": xs, "u": us, "xu": xs + us}[variables]


class Library(Registered):
    """Base class: ``transform(x, u)`` and ``feature_names(n_x, n_u)``."""

    config_group = "feature_map"

    def transform(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def feature_names(self, n_x: int, n_u: int) -> list[str]:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, x, u):
        return self.transform(x, u)

    def __add__(self, other: "Library") -> "Concat":
        return Concat([self, other])


class Identity(Library):
    """The variables themselves: ``x0, x1, ..., u0, ...``.

    Parameters
    ----------
    variables : {"x", "u", "xu"}, default="xu"
        Which variables enter the library.
    bias : bool, default=False
        Prepend the constant feature ``1``.
    """

    settings = "Identity"

    def __init__(self, variables: str = "xu", bias: bool = False):
        self.variables = _check_variables(variables)
        self.bias = bool(bias)

    def transform(self, x, u):
        z = _inputs(self.variables, x, u)
        if self.bias:
            z = np.concatenate([np.ones(z.shape[:-1] + (1,)), z], axis=-1)
        return z

    def feature_names(self, n_x, n_u):
        return (["1"] if self.bias else []) + _names(self.variables, n_x, n_u)


class Polynomial(Library):
    """All monomials of the variables up to ``degree`` (``x0*x1``, ``x0^2``, ...).

    Parameters
    ----------
    degree : int, default=2
        Highest total degree, >= 1.
    variables : {"x", "u", "xu"}, default="xu"
        Which variables enter the library.
    bias : bool, default=True
        Include the constant monomial ``1``.
    """

    settings = "Polynomial"

    def __init__(self, degree: int = 2, variables: str = "xu", bias: bool = True):
        if int(degree) < 1:
            raise ValueError(f"feature_map.degree={degree}; allowed: an integer >= 1")
        self.degree = int(degree)
        self.variables = _check_variables(variables)
        self.bias = bool(bias)

    def _terms(self, n: int) -> list[tuple[int, ...]]:
        terms = [()] if self.bias else []
        for d in range(1, self.degree + 1):
            terms += list(combinations_with_replacement(range(n), d))
        return terms

    def transform(self, x, u):
        z = _inputs(self.variables, x, u)
        cols = [np.prod(z[..., list(t)], axis=-1) for t in self._terms(z.shape[-1])]
        return np.stack(cols, axis=-1)

    def feature_names(self, n_x, n_u):
        base = _names(self.variables, n_x, n_u)
        out = []
        for t in self._terms(len(base)):
            if not t:
                out.append("1")
                continue
            parts = []
            for j in sorted(set(t)):
                c = t.count(j)
                parts.append(base[j] if c == 1 else f"{base[j]}^{c}")
            out.append("*".join(parts))
        return out


class Fourier(Library):
    """``sin(k z)`` and ``cos(k z)`` of each variable for ``k = 1..n_frequencies``.

    Parameters
    ----------
    variables : {"x", "u", "xu"}, default="x"
        Which variables enter the library.
    n_frequencies : int, default=1
        Number of harmonics, >= 1.
    sin, cos : bool, default=True
        Which of the two functions to include (at least one).
    """

    settings = "Fourier"

    def __init__(self, variables: str = "x", n_frequencies: int = 1, sin: bool = True,
                 cos: bool = True):
        if int(n_frequencies) < 1:
            raise ValueError(f"feature_map.n_frequencies={n_frequencies}; allowed: >= 1")
        if not (sin or cos):
            raise ValueError("feature_map: at least one of sin, cos must be true")
        self.variables = _check_variables(variables)
        self.n_frequencies = int(n_frequencies)
        self.sin, self.cos = bool(sin), bool(cos)

    def _fns(self):
        for k in range(1, self.n_frequencies + 1):
            if self.sin:
                yield ("sin", k, np.sin)
            if self.cos:
                yield ("cos", k, np.cos)

    def transform(self, x, u):
        z = _inputs(self.variables, x, u)
        return np.concatenate([f(k * z) for _, k, f in self._fns()], axis=-1)

    def feature_names(self, n_x, n_u):
        base = _names(self.variables, n_x, n_u)
        out = []
        for name, k, _ in self._fns():
            out += [f"{name}({'' if k == 1 else k}{v})" for v in base]
        return out


class Concat(Library):
    """Features of several libraries side by side (what ``a + b`` builds).

    Parameters
    ----------
    libraries : iterable of Library
        The libraries, in order (a Concat among them contributes its own).
    """

    settings = "Concat"

    def __init__(self, libraries):
        libs = []
        for lib in libraries:
            libs += lib.libraries if type(lib) is Concat else [lib]   # Combined keeps its own
        if not libs:
            raise ValueError("feature_map.libraries is empty; give at least one library")
        self.libraries = libs

    def transform(self, x, u):
        return np.concatenate([lib.transform(x, u) for lib in self.libraries], axis=-1)

    def feature_names(self, n_x, n_u):
        return [n for lib in self.libraries for n in lib.feature_names(n_x, n_u)]


#: the libraries :class:`Combined` knows by name: kind -> (class, fixed keys)
KINDS = {
    "identity": (Identity, {}),
    "polynomial": (Polynomial, {}),
    "fourier": (Fourier, {}),
    "sin": (Fourier, {"sin": True, "cos": False}),
    "cos": (Fourier, {"sin": False, "cos": True}),
}


def library(entry) -> Library:
    """A library from a :class:`Combined` entry.

    Parameters
    ----------
    entry : str, mapping or Library
        A kind (``"sin"``), a mapping of a kind and its keys (``{"kind": "polynomial",
        "degree": 3}``) or a :class:`Library` itself.

    Returns
    -------
    Library
    """
    if isinstance(entry, Library):
        return entry
    keys = dict(entry) if isinstance(entry, dict) else {"kind": entry}
    kind = keys.pop("kind", None)
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"feature_map.libraries: {entry!r} is not a library; allowed: "
                         f"{', '.join(KINDS)}, a mapping {{kind: ..., <its keys>}} or a "
                         "library with _target_")
    cls, fixed = KINDS[kind]
    given = sorted(set(keys) & set(fixed))
    if given:
        raise ValueError(f"feature_map.libraries: kind {kind} sets {', '.join(given)} itself; "
                         "use kind fourier to choose sin and cos")
    return cls(**keys, **fixed)


class Combined(Concat):
    """Several libraries side by side, named by kind, each feature once.

    ``libraries`` lists kinds (``identity``, ``polynomial``, ``fourier``, ``sin``, ``cos``),
    mappings of a kind and its keys, or libraries. A feature that two of them produce (the
    same name, e.g. ``x0`` from ``identity`` and ``polynomial``) is kept once, where it first
    appears: features are identified by their names, as in parameter names and truth files.

    Parameters
    ----------
    libraries : str, mapping, Library, or a list of them
        The entries (:func:`library`).

    Examples
    --------
    >>> lib = Combined(["identity", "sin"])
    >>> lib.feature_names(2, 1)
    ['x0', 'x1', 'u0', 'sin(x0)', 'sin(x1)']
    >>> Combined([{"kind": "identity", "bias": True}, "polynomial"]).feature_names(1, 0)
    ['1', 'x0', 'x0^2']
    """

    settings = "Combined"

    def __init__(self, libraries):
        if isinstance(libraries, (str, dict, Library)):
            libraries = [libraries]
        super().__init__([library(entry) for entry in libraries])

    def _keep(self, n_x: int, n_u: int) -> list[int]:
        names = super().feature_names(n_x, n_u)
        first: dict[str, int] = {}
        for i, name in enumerate(names):
            first.setdefault(name, i)
        return sorted(first.values())

    def transform(self, x, u):
        return super().transform(x, u)[..., self._keep(x.shape[-1], u.shape[-1])]

    def feature_names(self, n_x, n_u):
        names = super().feature_names(n_x, n_u)
        return [names[i] for i in self._keep(n_x, n_u)]
