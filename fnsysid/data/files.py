"""Reading trajectory files (CSV or Parquet) and ground-truth files, with checks.

Layout (``data=files``): ``data.path`` is a folder with one ``.csv`` or ``.parquet`` file per
client (client id = file stem, clients in sorted order), or one file with a ``client`` column;
client ids are text (``00`` is not ``0``), and so are trajectory ids (``01`` and ``1`` are two
runs; sorted as the clients are). Columns: the states and inputs by name, and optionally
``trajectory`` (absent: one trajectory), ``t`` (the sample order; must increase
within a trajectory; integers compared exactly, a CSV's read as text so that one client's
integer stamps stay exact beside another's fractional times), ``repeat`` (independent
repetitions) and ``split`` (``train``/``val``). A trajectory of length L gives L - 1
transitions; the inputs of its last sample are not used and may be empty. Other names for the
trajectory and time columns and the columns not used are given by a :class:`ColumnMap`
(``data.trajectory``, ``data.time``, ``data.ignore``); any other column is refused
(:func:`check_columns`).

Every problem is reported as :class:`DataError`, one line naming the file and the row (1-based,
header not counted) or the column. Each file is read once (a CSV's header line twice, to find a
column name given twice).
"""

from __future__ import annotations

import difflib
import errno
import logging
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from fnsysid.config.checks import DataError

log = logging.getLogger("fnsysid")

SUFFIXES = (".csv", ".parquet")
OPTIONAL = ("repeat", "trajectory", "t", "split")
#: the labels a file may hold besides the states, the inputs and the mapped columns
KNOWN = ("client", "repeat", "split")
SPLITS = ("train", "val")
#: the columns of a truth file
TRUTH_COLUMNS = ("repeat", "client", "parameter", "value")
#: columns of a validated trajectory table before the states and inputs
PUBLIC_COLUMNS = ["repeat", "client", "trajectory", "t", "split"]


def read_table(path: Path, text: tuple[str, ...] = ("client",)) -> pd.DataFrame:
    """One CSV or Parquet file as a DataFrame (Parquet through pyarrow); the CSV columns in
    ``text`` are read as text (client ``00`` stays ``00``). A column name given twice is an
    error naming it (pandas would rename the second one)."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            return pd.read_parquet(path)
        header = pd.read_csv(path, header=None, nrows=1, dtype=str, skipinitialspace=True)
        names = [c for c in header.iloc[0] if isinstance(c, str)] if len(header) else []
        twice = [c for c in names if names.count(c) > 1]
        if twice:
            raise DataError(f"{path}: column '{twice[0]}' appears twice in the header; allowed: "
                            "one column per name")
        return pd.read_csv(path, skipinitialspace=True, dtype=dict.fromkeys(text, str))
    except DataError:
        raise
    except Exception as exc:  # pandas and pyarrow raise many kinds; report the first line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fmt = path.suffix[1:]
        raise DataError(f"{path}: cannot be read as {fmt}: {msg}; allowed: a {fmt} file with a "
                        "header row of column names and one row per sample") from exc


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (a FIFO, a device, a
    socket, a broken link), or None."""
    try:
        mode = path.stat().st_mode                        # follows symbolic links
    except FileNotFoundError:
        return "a broken symbolic link" if path.is_symlink() else None
    except OSError as exc:
        return f"not accessible ({exc.strerror or exc})"
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else None)
    if kind and path.is_symlink():
        kind += f" (a link to {os.path.realpath(path)})"
    return kind


def readable_file(path, setting: str | None = None,
                  allowed: str = "a .csv or .parquet file") -> Path:
    """``path`` as a regular file that can be read, else a :class:`DataError` naming it
    (``setting=path`` when given): a FIFO or device would block or never end."""
    path = Path(path)
    name = f"{setting}={path}" if setting else str(path)
    kind = _not_regular(path)
    if kind is None and not path.exists():
        raise DataError(f"{name} does not exist")
    if kind is None and path.is_dir():
        kind = "a folder"
    if kind is not None:
        raise DataError(f"{name} is {kind}, not a regular file; allowed: {allowed}"
                        + ("" if setting else " (remove it or move it out of the folder)"))
    if not os.access(path, os.R_OK):
        raise DataError(f"{name} cannot be read (permission denied); allowed: a file this user "
                        "may read")
    return path


