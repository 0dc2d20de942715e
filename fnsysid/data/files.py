"""Reading trajectory files (CSV or Parquet) and ground-truth files, with checks.

Layout (``data=files``): ``data.path`` is a folder with one ``.csv`` or ``.parquet`` file per
client (client id = file stem, clients in sorted order), or one file with a ``client`` column.
Columns: the states and inputs by name, and optionally ``trajectory`` (absent: one trajectory),
``t`` (the sample order; must increase within a trajectory), ``repeat`` (independent
repetitions) and ``split`` (``train``/``val``). A trajectory of length L gives L - 1
transitions; the inputs of its last sample are not used and may be empty.

Every problem is reported as :class:`DataError`, one line naming the file and the row (1-based,
header not counted) or the column. Each file is read once.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np
import pandas as pd

from fnsysid.config.checks import DataError

SUFFIXES = (".csv", ".parquet")
OPTIONAL = ("repeat", "trajectory", "t", "split")
SPLITS = ("train", "val")
#: columns of a validated trajectory table before the states and inputs
PUBLIC_COLUMNS = ["repeat", "client", "trajectory", "t", "split"]


def read_table(path: Path) -> pd.DataFrame:
    """One CSV or Parquet file as a DataFrame (Parquet through pyarrow)."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, skipinitialspace=True)
    except Exception as exc:  # pandas and pyarrow raise many kinds; report the first line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: cannot be read as {path.suffix[1:]}: {msg}") from exc


