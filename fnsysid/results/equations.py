"""The identified model as text: one equation per regression target (what ``equations.txt``
holds, what a run prints at its end, what ``fnsysid show`` and
:meth:`fnsysid.FederatedSysID.equations` give); and a finished run or sweep read back from its
folder, for ``fnsysid show RUN_DIR`` and :meth:`fnsysid.FederatedSysID.load`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from fnsysid.config.errors import ConfigError, some
from fnsysid.results.folder import MULTIRUN

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


# --- a finished run read back ---------------------------------------------------------------

#: the tables a loaded run reads (each when its file exists)
TABLES = ("errors", "estimates", "client_estimates", "parameters", "clients", "k_clients",
          "theory")
#: summary.json's scores shown by ``fnsysid show`` (each when not null)
SCORES = ("final_e_max_mean", "final_e_mean_mean", "final_nrmse_1step_mean",
          "final_nrmse_1step_max", "final_nrmse_sim_mean", "final_nrmse_sim_max",
          "final_e_pers_max_mean")


def _summary(folder: Path, name: str) -> dict:
    path = folder / "summary.json"
    if not folder.is_dir():
        raise ConfigError(f"{name}={folder} is not a folder; allowed: the folder of a finished "
                          "run or sweep")
    if not path.is_file():
        raise ConfigError(f"{name}={folder} holds no finished run (no summary.json); allowed: "
                          "the folder of a finished run or sweep")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}={folder}: summary.json cannot be read ({exc})") from None


def is_sweep(folder: Path) -> bool:
    """True if ``folder`` is a sweep's (Hydra's ``multirun.yaml`` at its top)."""
    return (Path(folder) / MULTIRUN).is_file()


def sweep_jobs(folder: Path) -> list[Path]:
    """The job folders of a sweep (those holding ``summary.json``) in the sweep's order
    (Hydra's job number, ``hydra.job.num`` of each job's ``.hydra/hydra.yaml``), by name
    where a job has none."""
    jobs = [p for p in Path(folder).iterdir() if (p / "summary.json").is_file()]
    return sorted(jobs, key=lambda p: (_job_number(p), p.name))


def _job_number(job: Path) -> float:
    """Hydra's number of a sweep's job (its ``.hydra/hydra.yaml``), or inf."""
    import yaml

    try:
        num = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["num"]
        return float(num)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return float("inf")


#: columns of labels, kept as text (client 01 is not client 1)
LABELS = ("client", "parameter", "status", "method")


def _read_csv(path: Path):
    """A table as written (a DataFrame), each number parsed by Python's ``float`` (the
    shortest repr that pandas writes reads back to the same double) and whole numbers as
    integers; label columns as text. (pandas imported here: a run itself does not import
    it.)"""
    import pandas as pd

    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in df.columns:
        if c in LABELS:
            continue
        text = df[c].replace("", "nan")
        try:
            values = text.astype(float)
        except ValueError:
            continue
        whole = values.notna().all() and text.str.fullmatch(r"-?\d+").all()
        df[c] = values.astype(int) if whole else values
    return df


def read_run(folder, name: str = "run_dir") -> dict:
    """A finished run's ``settings`` (checked, from ``config.yaml``), ``summary``, ``tables``
    (DataFrames, floats read back bit for bit) and ``clients`` (the labels of
    ``clients.csv``, else of ``k_clients.csv``, else none). A folder that is not a run, or a
    run without final estimates (diverged, refused), raises :class:`ConfigError`."""
    import yaml

    from fnsysid.config.schema import settings_from

    folder = Path(folder)
    if folder.is_dir() and is_sweep(folder):
        jobs = [p.name for p in sweep_jobs(folder)]
        raise ConfigError(f"{name}={folder} is a sweep; allowed: one of its job folders "
                          f"({', '.join(some(jobs, 5)) or 'none finished'})")
    summary = _summary(folder, name)
    if not (folder / "estimates.csv").is_file():
        raise ConfigError(f"{name}={folder}: the run ended with status "
                          f"'{summary.get('status')}' and has no estimates.csv: no model")
    try:
        plain = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{name}={folder}: config.yaml cannot be read ({exc})") from None
    settings = settings_from(plain)
    tables = {t: _read_csv(folder / f"{t}.csv") for t in TABLES
              if (folder / f"{t}.csv").is_file()}
    clients = []
    for t in ("clients", "k_clients"):
        if t in tables and "client" in tables[t]:
            clients = list(dict.fromkeys(tables[t]["client"].astype(str)))
            break
    return {"settings": settings, "summary": summary, "tables": tables, "clients": clients}


def _scores(summary: dict) -> str:
    from fnsysid.results.atomic import restored

    values = {k: restored(summary, k) for k in SCORES}
    shown = [f"{k.removeprefix('final_')} {v:.4g}" for k, v in values.items()
             if isinstance(v, (int, float))]
    return ", ".join(shown) if shown else "no scores"


def _check_line(check: dict | None) -> str | None:
    """The model check's verdict for ``show`` (None where the run has no check)."""
    if not check:
        return None
    if check.get("verdict") is None:
        return f"model check: none ({check.get('reason') or 'nothing could be checked'})"
    line = f"model check: {check['verdict']}"
    med = check.get("nrmse_sim_median") or []
    if check["verdict"] != "ok" and med and med[0] is not None:
        line += (f" (median free-run NRMSE of the clients' own fits {med[0]:.3g}; "
                 "summary.json: model_check)")
    if check.get("measurement_noise"):
        line += ("; residuals as noise on the measured states makes them: "
                 + ", ".join(check["measurement_noise"]))
    untested = max(check.get("extrapolating_untested") or [0])
    if untested:
        line += (f"; {untested} client(s) untested: their held-out data lie beyond their "
                 "training data's range")
    from fnsysid.results.modelcheck import pooling_clause

    clause = pooling_clause(check)
    if clause and check["verdict"] in ("ok", "overfit"):
        line += f"; {clause}"
    return line