def data_files(path, setting: str = "data.path") -> list[Path]:
    """The trajectory files of ``setting`` (``data.path`` or ``data.val_path``): the file
    itself or a folder's files (suffix in any case: ``.csv``, ``.CSV``), sorted; a client id
    (file stem) given by two files is an error, and so is an entry with such a suffix that is
    not a regular readable file (a FIFO, a link to a device, a folder). Reads no contents."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise DataError(f"{setting}={path} does not exist")
    if not path.is_dir():
        readable_file(path, setting, "a .csv or .parquet file, or a folder of them")
        if path.suffix.lower() not in SUFFIXES:
            raise DataError(f"{setting}={path}: allowed file types: .csv, .parquet")
        return [path]
    try:
        if not os.access(path, os.R_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        entries = list(path.iterdir())
    except OSError as exc:
        raise DataError(f"{setting}={path}: the folder cannot be read ({exc.strerror or exc}); "
                        "allowed: a folder this user may list and read") from exc
    files = sorted(p for p in entries if p.suffix.lower() in SUFFIXES)
    if not files:
        raise DataError(f"{setting}={path} holds no .csv or .parquet files")
    seen: dict[str, Path] = {}
    for f in files:
        readable_file(f)
        if f.stem in seen:
            raise DataError(f"{setting}={path}: {seen[f.stem].name} and {f.name} both give "
                            f"client '{f.stem}'; keep one file per client")
        seen[f.stem] = f
    return files


def check_paths(data) -> None:
    """The files of ``data.path``, ``data.val_path`` and ``data.truth`` (a ``data=files``
    section) exist and are regular files that can be read; their contents are not read (the
    check before a results folder is made); a ``data.path`` of None (data held in memory) is
    not looked at."""
    if data.path is not None:
        data_files(data.path, "data.path")
    if data.val_path:
        data_files(data.val_path, "data.val_path")
    if data.truth:
        readable_file(data.truth, "data.truth")


@dataclass(frozen=True)
class ColumnMap:
    """Which columns of a trajectory table are the trajectory id and the time
    (``data.trajectory``, ``data.time``), and which other columns are not used
    (``data.ignore``). A column given by a name other than the default must be present."""

    trajectory: str = "trajectory"
    time: str = "t"
    ignore: tuple[str, ...] = ()
    #: a row with an empty value (``data.missing``): ``refuse`` it in one line, or ``split``
    #: (leave it out and split its trajectory there; :func:`_split_at_missing`)
    missing: str = "refuse"

    @classmethod
    def of(cls, data) -> ColumnMap:
        """The mapping of a ``data`` section (defaults for the settings it lacks)."""
        return cls(getattr(data, "trajectory", None) or "trajectory",
                   getattr(data, "time", None) or "t",
                   tuple(getattr(data, "ignore", None) or ()),
                   getattr(data, "missing", None) or "refuse")

    def for_columns(self, columns) -> ColumnMap:
        """This mapping for a table of ``columns``; where it lacks the mapped trajectory or
        time column but has the layout's own ``trajectory`` or ``t`` (a table of
        :func:`fnsysid.load_trajectories`, which renames them), that one."""
        cols = set(columns)
        return replace(self, trajectory=self.trajectory if self.trajectory in cols
                       or "trajectory" not in cols else "trajectory",
                       time=self.time if self.time in cols or "t" not in cols else "t")


#: what each column the reader may use is, for messages
SETTINGS = "data.states, data.inputs, data.trajectory, data.time or data.ignore"


def check_columns(df: pd.DataFrame, where, states, inputs=(), columns: ColumnMap | None = None,
                  one_file: bool = False, rename: bool = True) -> pd.DataFrame:
    """The columns of one trajectory table (a file's or an in-memory DataFrame) checked and
    renamed to the reader's names: the states and inputs as given, the mapped trajectory and
    time columns as ``trajectory`` and ``t`` (``rename=False``: as in ``df``), the ignored ones
    dropped.

    A column that is neither a state, an input, a known label (``client``, ``repeat``,
    ``split``; only ``split`` may be ignored: then ``data.holdout`` applies) nor mapped or
    ignored is refused naming it, ``where`` (the file) and the
    settings that would use it: nothing is read into another column silently. A state, an
    input or the client column (``one_file``: one table holds all clients) that is missing is
    refused, so is a mapped column given by a name other than the default that is missing, and
    a name given to two uses. Raises :class:`DataError`.
    """
    columns = columns or ColumnMap()
    states = [states] if isinstance(states, str) else list(states)
    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
    cols = [str(c) for c in df.columns]
    uses: dict[str, str] = {}
    # a default name in data.ignore: that column is not used (one trajectory, the row order)
    mapped = [(name, setting) for name, setting, default in
              ((columns.trajectory, "data.trajectory", "trajectory"),
               (columns.time, "data.time", "t"))
              if not (name == default and name in columns.ignore)]
    for name, setting in ([(c, "data.states") for c in states]
                          + [(c, "data.inputs") for c in inputs] + mapped
                          + [(c, "data.ignore") for c in columns.ignore]):
        known = name in KNOWN and not (name == "split" and setting == "data.ignore")
        if known and setting == "data.ignore":
            raise DataError(f"data.ignore: column '{name}' cannot be ignored (client and repeat "
                            "are labels the reader uses); allowed: other columns, and split "
                            "(then data.holdout applies)")
        if name in uses and uses[name] != setting or known:
            first = uses.get(name, "a label the reader knows (client, repeat, split)")
            raise DataError(f"{setting}: column '{name}' is also {first}; allowed: one use "
                            "per column")
        uses[name] = setting
    need = [(c, "data.states") for c in states] + [(c, "data.inputs") for c in inputs]
    if one_file:
        need.append(("client", "one file holds all clients"))
    for name, setting, default in ((columns.trajectory, "data.trajectory", "trajectory"),
                                   (columns.time, "data.time", "t")):
        if name != default:
            need.append((name, f"{setting}={name}"))
    for c, why in need:
        if c not in cols:
            hint = _near(c, cols)
            sep = next((x for x in (";", "\t", "|") if len(cols) == 1 and x in cols[0]), None)
            if sep is not None:
                hint = (f"; the header is one column holding {sep!r}: allowed: "
                        "comma-separated files (save with ',' as the separator and '.' as "
                        "the decimal point)")
            raise DataError(f"{where}: column '{c}' ({why}) is missing; columns: "
                            f"{', '.join(cols)}{hint}")
    unknown = [c for c in cols if c not in uses and c not in KNOWN]
    if unknown:
        c = unknown[0]
        more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])}" \
            f"{', ...' if len(unknown) > 4 else ''})" if len(unknown) > 1 else ""
        raise DataError(f"{where}: column '{c}'{more} is neither a state, an input, the "
                        f"trajectory ('{columns.trajectory}'), the time ('{columns.time}') nor "
                        f"client, repeat or split; allowed: name it in {SETTINGS} "
                        f"(to leave it out: data.ignore=[{c}])")
    out = df.copy(deep=False)
    out.columns = cols
    out = out.drop(columns=[c for c in cols if c in columns.ignore])
    if not rename:
        return out
    return out.rename(columns={columns.trajectory: "trajectory", columns.time: "t"})


def _near(name: str, cols) -> str:
    """``; did you mean 'x'?`` for the column of ``cols`` nearest ``name`` (the same name in
    another case first), or nothing."""
    near = [k for k in cols if k.lower() == name.lower()] or \
        difflib.get_close_matches(name, list(cols), n=1)
    return f"; did you mean '{near[0]}'?" if near else ""


def write_client_files(trajectories: pd.DataFrame, folder, name: str = "{client}") -> list[Path]:
    """Write a table of trajectories as one CSV per client, without the ``client`` column
    (the README's layout of a fleet's folder, e.g. a simulated run's
    ``trajectories.parquet`` made into what ``data=files`` or each Flower node reads);
    values as ``%.17g``, so they read back exactly.

    Parameters
    ----------
    trajectories : pandas.DataFrame
        Rows with a ``client`` column.
    folder : str or pathlib.Path
        Where the files go (created when missing).
    name : str, default="{client}"
        Each file's name without ``.csv``, ``{client}`` replaced by the client's id.

    Returns
    -------
    list of pathlib.Path
        The files written, in the clients' order.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for client, part in trajectories.groupby("client", sort=True):
        path = folder / f"{name.format(client=client)}.csv"
        part.drop(columns="client").to_csv(path, index=False, float_format="%.17g")
        paths.append(path)
    return paths


def read_trajectories(path, states, inputs=(), setting: str = "data.path",
                      client_file: bool = False, columns: ColumnMap | None = None,
                      every_ignored: bool = False) -> pd.DataFrame:
    """Read and check trajectories: the validated samples as one DataFrame.

    Parameters
    ----------
    path : a folder of per-client files or one file with a ``client`` column.
    states, inputs : names of the state and input columns (one name may be a string).
    setting : the setting that gave ``path``, for messages.
    client_file : ``path`` is one client's file of a folder (a Flower node's own file),
        read as in the folder: the file name gives the client.
    columns : the trajectory and time columns and the ignored ones (:class:`ColumnMap`;
        default: ``trajectory``, ``t``, none); see :func:`check_columns`.
    every_ignored : refuse an ignored name that no file has (see :func:`check_tables`).

    Returns
    -------
    DataFrame with columns ``repeat, client, trajectory, t, split``, the states and the inputs,
    sorted by (repeat, client, trajectory) with the file's order kept within a trajectory,
    and the helper columns ``_client``, ``_trajectory`` (sort ranks). ``client`` and
    ``trajectory`` hold strings (file stems or the ``client`` column's values; the ids as
    written, ``01`` is not ``1``, sorted as clients are); ``repeat`` numbers the files' repeat
    labels 0..S-1 in their order (``attrs["repeats"]`` holds the labels) and is 0 where the
    file has no such column; ``split`` is ``train`` where the file has no such column. Raises
    :class:`DataError`.
    """
    states = [states] if isinstance(states, str) else list(states)
    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
    files = data_files(path, setting)
    one_file = Path(path).is_file() and not client_file
    columns = columns or ColumnMap()
    # t as text: integers stay exact
    # t as text: integers stay exact; trajectory ids as text like client ids (01 is not 1)
    tables = ((f, read_table(f, text=("client", columns.time, columns.trajectory)))
              for f in files)
    return check_tables(tables, states, inputs, one_file, columns, every_ignored)


def check_tables(tables, states, inputs=(), one_file: bool = False,
                 columns: ColumnMap | None = None, every_ignored: bool = False
                 ) -> pd.DataFrame:
    """The checks and the result of :func:`read_trajectories` for tables already read:
    ``tables`` is a sequence of ``(name, DataFrame)``, one per file (``name`` a path, or any
    object with ``str()`` for messages and a ``stem`` naming the client); ``one_file``: a
    single table whose ``client`` column gives the clients; ``columns``: the column mapping
    (:class:`ColumnMap`); ``every_ignored``: a name in ``data.ignore`` that no table has is
    refused (the data a model is fitted to; not new data scored with the fit's mapping, nor
    one Flower node's file or a validation file, which may lack a column the others hold).
    Data held in memory take the same checks as files this way."""
    states = [states] if isinstance(states, str) else list(states)
    inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
    columns = columns or ColumnMap()
    names, parts, split, repeat = [], [], False, False
    seen: dict[str, None] = {}                 # every table's columns, in order
    for f, df in tables:
        names.append(f)
        seen.update(dict.fromkeys(str(c) for c in df.columns))
        split |= "split" in [str(c) for c in df.columns] and "split" not in columns.ignore
        repeat |= "repeat" in [str(c) for c in df.columns]
        parts.append(_check_file(df, f, states, inputs, one_file, columns))
    if every_ignored:
        check_ignored(columns, seen)
    out = _combine(parts, names, one_file, states, inputs, columns)
    out.attrs["columns"] = list(seen)      # every table's columns (check_ignored)
    out.attrs["split_column"] = split      # a table has a split column: the tables decide
    out.attrs["repeat_column"] = repeat    # a table labels its repeats
    return out


def check_ignored(columns: ColumnMap, seen) -> None:
    """Refuse a name of ``data.ignore`` that none of the columns ``seen`` (of every file the
    run reads: :func:`check_tables`' ``attrs["columns"]``) is: a typo, or a setting left
    over, would otherwise do nothing. Raises :class:`DataError`."""
    seen = list(dict.fromkeys(seen))
    absent = [c for c in columns.ignore if c not in seen]
    if absent:
        raise DataError(f"data.ignore: column '{absent[0]}' is in no file of the data; "
                        f"allowed: its columns ({', '.join(seen)}){_near(absent[0], seen)}")


def _check_file(df: pd.DataFrame, f: Path, states, inputs, one_file: bool,
                columns: ColumnMap | None = None) -> pd.DataFrame:
    """Columns present and numeric; returns the used columns with a canonical layout."""
    if len(df) == 0:
        raise DataError(f"{f}: no rows")
    columns = columns or ColumnMap()
    df = check_columns(df, f, states, inputs, columns, one_file, rename=False)
    cols = list(df.columns)
    traj, time = columns.trajectory, columns.time
    out = pd.DataFrame(index=df.index)
    out["_row"] = np.arange(1, len(df) + 1)
    out["repeat"] = _repeat(df, f) if "repeat" in cols else 0
    if one_file:
        check_id_types(df["client"], f)
        out["client"] = _text(df["client"])
        _check_ids(out["client"], f)
    else:
        out["client"] = f.stem
        _check_ids(pd.Series([f.stem]), f, "file name")
        if "client" in cols:        # the file stem names the client; a column may only agree
            other = (_text(df["client"]) != f.stem).to_numpy()
            if other.any():
                i = int(np.flatnonzero(other)[0])
                raise DataError(f"{f}: row {i + 1}, column 'client' is '{df['client'].iloc[i]}'"
                                f" but in a folder the file name gives the client ('{f.stem}'); "
                                "drop the column, or give data.path=<one file> holding all "
                                "clients")
    # trajectory ids as text, like client ids: 01 and 1 are two runs
    out["trajectory"] = _text(df[traj]) if traj in cols else "0"
    out["t"] = _time(df, f, time) if time in cols else np.arange(len(df), dtype=float)
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
    for c, name in (("client", "client"), ("trajectory", traj)):
        miss = out[c].isna().to_numpy()
        if miss.any():
            raise DataError(f"{f}: row {int(np.flatnonzero(miss)[0]) + 1}, column '{name}' is "
                            "empty")
    for c in states + inputs:
        out[c] = _numeric(df, c, f)
    return out


def _repeat(df: pd.DataFrame, f: Path) -> np.ndarray:
    """Column ``repeat`` as integers >= 0; an empty, fractional or negative value is an error
    naming the row."""
    col = df["repeat"]
    boolean = (np.ones(len(col), bool) if pd.api.types.is_bool_dtype(col) else
               col.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(bool)
               if col.dtype == object else np.zeros(len(col), bool))
    if boolean.any():                                  # True is not the label 1
        i = int(np.flatnonzero(boolean)[0])
        raise DataError(f"{f}: row {i + 1}, column 'repeat' is {col.iloc[i]}; allowed: "
                        "integers >= 0")
    rep = _numeric(df, "repeat", f)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(rep) | (rep < 0) | (rep != np.round(rep))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        shown = "empty" if np.isnan(rep[i]) else f"{df['repeat'].iloc[i]}"
        raise DataError(f"{f}: row {i + 1}, column 'repeat' is {shown}; allowed: integers >= 0")
    return rep.astype(int)


#: integers of larger magnitude are not all exact as floats
EXACT = 2 ** 53
_INTEGER = r"\s*[+-]?\d+\s*"


def _time(df: pd.DataFrame, f: Path, col: str = "t") -> np.ndarray:
    """Column ``col`` (the time, ``t`` unless ``data.time`` names another): integers (e.g.
    nanosecond stamps) and Parquet timestamps (as int64 nanoseconds) kept as integers, so
    that their order is checked exactly (a float has 53 bits: stamps 100 ns apart near 2023
    would be equal); other numbers as floats. A CSV's time is read as text: when some values
    are integers and others not (one client's stamps, another's seconds), the integers stay
    exact (an object array of Python ints and floats, which compare exactly) unless they are
    all within 2**53."""
    s = df[col]
    if pd.api.types.is_datetime64_any_dtype(s):
        if s.isna().any():
            i = int(np.flatnonzero(s.isna().to_numpy())[0])
            raise DataError(f"{f}: row {i + 1}, column '{col}' is empty; allowed: times or "
                            "numbers")
        return s.dt.as_unit("ns").astype("int64").to_numpy()
    if pd.api.types.is_integer_dtype(s) and not pd.api.types.is_bool_dtype(s):
        return s.to_numpy(dtype=np.uint64 if s.dtype.kind == "u" else np.int64)
    if pd.api.types.is_string_dtype(s):                    # text (a CSV's t)
        whole = s.str.fullmatch(_INTEGER).astype(object).fillna(False).to_numpy(bool)
        if whole.any():
            ints = pd.to_numeric(s[whole].str.strip())    # int64, uint64 (else float)
            exact = ints.dtype.kind in "iu"
            if whole.all() and exact:
                return ints.to_numpy()
            values = _numeric(df, col, f)                 # the others, or an error naming them
            if not exact or np.abs(ints.to_numpy(float)).max() > EXACT:
                values = values.astype(object)
                values[whole] = [int(v) for v in s[whole]]
            return values
    return _numeric(df, col, f)


def _numeric(df: pd.DataFrame, col: str, f: Path) -> np.ndarray:
    """Column ``col`` as floats; text that is not a number is an error naming the row."""
    s = df[col]
    if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
        num = pd.to_numeric(s, errors="coerce")
        bad = (num.isna() & s.notna() & (s.astype(str).str.strip() != "")).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{f}: row {i + 1}, column '{col}': '{s.iloc[i]}' is not a number; "
                            "allowed: finite numbers")
        s = num
    return s.to_numpy(dtype=float, na_value=np.nan)