def data_files(path, setting: str = "data.path") -> list[Path]:
    """The trajectory files of ``setting`` (``data.path`` or ``data.val_path``): the file
    itself or a folder's files (suffix in any case: ``.csv``, ``.CSV``), sorted; a client id
    (file stem) given by two files is an error."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{setting}={path} does not exist")
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DataError(f"{setting}={path}: allowed file types: .csv, .parquet")
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"{setting}={path} holds no .csv or .parquet files")
    seen: dict[str, Path] = {}
    for f in files:
        if f.stem in seen:
            raise DataError(f"{setting}={path}: {seen[f.stem].name} and {f.name} both give "
                            f"client '{f.stem}'; keep one file per client")
        seen[f.stem] = f
    return files


def read_trajectories(path, states, inputs=(), setting: str = "data.path",
                      client_file: bool = False) -> pd.DataFrame:
    """Read and check trajectories: the validated samples as one DataFrame.

    Parameters
    ----------
    path : a folder of per-client files or one file with a ``client`` column.
    states, inputs : names of the state and input columns (one name may be a string).
    setting : the setting that gave ``path``, for messages.
    client_file : ``path`` is one client's file of a folder (a Flower node's own file),
        read as in the folder: the file name gives the client.

    Returns
    -------
    DataFrame with columns ``repeat, client, trajectory, t, split``, the states and the inputs,
    sorted by (repeat, client, trajectory) with the file's order kept within a trajectory,
    and the helper columns ``_client``, ``_trajectory`` (sort ranks). ``client`` holds strings
    (file stems or the ``client`` column's values); ``repeat`` is 0 and ``split`` is ``train``
    where the file has no such column. Raises :class:`DataError`.
    """
    states = [states] if isinstance(states, str) else list(states)
    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
    files = data_files(path, setting)
    one_file = Path(path).is_file() and not client_file
    parts = []
    for f in files:
        df = read_table(f)
        parts.append(_check_file(df, f, states, inputs, one_file))
    return _combine(parts, files, one_file, states, inputs)


def _check_file(df: pd.DataFrame, f: Path, states, inputs, one_file: bool) -> pd.DataFrame:
    """Columns present and numeric; returns the used columns with a canonical layout."""
    if len(df) == 0:
        raise DataError(f"{f}: no rows")
    cols = [str(c) for c in df.columns]
    df.columns = cols
    need = [(c, "data.states") for c in states] + [(c, "data.inputs") for c in inputs]
    if one_file:
        need.append(("client", "one file holds all clients"))
    for c, why in need:
        if c not in cols:
            near = [k for k in cols if k.lower() == c.lower()] or \
                difflib.get_close_matches(c, cols, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise DataError(f"{f}: column '{c}' ({why}) is missing; columns: "
                            f"{', '.join(cols)}{hint}")
    out = pd.DataFrame(index=df.index)
    out["_row"] = np.arange(1, len(df) + 1)
    out["repeat"] = _repeat(df, f) if "repeat" in cols else 0
    if one_file:
        out["client"] = df["client"]
    else:
        out["client"] = f.stem
        if "client" in cols:        # the file stem names the client; a column may only agree
            other = (df["client"].astype(str).str.strip() != f.stem).to_numpy()
            if other.any():
                i = int(np.flatnonzero(other)[0])
                raise DataError(f"{f}: row {i + 1}, column 'client' is '{df['client'].iloc[i]}'"
                                f" but in a folder the file name gives the client ('{f.stem}'); "
                                "drop the column, or give data.path=<one file> holding all "
                                "clients")
    out["trajectory"] = df["trajectory"] if "trajectory" in cols else 0
    out["t"] = _numeric(df, "t", f) if "t" in cols else np.arange(len(df), dtype=float)
    if "split" in cols:
        split = df["split"].astype(str).str.strip()
        bad = ~split.isin(SPLITS)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(f"{f}: row {i + 1}, column 'split': '{df['split'].iloc[i]}' is not "
                            f"allowed; allowed: {', '.join(SPLITS)}")
        out["split"] = split
    else:
        out["split"] = "train"
    for c in ("client", "trajectory"):
        miss = out[c].isna().to_numpy()
        if miss.any():
            raise DataError(f"{f}: row {int(np.flatnonzero(miss)[0]) + 1}, column '{c}' is "
                            "empty")
    for c in states + inputs:
        out[c] = _numeric(df, c, f)
    return out


def _repeat(df: pd.DataFrame, f: Path) -> np.ndarray:
    """Column ``repeat`` as integers >= 0; an empty, fractional or negative value is an error
    naming the row."""
    rep = _numeric(df, "repeat", f)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(rep) | (rep < 0) | (rep != np.round(rep))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        shown = "empty" if np.isnan(rep[i]) else f"{df['repeat'].iloc[i]}"
        raise DataError(f"{f}: row {i + 1}, column 'repeat' is {shown}; allowed: integers >= 0")
    return rep.astype(int)


def _numeric(df: pd.DataFrame, col: str, f: Path) -> np.ndarray:
    """Column ``col`` as floats; text that is not a number is an error naming the row."""
    s = df[col]
    if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
        num = pd.to_numeric(s, errors="coerce")
        bad = (num.isna() & s.notna() & (s.astype(str).str.strip() != "")).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{f}: row {i + 1}, column '{col}': '{s.iloc[i]}' is not a number")
        s = num
    return s.to_numpy(dtype=float, na_value=np.nan)


def _sort_key(values: pd.Series):
    """Sort labels numerically when they are all numbers, else as text."""
    num = pd.to_numeric(values, errors="coerce")
    return num if num.notna().all() else values.astype(str)


def _combine(parts, files, one_file, states, inputs) -> pd.DataFrame:
    sizes = [len(p) for p in parts]
    df = pd.concat(parts, ignore_index=True)
    df["_file"] = np.repeat(np.arange(len(parts)), sizes)

    def where(i: int) -> str:
        return f"{files[df['_file'].iat[i]]}: row {df['_row'].iat[i]}"

    # labels in sorted order; stable sort keeps each trajectory's rows in file order
    for c in ("client", "trajectory"):
        key = _sort_key(df[c])
        order = pd.Index(pd.unique(key)).sort_values()
        df["_" + c] = order.get_indexer(key)
        df[c] = df[c].astype(str) if c == "client" else df[c]
    df = df.sort_values(["repeat", "_client", "_trajectory"], kind="stable",
                        ignore_index=True)
    group = df[["repeat", "_client", "_trajectory"]].to_numpy()
    same_next = (group[1:] == group[:-1]).all(axis=1)          # row i and i+1: one trajectory
    last = np.append(~same_next, True)                         # last sample of a trajectory

    t = df["t"].to_numpy()
    for c in ["t"] + states + inputs:
        v = df[c].to_numpy()
        bad = ~np.isfinite(v)
        if c in inputs:
            bad &= ~last                                       # last inputs are not used
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "empty or NaN" if np.isnan(v[i]) else f"{v[i]}"
            raise DataError(f"{where(i)}, column '{c}' is {what}; allowed: finite numbers")
    bad = same_next & ~(t[1:] > t[:-1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0]) + 1
        raise DataError(f"{where(i)}: t={t[i]:g} does not increase within client "
                        f"'{df['client'].iat[i]}', trajectory {df['trajectory'].iat[i]} "
                        f"(previous t={t[i - 1]:g})")
    starts = np.flatnonzero(np.append(True, ~same_next))
    lengths = np.diff(np.append(starts, len(df)))
    if (lengths < 2).any():
        i = int(starts[np.flatnonzero(lengths < 2)[0]])
        raise DataError(f"{where(i)}: client '{df['client'].iat[i]}', trajectory "
                        f"{df['trajectory'].iat[i]} has 1 sample; a trajectory needs at least "
                        "2 (one transition)")
    clients = df.groupby("repeat", sort=True)["_client"].unique()
    ref = np.sort(clients.iloc[0])
    for rep, cl in clients.items():
        if not np.array_equal(np.sort(cl), ref):
            raise DataError(f"{files[0] if one_file else Path(files[0]).parent}: repeat {rep} "
                            "has other clients than repeat "
                            f"{clients.index[0]}; every repeat needs the same clients")
    df["repeat"] = pd.Index(np.unique(df["repeat"])).get_indexer(df["repeat"])
    if inputs:                                                 # unused last inputs: 0
        df.loc[last, inputs] = df.loc[last, inputs].fillna(0.0)
    keep = ["repeat", "client", "trajectory", "t", "split"] + states + inputs
    out = df[keep + ["_client", "_trajectory"]].copy()
    out.attrs["files"] = [str(f) for f in files]
    return out


def load_truth(path, clients: list[str], param_names: list[str], repeats: int) -> np.ndarray:
    """True parameters (S, M, p) from a file with columns ``repeat`` (optional), ``client``,
    ``parameter``, ``value``, in the model's parameter basis."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.truth={path} does not exist")
    df = read_table(path)
    cols = [str(c) for c in df.columns]
    df.columns = cols
    for c in ("client", "parameter", "value"):
        if c not in cols:
            raise DataError(f"{path}: column '{c}' is missing; columns: {', '.join(cols)} "
                            "(needed: repeat (optional), client, parameter, value)")
    value = _numeric(df, "value", path)
    bad = ~np.isfinite(value)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: row {i + 1}, column 'value' is not a finite number")
    rep = _numeric(df, "repeat", path).astype(int) if "repeat" in cols else None
    client = df["client"].astype(str).to_numpy()
    param = df["parameter"].astype(str).to_numpy()
    c_idx = pd.Index(clients).get_indexer(client)
    p_idx = pd.Index(param_names).get_indexer(param)
    for idx, what, allowed, vals in ((c_idx, "client", clients, client),
                                     (p_idx, "parameter", param_names, param)):
        if (idx < 0).any():
            i = int(np.flatnonzero(idx < 0)[0])
            shown = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
            raise DataError(f"{path}: row {i + 1}: {what} '{vals[i]}' is not in the data's "
                            f"{what}s ({shown})")
    S, M, p = repeats, len(clients), len(param_names)
    theta = np.full((S, M, p), np.nan)
    if rep is None:
        theta[:, c_idx, p_idx] = value
    else:
        if ((rep < 0) | (rep >= S)).any():
            i = int(np.flatnonzero((rep < 0) | (rep >= S))[0])
            raise DataError(f"{path}: row {i + 1}: repeat {rep[i]} is not in 0..{S - 1}")
        theta[rep, c_idx, p_idx] = value
    if np.isnan(theta).any():
        s, m, k = np.argwhere(np.isnan(theta))[0]
        raise DataError(f"{path}: no value for repeat {s}, client '{clients[m]}', parameter "
                        f"'{param_names[k]}'")
    return theta