def _privacy_line(priv: dict | None) -> str | None:
    """The run's privacy: its mode, epsilon and delta, and where privacy moved the estimate by
    a tenth of its norm or more (``privacy.moved``), by how much; None without privacy."""
    if not priv:
        return None
    eps = priv.get("epsilon")
    eps = "infinite (no noise)" if eps is None else f"{eps:.3g}"
    line = f"privacy: {priv.get('mode')}, epsilon {eps}, delta {priv.get('delta'):g}"
    from fnsysid.learning.privacy import MOVED_LEVEL, PLAIN_DIVERGED, noise_size

    if priv.get("moved") is not None and priv["moved"] >= MOVED_LEVEL:
        line += f"; {noise_size(priv)}"
    elif priv.get("plain_diverged"):
        line += f"; {PLAIN_DIVERGED}"
    return line


def _conditioning_line(cond: dict | None) -> str | None:
    """Why a run is ``ill_conditioned`` (``summary.json: conditioning``), or why its estimate,
    a mean of the clients' own fits, carries one client's imprecision
    (``conditioning.own_precision``), or None."""
    if not cond:
        return None
    precision = cond.get("own_precision")
    if precision and not cond.get("repeats") and not cond.get("roundoff"):
        from fnsysid.results.modelcheck import own_precision_who

        return (f"conditioning: the estimate is a mean of the clients' own fits, whose "
                f"estimation error alone adds a one-step NRMSE of "
                f"{precision['nrmse_added']:.3g}, {own_precision_who(precision)} "
                "(strategy=centralized_exact weighs each client's data by what they "
                "determine)")
    if cond.get("repeats"):
        from fnsysid.results.metrics import repeated_words

        # null in a repeat listed: a singular matrix's inf, which JSON does not hold
        worst = max(float("inf") if cond["cond"][s] is None else cond["cond"][s]
                    for s in cond["repeats"])
        why = repeated_words(cond.get("repeated"))
        return (f"conditioning: the pooled Gram matrix's condition number {worst:.3g} reaches "
                f"1/eps in repeat(s) {', '.join(map(str, cond['repeats']))}: no correct digit"
                + (f"; {why}" if why else ""))
    r = cond.get("roundoff")
    if not r:
        return None
    names = ", ".join(r["clients"][:5]) + (f" and {len(r['clients']) - 5} more"
                                           if len(r["clients"]) > 5 else "")
    of = r.get("of", "pooled sums")
    why = ("the data sit far from 0 beside their spread: subtract an operating point"
           if r.get("cause") == "offset" else
           "clients' data orders of magnitude apart" if of == "pooled sums" else
           "their own data keep no two digits of a fit")
    tail = ("; the run's estimate does not use them: only the model check is not read"
            if r.get("status") is False else "")
    return (f"conditioning: the round-off of the {of} moves the predictions of {names} by up "
            f"to {r['worst_ratio']:.3g} times their targets' spread ({why}){tail}")