def _text(values: pd.Series) -> pd.Series:
    """Labels as text without surrounding blanks (missing values stay missing)."""
    return values.where(values.isna(), values.astype(str).str.strip())


#: first characters that make a spreadsheet read a CSV cell as a formula (OWASP, "CSV
#: Injection", https://owasp.org/www-community/attacks/CSV_Injection)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _check_ids(ids: pd.Series, f, where: str = "column 'client'") -> None:
    """Refuse a client id that a spreadsheet would run as a formula when it opens a table
    fnsysid writes (``clients.csv``, ``estimates.csv``, ...): one that starts with ``=``,
    ``+``, ``-``, ``@``, a tab or a carriage return and is not a number."""
    for label in pd.unique(ids.dropna()):
        text = str(label)
        if text.startswith(FORMULA_START) and not np.isfinite(
                pd.to_numeric(pd.Series([text]), errors="coerce").to_numpy(float)).all():
            raise DataError(f"{f}: {where}: client id {text[:40]!r} starts with "
                            f"{text[0]!r}, which a spreadsheet opening the result tables would "
                            "run as a formula; allowed: ids that do not start with =, +, -, @, "
                            "a tab or a carriage return (numbers may)")


def check_id_types(values: pd.Series, f) -> None:
    """Refuse a ``client`` column whose distinct values become one id as text (``0`` and
    ``'0'`` in one DataFrame), which would merge two clients without a word."""
    if values.dtype != object:
        return
    raw = pd.unique(values.dropna())
    text: dict[str, object] = {}
    for v in raw:
        key = str(v).strip()
        if key in text and type(text[key]) is not type(v):
            raise DataError(f"{f}: column 'client' holds {text[key]!r} "
                            f"({type(text[key]).__name__}) and {v!r} ({type(v).__name__}), "
                            f"which are one client id as text ('{key}'); allowed: ids of one "
                            "type (all text, or all numbers)")
        text.setdefault(key, v)


