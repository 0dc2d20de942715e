"""``fnsysid compare RUN_DIR...``: finished runs ranked by their held-out free-run error, with
the model check's verdict beside each.

A RUN_DIR is a run folder (holding ``summary.json``) or a folder of runs (a multirun sweep:
each job folder below it that holds ``summary.json``). Runs are ranked by the mean over the
clients of the free-run NRMSE of the run's model on the held-out data
(``final_nrmse_sim_mean``, averaged over repeats); runs that did not finish ``ok`` or have no
held-out data are listed after the ranked ones, unranked.

Errors on different held-out data do not rank models: runs are ranked only among runs scored
on the same held-out data (``summary.json: heldout.fingerprint``, a digest of every held-out
state and input value, whatever the clients' order). When the runs given were scored on more
than one held-out data set, the column ``data`` names each set (A, B, ...), each set is
ranked on its own, and a note says so; a summary written before the digest existed is a set
of its own (``?1``, ``?2``, ...).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

USAGE = "usage: fnsysid compare RUN_DIR [RUN_DIR ...]"


class CompareError(Exception):
    """A folder that holds no finished run, or a summary that cannot be read."""


def run_folders(path: Path) -> list[Path]:
    """The run folders of ``path``: itself when it holds ``summary.json``, else every folder
    below it that does (sorted)."""
    if not path.exists():
        raise CompareError(f"{path}: no such folder")
    if not path.is_dir():
        raise CompareError(f"{path}: not a folder (give a run folder or a sweep folder)")
    if (path / "summary.json").is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob("summary.json"))
    if not found:
        raise CompareError(f"{path}: no summary.json in it or below it (not a finished run "
                           "or sweep folder)")
    return found


def _label(folder: Path) -> str:
    """The run's overrides (Hydra's ``.hydra/overrides.yaml``) or, without them, its folder."""
    over = folder / ".hydra" / "overrides.yaml"
    if over.is_file():
        lines = [ln[2:].strip() for ln in over.read_text().splitlines() if ln.startswith("- ")]
        keep = [ln for ln in lines if not ln.startswith(("hydra.", "output.", "progress"))]
        if keep:
            return " ".join(keep)
    return str(folder)


def read_run(folder: Path) -> dict:
    """One row of the comparison from a run folder's ``summary.json``."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        raise CompareError(f"{folder / 'summary.json'}: cannot be read ({exc})") from None
    if not isinstance(summary, dict) or "status" not in summary:
        raise CompareError(f"{folder / 'summary.json'}: not a summary of fnsysid (no status)")
    from fnsysid.results.atomic import restored

    check = summary.get("model_check") or {}
    sim = restored(summary, "final_nrmse_sim_mean")        # inf (written null): blown up
    if not isinstance(sim, (int, float)) or math.isnan(sim):   # inf ranks last
        sim = None
    verdict = check.get("verdict") if check else None
    if check and verdict is None and check.get("ok") is not None:  # older summaries
        verdict = "ok" if check["ok"] else "model class looks wrong"
    return {"folder": str(folder), "label": _label(folder), "status": summary["status"],
            "feature_map": summary.get("feature_map"), "free_run": sim,
            "free_run_max": restored(summary, "final_nrmse_sim_max"),
            "one_step": summary.get("final_nrmse_1step_mean"),
            "verdict": verdict or ("not checked" if not check else "nothing to check"),
            "ok": check.get("ok"),
            "heldout": (summary.get("heldout") or {}).get("fingerprint")}


def compare(paths: list[str]) -> list[dict]:
    """The rows of every run of ``paths``, ranked (``rank`` None: not ranked)."""
    rows, seen = [], set()
    for p in paths:
        for folder in run_folders(Path(p)):
            if folder.resolve() not in seen:
                seen.add(folder.resolve())
                rows.append(read_run(folder))
    ranked = [r for r in rows if r["status"] == "ok" and r["free_run"] is not None]
    scored = ranked + [r for r in rows if r not in ranked and r["free_run"] is not None]
    # held-out digest -> "A", "B", ... (ranked runs first); a summary without the digest
    # (an older version's) is a set of its own, "?1", "?2", ...
    sets: dict = {}
    names, unknown = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 0
    for r in scored:
        key = r["heldout"]
        if key is None:
            unknown += 1
            r["set"] = ("?", unknown)
            sets[r["set"]] = f"?{unknown}"
        else:
            r["set"] = key
            if key not in sets:
                sets[key] = next(names, key[:6])
    for r in rows:
        r["data"] = sets[r["set"]] if "set" in r else None
    order = list(sets)
    ranked.sort(key=lambda r: (order.index(r["set"]), r["free_run"]))
    for key in sets:
        for i, r in enumerate((r for r in ranked if r["set"] == key), 1):
            r["rank"] = i
    rest = [r for r in rows if r not in ranked]
    for r in rest:
        r["rank"] = None
    return ranked + rest


def data_sets(rows: list[dict]) -> list[str]:
    """The names of the held-out data sets the rows were scored on, in order."""
    return list(dict.fromkeys(r["data"] for r in rows if r["data"] is not None))


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def main(argv: list[str]) -> int:
    """Print the comparison; exit 0, 2 (bad folder: one line) or 3 (a run not ``ok``)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.split("\n\n", 1)[1].strip())
        return 0 if argv else 2
    try:
        rows = compare(argv)
    except CompareError as exc:
        print(f"fnsysid compare: error: {exc}", file=sys.stderr)
        return 2
    sets = data_sets(rows)
    several = len(sets) > 1
    head = ("rank",) + (("data",) if several else ()) + (
        "free-run NRMSE", "max", "one-step", "status", "model check", "run")
    table = [head] + [(_fmt(r["rank"]) if r["rank"] else "-",) +
                      ((r["data"] or "-",) if several else ()) +
                      (_fmt(r["free_run"]), _fmt(r["free_run_max"]), _fmt(r["one_step"]),
                       r["status"], r["verdict"], r["label"]) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head) - 1)]
    for row in table:
        print("  ".join(str(v).ljust(w) for v, w in zip(row[:-1], widths, strict=True)) +
              "  " + str(row[-1]))
    if several:
        unknown = [n for n in sets if n.startswith("?")]
        why = (f" ({', '.join(unknown)}: a summary without the held-out digest, written by an "
               "older version, each its own set)" if unknown else "")
        print(f"note: these runs were scored on {len(sets)} held-out data sets that are not "
              f"known to be the same (column data: {', '.join(sets)}){why}; each set is "
              "ranked on its own, since errors on different data do not rank models",
              file=sys.stderr)
    return 0 if all(r["status"] == "ok" for r in rows) else 3