def not_final(summary: dict) -> str:
    """Why a run's model is not a result, by its status: an ill-conditioned estimate keeps no
    correct digit whatever its rounds; a growing or interrupted one is the last round's."""
    if summary.get("status") == "ill_conditioned":
        return "the estimate keeps no correct digit (conditioning)"
    return f"after round {summary.get('rounds_completed')}: not a converged model"


def _run_lines(folder: Path, summary: dict, full: bool) -> list[str]:
    head = (f"status {summary.get('status')}, {summary.get('rounds_completed')} rounds; "
            f"system={summary.get('system')}, feature_map={summary.get('feature_map')}, "
            f"strategy={summary.get('strategy')}, M={summary.get('M')}")
    kept = ("" if summary.get("status") == "ok" else
            " (of an estimate without a correct digit)"
            if summary.get("status") == "ill_conditioned" else
            f" (of round {summary.get('rounds_completed')}, the last kept: not a finished "
            "model's)")
    lines = [head, f"scores{kept}: {_scores(summary)}"]
    from fnsysid.results.atomic import restored
    from fnsysid.results.modelcheck import CONSTANT

    sim = restored(summary, "final_nrmse_sim_mean")     # inf (a rollout blew up): written null
    if isinstance(sim, (int, float)) and sim > CONSTANT:
        from fnsysid.results.modelcheck import free_run_warning

        said = free_run_warning({**summary, "status": "ok"})
        why = ("" if said is None or said[1] else
               "; held-out runs too short to tell a poor model" if "too short" in said[0] else
               "; as noisy runs of the clients' own fits: the noise leads the free run")
        lines[-1] += f" (free run worse than the held-out mean: NRMSE above {CONSTANT:g}{why})"
    check = _check_line(summary.get("model_check"))
    if check:
        lines.append(check)
    cond = _conditioning_line(summary.get("conditioning"))
    if cond:
        lines.append(cond)
    priv = _privacy_line(summary.get("privacy"))
    if priv:
        lines.append(priv)
    sp = summary.get("sparsity") or {}
    if sp.get("auto") and sp.get("rule"):
        from fnsysid.learning.sparsity import auto_choice

        lines.append(auto_choice(sp))
    faded = sp.get("below_threshold")
    if faded:
        lines.append(f"sparsity: kept but below the threshold in the final model: "
                     f"{', '.join(f['parameter'] for f in faded)}")
    if summary.get("unused_settings"):
        lines.append(f"settings without effect: {', '.join(summary['unused_settings'])}")
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    eq = folder / "equations.txt"
    if eq.is_file():
        model = eq.read_text().splitlines()
        lines.append("equations:")
        lines += [f"  {ln}" for ln in (model if full else short_form(model, str(eq)))]
    else:
        lines.append("equations: none (no equations.txt: no model to show)")
    return lines


def show_text(folder, full: bool = True) -> list[str]:
    """What ``fnsysid show`` prints: a run's status, scores and equations; for a sweep, each
    job's (equations in their short form)."""
    folder = Path(folder)
    if folder.is_dir() and is_sweep(folder):
        jobs = sweep_jobs(folder)
        if not jobs:
            raise ConfigError(f"RUN_DIR={folder} is a sweep with no finished job (no "
                              "summary.json in its job folders)")
        lines = [f"sweep {folder}: {len(jobs)} job(s)"]
        for job in jobs:
            lines += ["", f"{job.name}:"]
            lines += [f"  {ln}" for ln in _run_lines(job, _summary(job, "RUN_DIR"), False)]
        return lines
    summary = _summary(folder, "RUN_DIR")
    return [f"run {folder}:", *_run_lines(folder, summary, full)]


def statuses(folder) -> list:
    """The status of the run in ``folder``, or of each finished job of a sweep."""
    folder = Path(folder)
    runs = sweep_jobs(folder) if is_sweep(folder) else [folder]
    return [_summary(r, "RUN_DIR").get("status") for r in runs]