def _client_rank(labels: pd.Series) -> np.ndarray:
    """Rank of each client (or trajectory) label, compared as text, in the clients' order:
    numerically when all labels are numbers (``2`` before ``10``; ``1`` and ``01`` stay two
    labels), else as text."""
    names = np.asarray(pd.unique(labels), dtype=str)
    num = pd.to_numeric(pd.Series(names), errors="coerce").to_numpy(dtype=float)
    order = np.lexsort((names, num)) if np.isfinite(num).all() else np.argsort(names,
                                                                            kind="stable")
    return pd.Index(names[order]).get_indexer(labels.to_numpy(dtype=str))


def _show(v) -> str:
    """A time for messages: integers in full, floats short where that names them exactly,
    else in full (an epoch time 1700065598.780763, not 1.70007e+09)."""
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    short = f"{v:g}"
    return short if float(short) == float(v) else repr(float(v))


def _combine(parts, files, one_file, states, inputs, columns: ColumnMap) -> pd.DataFrame:
    time = columns.time                  # the time column's name in the files, for messages
    sizes = [len(p) for p in parts]
    times = [p["t"].to_numpy() for p in parts]
    df = pd.concat(parts, ignore_index=True)
    if len({a.dtype for a in times}) > 1 and any(
            a.dtype.kind in "iuO" and len(a) and np.abs(a.astype(float)).max() > EXACT
            for a in times):                      # files of integers and of floats: ints exact
        df["t"] = np.concatenate([a.astype(object) for a in times])
    df["_file"] = np.repeat(np.arange(len(parts)), sizes)
    df["_whole"] = np.concatenate([_whole_times(a) for a in times])   # integer stamps

    def where(i: int) -> str:
        return f"{files[df['_file'].iat[i]]}: row {df['_row'].iat[i]}"

    # labels in sorted order; stable sort keeps each trajectory's rows in file order
    df["client"] = df["client"].astype(str)
    df["_client"] = _client_rank(df["client"])
    df["_trajectory"] = _client_rank(df["trajectory"])         # ids as text, like clients
    df = df.sort_values(["repeat", "_client", "_trajectory"], kind="stable",
                        ignore_index=True)
    missing = None
    if columns.missing == "split":
        df, missing = _split_at_missing(df, states, inputs, files)
    group = df[["repeat", "_client", "_trajectory"]].to_numpy()
    same_next = (group[1:] == group[:-1]).all(axis=1)          # row i and i+1: one trajectory
    last = np.append(~same_next, True)                         # last sample of a trajectory

    t = df["t"].to_numpy()                                     # integers stay integers
    for c in ["t"] + states + inputs:
        v = df[c].to_numpy()
        bad = ~np.isfinite(v.astype(float))
        if c in inputs:
            bad &= ~last                                       # last inputs are not used
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "empty or NaN" if np.isnan(v[i]) else f"{v[i]}"
            raise DataError(f"{where(i)}, column '{time if c == 't' else c}' is {what}; "
                            "allowed: finite numbers (data.missing=split leaves such rows out "
                            "of a fit and splits their trajectory there)")
    bad = same_next & ~(t[1:] > t[:-1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0]) + 1
        raise DataError(f"{where(i)}: {time}={_show(t[i])} does not increase within client "
                        f"'{df['client'].iat[i]}', trajectory {df['trajectory'].iat[i]} "
                        f"(previous {time}={_show(t[i - 1])})")
    starts = np.flatnonzero(np.append(True, ~same_next))
    lengths = np.diff(np.append(starts, len(df)))
    _check_spacing(t, same_next, starts, df["_client"].to_numpy(), df["_whole"].to_numpy(),
                   lambda i: (where(i), df["client"].iat[i], df["trajectory"].iat[i]), columns)
    if (lengths < 2).any():
        i = int(starts[np.flatnonzero(lengths < 2)[0]])
        raise DataError(f"{where(i)}: client '{df['client'].iat[i]}', trajectory "
                        f"{df['trajectory'].iat[i]} has 1 sample; a trajectory needs at least "
                        "2 (one transition)")
    clients = df.groupby("repeat", sort=True)["_client"].unique()
    ref = np.sort(clients.iloc[0])
    for rep, cl in clients.items():
        if not np.array_equal(np.sort(cl), ref):
            raise DataError(f"{files[0] if one_file else files[0].parent}: repeat {rep} "
                            "has other clients than repeat "
                            f"{clients.index[0]}; every repeat needs the same clients")
    labels = np.unique(df["repeat"])
    df["repeat"] = pd.Index(labels).get_indexer(df["repeat"])
    if inputs:                                                 # unused last inputs: 0
        df.loc[last, inputs] = df.loc[last, inputs].fillna(0.0)
    keep = ["repeat", "client", "trajectory", "t", "split"] + states + inputs
    out = df[keep + ["_client", "_trajectory", "_row"]].copy()
    out["_file"] = pd.Categorical.from_codes(df["_file"], [str(f) for f in files])
    out.attrs["files"] = [str(f) for f in files]
    out.attrs["repeats"] = [int(r) for r in labels]     # the files' labels of repeats 0..S-1
    if missing is not None:
        out.attrs["missing"] = missing
    return out


