"""The identified model as text: one equation per regression target (what ``equations.txt``
holds, what a run prints at its end, what ``fnsysid show`` and
:meth:`fnsysid.FederatedSysID.equations` give)."""

from __future__ import annotations

import re

import numpy as np

#: equations printed at the end of a run before the short form (the rest in equations.txt)
SHORT_LINES = 12
#: characters of one printed equation before it is cut (the full one in equations.txt)
SHORT_WIDTH = 160


def names(model) -> tuple[list[str], list[str]]:
    """The regression targets and the feature names of ``model``."""
    sys = model.system
    if model.library is not None:
        feats = sys.name_features(model.library.feature_names(sys.n_x, sys.n_u))
    else:
        feats = list(sys.feature_names)
    return list(sys.target_names), list(feats)


def equations(model, theta, precision: int = 4) -> list[str]:
    """One string per regression target, ``"x1+ = 1 x1 + 0.05 x2"``, of the parameters
    ``theta`` (p,): coefficients with ``precision`` significant digits (a small one reads
    ``1.2e-05``, not 0), terms whose coefficient is exactly 0 left out, a feature whose name
    starts with a sign or holds a ``+``/``-`` in parentheses."""
    Th = model.theta_matrix(np.asarray(theta, float))
    targets, feats = names(model)
    lines = []
    for j, target in enumerate(targets):
        terms = []
        for c, f in zip(Th[j], feats, strict=True):
            if c == 0:
                continue
            size = f"{abs(c):.{precision}g}"
            if re.search(r"[+-]", f):            # -g*sin(a)*dt would read as a minus
                f = f"({f})"
            term = size if f == "1" else f"{size} {f}"
            sign = "-" if c < 0 else "+"
            terms.append((f"-{term}" if sign == "-" else term) if not terms
                         else f"{sign} {term}")
        lines.append(f"{target} = {' '.join(terms) if terms else '0'}")
    return lines


def model_text(model, estimate, clients, repeats=None, precision: int = 4) -> list[str]:
    """The lines of ``equations.txt`` for the final estimates ``estimate`` (S, 1 or M, p): the
    server model of each repeat, or each client's model (``clients``: their labels), under a
    heading ``repeat r`` (several repeats) and ``client c`` (a model per client)."""
    est = np.asarray(estimate, float)
    S, C, _ = est.shape
    reps = list(repeats) if repeats is not None else list(range(S))
    lines = []
    for s in range(S):
        for c in range(C):
            head = ([f"repeat {reps[s]}"] if S > 1 else []) + \
                   ([f"client {clients[c]}"] if C > 1 else [])
            if head:
                lines.append(f"[{', '.join(head)}]")
            lines += equations(model, est[s, c], precision)
    return lines


def short_form(lines: list[str], more: str = "equations.txt") -> list[str]:
    """``lines`` as printed: at most :data:`SHORT_LINES` of them, each cut at
    :data:`SHORT_WIDTH` characters, with a last line saying how many are left out and where
    they are."""
    shown = [ln if len(ln) <= SHORT_WIDTH else ln[:SHORT_WIDTH - 4] + " ..." for ln in
             lines[:SHORT_LINES]]
    cut = len(lines) - len(shown)
    if cut > 0 or shown != lines[:len(shown)]:
        shown.append(f"... ({cut} more line(s); the full model in {more})" if cut else
                     f"... (long equations cut; the full model in {more})")
    return shown