def _split_at_missing(df: pd.DataFrame, states: list[str], inputs: list[str], files=()
                      ) -> tuple[pd.DataFrame, dict]:
    """``data.missing=split``: the rows of ``df`` (sorted by repeat, client, trajectory) with
    an empty or non-finite time, state or input (an input only where it is used: not on a
    trajectory's last row) are left out, and each trajectory that had one is split there
    into parts labelled ``<id>#1``, ``<id>#2``, ... in their order (each part is a
    trajectory: no transition spans a left-out row); parts of a single row (no transition)
    are left out too. Returns the rows kept and ``{rows, single_rows, trajectories,
    parts}``: the rows left out for a missing value and as single rows, the trajectories
    that lost rows and the trajectories (parts) they became. A client left without a
    transition is refused (:class:`DataError` naming it and its file, ``files`` by the
    ``_file`` column): a fleet does not lose a client silently."""
    group = df[["repeat", "_client", "_trajectory"]].to_numpy()
    first = np.append(True, (group[1:] != group[:-1]).any(axis=1))
    last = np.append(first[1:], True)
    with np.errstate(invalid="ignore"):
        miss = ~np.isfinite(df[["t", *states]].to_numpy(dtype=float)).all(axis=1)
        if inputs:
            miss |= ~np.isfinite(df[inputs].to_numpy(dtype=float)).all(axis=1) & ~last
    info = {"rows": int(miss.sum()), "single_rows": 0, "trajectories": 0, "parts": 0}
    if not miss.any():
        return df, info
    tid = np.cumsum(first) - 1                                     # trajectory of each row
    cs = np.cumsum(miss)
    before = (cs - miss)[first][tid]                               # missing before it starts
    part = cs - before                                             # missing rows before a row
    split = np.bincount(tid, weights=miss, minlength=tid[-1] + 1)[tid] > 0
    keep = ~miss
    size = pd.Series(keep).groupby([tid, part]).transform("sum").to_numpy()
    single = keep & (size < 2)
    keep &= ~single
    lost = pd.unique(df.loc[~pd.Series(keep).groupby(df["_client"].to_numpy())
                            .transform("any").to_numpy(), "_client"])
    if len(lost):
        i = int(np.flatnonzero(df["_client"].to_numpy() == lost[0])[0])
        f = files[int(df["_file"].iat[i])] if len(files) else "the data"
        raise DataError(f"{f}: data.missing=split leaves client '{df['client'].iat[i]}' no "
                        "two consecutive rows without an empty time, state or input; allowed: "
                        "a client with at least one transition (fill its values, or leave its "
                        "file out)")
    out = df[keep].copy()
    k = pd.Series(part[keep]).groupby(tid[keep]).rank(method="dense").to_numpy(int)
    sp = split[keep]
    out["trajectory"] = np.where(sp, out["trajectory"].astype(str) + "#" + k.astype(str),
                                 out["trajectory"].astype(str))
    width = int(part.max()) + 2
    out["_trajectory"] = out["_trajectory"].to_numpy() * width + np.where(sp, k, 0)
    kept_parts = np.column_stack([tid, part])[keep & split]
    info.update(single_rows=int(single.sum()), trajectories=int(len(np.unique(tid[split]))),
                parts=int(len(np.unique(kept_parts, axis=0))))
    return out.reset_index(drop=True), info


#: uniform sampling: each trajectory's mean time step within this fraction of its client's,
#: and each client's within it of the fleet's (among clients whose times are of one kind),
#: beyond what the jitter that :data:`STEP_TOLERANCE` lets pass can explain
RATE_TOLERANCE = 0.02
#: each step within this fraction of its client's median step (jitter; a dropped sample is 1)
STEP_TOLERANCE = 0.5


def _whole_times(a: np.ndarray) -> np.ndarray:
    """Which of a time column's values are integers (stamps, sample numbers) rather than
    numbers with a fraction (seconds): (len(a),) bool."""
    if a.dtype.kind in "iu":
        return np.ones(len(a), bool)
    if a.dtype.kind == "O":
        return np.array([isinstance(v, (int, np.integer)) for v in a], bool)
    return np.zeros(len(a), bool)


def _check_spacing(t: np.ndarray, same_next: np.ndarray, starts: np.ndarray,
                   client: np.ndarray, whole: np.ndarray, at, columns: ColumnMap) -> None:
    """Refuse trajectories that are not sampled as the rest of their client and the fleet:
    the model maps one sample to the next, so a dropped row (a step twice the others) or a
    client logged at another rate gives a model that is right for no one.

    Each step must be within :data:`STEP_TOLERANCE` of its client's median step (timing
    jitter passes, a dropped row does not). A trajectory's rate is its mean step (its time
    span over its steps), a client's the mean over all its trajectories: each trajectory's
    within ``RATE_TOLERANCE + STEP_TOLERANCE / n`` of its client's (``n`` its steps: what
    jitter that passes the step rule can move a mean by), and each client's within the same
    bound of the median of the clients whose times are of the same kind (``whole``: integer
    stamps; else numbers with a fraction: one client's nanosecond stamps beside another's
    seconds are two units, not two rates). ``t`` the sorted time column, ``same_next`` (row
    i and i + 1 in one trajectory), ``starts`` each trajectory's first row, ``client`` each
    row's client rank, ``at(i)`` the row's ``(where, client, trajectory)``. Without a time
    column (the row order) every step is 1."""
    idx = np.flatnonzero(same_next)
    if not idx.size:
        return
    step = np.asarray(np.diff(t)[idx]).astype(float)
    owner = np.asarray(client)[idx]                                # each step's client rank
    n_c = np.bincount(owner)
    has = np.flatnonzero(n_c)                                       # clients with a step
    ordered = step[np.lexsort((step, owner))]                       # by client, then size
    first = np.concatenate(([0], np.cumsum(n_c)[:-1]))
    median = np.zeros(len(n_c))
    median[has] = (ordered[first[has] + (n_c[has] - 1) // 2]
                   + ordered[first[has] + n_c[has] // 2]) / 2
    time, traj = columns.time, columns.trajectory
    escape = ("or name the column in data.ignore instead of data.time, to take the rows' "
              "order as the time")
    h = median[owner]
    off = (np.abs(step - h) > STEP_TOLERANCE * h) & (h > 0)
    if off.any():
        j = int(np.flatnonzero(off)[0])
        i = int(idx[j]) + 1
        place, name, trajectory = at(i)
        raise DataError(
            f"{place}: {time} steps by {step[j]:.4g} from {_show(t[i - 1])} to {_show(t[i])} in "
            f"client '{name}', trajectory {trajectory}, where the client's step is {h[j]:.4g} "
            f"(a gap, or another sample rate); allowed: uniformly sampled trajectories, each "
            f"step within {STEP_TOLERANCE:.0%} of the client's: split the trajectory at a gap "
            f"(a new {traj} id) or resample it, {escape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        rate_c = np.bincount(owner, weights=step, minlength=len(n_c)) / n_c
    tr = np.concatenate(([0], np.cumsum(~same_next)))[idx]         # each step's trajectory
    n_t = np.bincount(tr, minlength=len(starts))
    with np.errstate(invalid="ignore", divide="ignore"):
        rate_t = np.bincount(tr, weights=step, minlength=len(starts)) / n_t
    ref = np.zeros(len(starts))
    ref[tr] = rate_c[owner]                                        # its client's rate
    bad = (n_t > 0) & (np.abs(rate_t - ref) > (RATE_TOLERANCE + STEP_TOLERANCE / np.maximum(
        n_t, 1)) * ref)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        place, name, trajectory = at(int(starts[k]))
        raise DataError(
            f"{place}: client '{name}', trajectory {trajectory} is sampled every "
            f"{rate_t[k]:.4g} ({time}, its mean step), the client every {ref[k]:.4g}; allowed: "
            f"one sample rate, each trajectory's within {RATE_TOLERANCE:.0%} of its "
            f"client's (and its timing jitter): resample it, {escape}")
    kind = np.bincount(owner, weights=whole[idx], minlength=len(n_c)) == n_c   # all stamps
    for w in (True, False):
        sel = has[kind[has] == w]
        if not sel.size:
            continue
        fleet = float(np.median(rate_c[sel]))
        bad = np.abs(rate_c[sel] - fleet) > (RATE_TOLERANCE + STEP_TOLERANCE / n_c[sel]) * fleet
        if bad.any():
            c = int(sel[np.flatnonzero(bad)[0]])
            place, name, _ = at(int(idx[np.flatnonzero(owner == c)[0]]))
            raise DataError(
                f"{place}: client '{name}' is sampled every {rate_c[c]:.4g} ({time}, its mean "
                f"step), the fleet every {fleet:.4g}; allowed: one sample rate, each client's "
                f"within {RATE_TOLERANCE:.0%} of the fleet's (and its timing jitter): "
                f"resample it, {escape}")
    _two_units(rate_c, n_c, has, kind, at, idx, owner, time)


#: the units integer time stamps are read in beside times in seconds
STAMP_UNITS = {"seconds": 1.0, "milliseconds": 1e3, "microseconds": 1e6, "nanoseconds": 1e9}


def _two_units(rate_c, n_c, has, kind, at, idx, owner, time: str) -> None:
    """Warn where some clients' times are integers (stamps) and others' fractional
    (seconds), which :func:`_check_spacing` compares only among themselves, unless the
    stamps' step is the seconds' in seconds (Unix seconds), milliseconds, microseconds or
    nanoseconds (:data:`STAMP_UNITS`, within the fleet's rate bound): then they are one rate
    in two units; else (a client at 50 Hz in milliseconds beside others at 100 Hz in seconds, or
    sample numbers beside seconds) the rates could not be compared, which the line says with
    what the stamps' step would be in each unit."""
    whole, frac = has[kind[has]], has[~kind[has]]
    if not (whole.size and frac.size):
        return
    stamps, seconds = float(np.median(rate_c[whole])), float(np.median(rate_c[frac]))
    bound = RATE_TOLERANCE + STEP_TOLERANCE / float(n_c[has].min())
    if any(abs(stamps / f - seconds) <= bound * seconds for f in STAMP_UNITS.values()):
        return
    few, many = (whole, frac) if whole.size <= frac.size else (frac, whole)
    names = [str(at(int(idx[np.flatnonzero(owner == c)[0]]))[1]) for c in few[:5]]
    more = f" and {few.size - 5} more" if few.size > 5 else ""
    read = ", ".join(f"{stamps / f:.4g}" for f in STAMP_UNITS.values())
    log.warning("time column '%s': client(s) %s%s have %s times and the other %d client(s) %s: "
                "the integer times step by %.4g, the fractional by %.4g; read as seconds, "
                "milliseconds, microseconds or nanoseconds the integer step is %s s, none of "
                "them %.4g, so the two sample rates were not compared; give every client's %s "
                "in one unit (a client at another rate gives a model right for no client)", time,
                ", ".join(f"'{n}'" for n in names), more,
                "integer" if few is whole else "fractional", many.size,
                "fractional" if few is whole else "integer", stamps, seconds, read, seconds,
                time)


def _largest(rows: pd.DataFrame, states: list[str], inputs: list[str]) -> tuple[int, str]:
    """Position (in ``rows``) and column of the largest |value| among the states and the
    inputs that are used (not those of a trajectory's last sample)."""
    columns = states + inputs
    values = np.abs(rows[columns].to_numpy(float))
    key = rows[["repeat", "_client", "_trajectory"]].to_numpy()
    values[np.append((key[1:] != key[:-1]).any(axis=1), True), len(states):] = 0.0  # unused
    i, k = np.unravel_index(int(np.argmax(values)), values.shape)
    return int(i), columns[k]


def check_finite(train, heldout, train_rows: pd.DataFrame, val_rows: pd.DataFrame,
                 states: list[str], inputs: list[str], clients: list[str],
                 path=None, repeats=None) -> None:
    """Refuse data whose statistics overflow float64 (before any round or feature scaling).

    ``train`` the training statistics (``H, b, yy``), ``heldout`` the held-out ones (``gram,
    cross, yy, std``) or None, computed from ``train_rows``/``val_rows`` (as returned by
    :func:`read_trajectories`). A client whose sums of squared features (or targets) are not
    finite is named with the file and row of its largest value among the states and the
    inputs that are used (not those of a trajectory's last sample). So are the training
    statistics summed over the clients of a repeat (the pooled data of ``strategy=
    centralized`` and of the theory table), which may overflow when each client's do not;
    ``path`` (``data.path``) names the data then; ``repeats`` the repeats' labels.
    """
    labels = repeats if repeats is not None else range(train.H.shape[0])
    parts = [("training", (train.H, train.b, train.yy), train_rows)]
    if heldout is not None:
        parts.append(("held-out", (heldout.gram, heldout.cross, heldout.yy, heldout.std),
                      val_rows))
    for which, arrays, rows in parts:
        S, M = arrays[0].shape[:2]
        bad = np.zeros((S, M), bool)
        for a in arrays:
            bad |= ~np.isfinite(a).reshape(S, M, -1).all(axis=-1)
        if not bad.any():
            continue
        s, m = (int(k) for k in np.argwhere(bad)[0])
        mine = rows[(rows["repeat"].to_numpy() == s) & (rows["_client"].to_numpy() == m)]
        i, col = _largest(mine, states, inputs)
        rep = f" (repeat {labels[s]})" if S > 1 else ""
        raise DataError(
            f"{mine['_file'].iat[i]}: row {mine['_row'].iat[i]}, column '{col}' is "
            f"{mine[col].iat[i]:g}: the {which} statistics of client '{clients[m]}'{rep}"
            " (its features squared and summed over its samples) overflow float64 (this is the "
            "client's largest |value|); allowed: values whose squared features sum to less "
            f"than {np.finfo(float).max:.3g} (rescale the column)")
    S, M = train.H.shape[:2]
    with np.errstate(over="ignore", invalid="ignore"):
        bad = np.zeros(S, bool)
        for a in (train.H, train.b, train.yy):
            bad |= ~np.isfinite(a.sum(axis=1)).reshape(S, -1).all(axis=-1)
    if bad.any():
        s = int(np.flatnonzero(bad)[0])
        mine = train_rows[train_rows["repeat"].to_numpy() == s]
        i, col = _largest(mine, states, inputs)
        m = int(mine["_client"].iat[i])
        rep = f" of repeat {labels[s]}" if S > 1 else ""
        name = f"data.path={path}" if path is not None else str(mine["_file"].iat[i])
        raise DataError(
            f"{name}: the training statistics of its {M} clients{rep} summed (the pooled data "
            "of strategy=centralized and of the theory table: features squared and summed over "
            "all clients' samples) overflow float64, though each client's are finite; the "
            f"largest |value| is {mine[col].iat[i]:g} ({mine['_file'].iat[i]}: row "
            f"{mine['_row'].iat[i]}, column '{col}', client '{clients[m]}'); allowed: values "
            "whose squared features summed over all clients stay below "
            f"{np.finfo(float).max:.3g} (rescale the column)")


def truth_parameters(theta: np.ndarray) -> np.ndarray:
    """Which of the p parameters true parameters ``theta`` (S, M, p) score: those known
    (finite) for every client and repeat, (p,) booleans."""
    return np.isfinite(theta).reshape(-1, theta.shape[-1]).all(axis=0)


def load_truth(path, clients: list[str], param_names: list[str], repeats) -> np.ndarray:
    """True parameters (S, M, p) from a file with columns ``repeat`` (optional), ``client``,
    ``parameter``, ``value``, in the model's parameter basis.

    The file may give a subset of the parameters, the same for every client and repeat: the
    others are NaN (not scored; ``e_r`` is taken over the given ones, see
    :func:`truth_parameters`). A parameter given for some clients and not for others is an
    error naming the first one without it.

    ``repeats``: the data's repeat labels (S of them, in order), or their number S (labels
    0..S-1). Client ids are compared as text with ``clients`` (``00`` is not ``0``), repeats
    by their labels; a ``repeat`` that is not an integer >= 0 or not among the labels and a
    second row for one (repeat,) client and parameter are errors naming the row.
    """
    labels = list(range(repeats)) if isinstance(repeats, (int, np.integer)) else \
        [int(r) for r in repeats]
    path = readable_file(path, "data.truth")
    df = read_table(path, text=("client", "parameter"))
    cols = [str(c) for c in df.columns]
    df.columns = cols
    for c in ("client", "parameter", "value"):
        if c not in cols:
            raise DataError(f"{path}: column '{c}' is missing; columns: {', '.join(cols)} "
                            "(needed: repeat (optional), client, parameter, value)")
    other = [c for c in cols if c not in TRUTH_COLUMNS]
    if other:
        raise DataError(f"{path}: column '{other[0]}' is not a column of a truth file; allowed: "
                        "repeat (optional), client, parameter, value")
    if len(df) == 0:
        raise DataError(f"{path}: no rows; allowed: one row per client and parameter (repeat, "
                        "client, parameter, value)")
    value = _numeric(df, "value", path)
    bad = ~np.isfinite(value)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{path}: row {i + 1}, column 'value' is not a finite number")
    rep = _repeat(df, path) if "repeat" in cols else None
    client = _text(df["client"]).fillna("").to_numpy(dtype=str)
    param = _text(df["parameter"]).fillna("").to_numpy(dtype=str)
    c_idx = pd.Index(clients).get_indexer(client)
    p_idx = pd.Index(param_names).get_indexer(param)
    for idx, what, allowed, vals in ((c_idx, "client", clients, client),
                                     (p_idx, "parameter", param_names, param)):
        if (idx < 0).any():
            i = int(np.flatnonzero(idx < 0)[0])
            shown = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
            raise DataError(f"{path}: row {i + 1}: {what} '{vals[i]}' is not in the data's "
                            f"{what}s ({shown})")
    keys = pd.DataFrame({"repeat": 0 if rep is None else rep, "client": c_idx, "param": p_idx})
    again = keys.duplicated().to_numpy()
    if again.any():
        i = int(np.flatnonzero(again)[0])
        first = int(np.flatnonzero((keys.to_numpy() == keys.to_numpy()[i]).all(axis=1))[0])
        which = "" if rep is None else f"repeat {rep[i]}, "
        raise DataError(f"{path}: row {i + 1}: {which}client '{client[i]}', parameter "
                        f"'{param[i]}' is given again (first in row {first + 1}); allowed: one "
                        f"row per {'' if rep is None else 'repeat, '}client and parameter")
    S, M, p = len(labels), len(clients), len(param_names)
    theta = np.full((S, M, p), np.nan)
    if rep is None:
        theta[:, c_idx, p_idx] = value
    else:
        r_idx = pd.Index(labels).get_indexer(rep)
        if (r_idx < 0).any():
            i = int(np.flatnonzero(r_idx < 0)[0])
            shown = ", ".join(map(str, labels[:12])) + (", ..." if S > 12 else "")
            raise DataError(f"{path}: row {i + 1}: repeat {rep[i]} is not a repeat of the "
                            f"data; allowed: the data's repeat labels ({shown})")
        theta[r_idx, c_idx, p_idx] = value
    given = np.isfinite(theta).any(axis=(0, 1))              # the parameters the file scores
    if np.isnan(theta[..., given]).any():
        s, m, k = np.argwhere(np.isnan(theta[..., given]))[0]
        k = int(np.flatnonzero(given)[k])
        raise DataError(f"{path}: no value for repeat {labels[s]}, client '{clients[m]}', "
                        f"parameter '{param_names[k]}' (given for other clients); allowed: the "
                        "same parameters for every client and repeat (a parameter left out for "
                        "all is not scored)")
    known = np.where(np.isnan(theta), 0.0, theta)             # norms over the given ones
    with np.errstate(over="ignore"):
        norm2 = np.einsum("smp,smp->sm", known, known)
    if not np.isfinite(norm2).all():                   # e_r divides by the norm
        s, m = (int(k) for k in np.argwhere(~np.isfinite(norm2))[0])
        mine = (c_idx == m) & ((rep == labels[s]) if rep is not None else True)
        i = int(np.flatnonzero(mine)[np.argmax(np.abs(value[mine]))])
        raise DataError(f"{path}: row {i + 1}, column 'value' is {value[i]:g}: the true parameters "
                        f"of client '{clients[m]}' have a squared norm that overflows float64 "
                        "(e_r divides by their norm); allowed: "
                        f"values whose squares sum to less than {np.finfo(float).max:.3g} per "
                        "client")
    with np.errstate(under="ignore"):       # squares below the smallest normal float: too small
        zero = np.square(known).sum(axis=-1) < np.finfo(float).tiny
    if zero.any():
        s, m = (int(k) for k in np.argwhere(zero)[0])
        mine = (c_idx == m) & ((rep == labels[s]) if rep is not None else True)
        i = int(np.flatnonzero(mine)[np.argmax(np.abs(value[mine]))])
        which = f"repeat {labels[s]}, " if rep is not None else ""
        raise DataError(f"{path}: {which}client '{clients[m]}': the true parameters have norm 0 "
                        "(all zero, or so small that their squares underflow: the largest |value|"
                        f" is {abs(value[i]):g}, row {i + 1}) and e_r divides by their norm; "
                        "allowed: per client, some |value| above about 1e-154")
    return theta
