"""The clients' data of a run, as one :class:`~fnsysid.dynamics.model.ClientData` whatever its
source.

``data`` config group: ``simulated`` (trajectories simulated from the chosen system, see
:func:`fnsysid.dynamics.model.generate`) or ``files`` (trajectories read by
:mod:`fnsysid.data.files`). Either way the run gets the training statistics, optional
held-out trajectories (:mod:`fnsysid.data.heldout`) and the true parameters when known.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from fnsysid.config.checks import ConfigError, DataError, check_batch_size
from fnsysid.config.errors import some
from fnsysid.config.schema import Settings
from fnsysid.data.heldout import HeldOut, add_block, empty_heldout, heldout_from_trajectories
from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import (
    ClientData,
    Model,
    chunk_clients,
    for_chunks,
    generate,
    length_classes,
    ragged_stats,
    simulate_blocks,
)

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("fnsysid")
SOURCES = ("simulated", "files")


@dataclass
class Dataset:
    """What a run learns from and is judged on.

    ``train`` the clients' training statistics (``theta_true`` NaN when the truth is unknown);
    ``heldout`` their held-out trajectories or None; ``clients`` the client labels;
    ``settings`` the data's own M, N, T, eps for the summary; ``repeats`` the files' repeat
    labels of repeats 0..S-1 (None: 0..S-1).
    """

    train: ClientData
    heldout: HeldOut | None
    clients: list[str]
    settings: dict = field(default_factory=dict)
    repeats: list[int] | None = None

    @property
    def has_truth(self) -> bool:
        return bool(np.isfinite(self.train.theta_true).any(axis=-1).all())   # some scored


def load_data(settings: Settings, model: Model, optimizer,
              given: frozenset[str] = frozenset(), budget=None, tables=None,
              strategy=None) -> Dataset:
    """The clients' data for the run described by ``settings`` (``data.source``); ``given``: the
    settings given explicitly, ``budget``: the memory check of file data, ``tables``: the
    trajectories of ``data=files`` already read, ``strategy``: the run's (its per-client
    arrays in the memory check; see :func:`from_files`)."""
    source = settings.data.source
    if source == "simulated":
        if _REUSED is None:
            return simulated(settings, model, optimizer)
        key = _simulation_key(settings, optimizer)
        if key not in _REUSED:
            _REUSED[key] = _read_only(simulated(settings, model, optimizer))
            while len(_REUSED) > _REUSED_MAX:
                _REUSED.popitem(last=False)
        _REUSED.move_to_end(key)
        return _REUSED[key]
    if source == "files":
        return from_files(settings, model, optimizer, given, budget, tables=tables,
                          strategy=strategy)
    raise ConfigError(f"data.source={source} is not allowed; allowed: {', '.join(SOURCES)}")


# --- simulated data shared by the runs of one process ---------------------------------------------

#: simulated datasets by what determines them, while :func:`reuse_simulations` is on
_REUSED: OrderedDict | None = None
#: most datasets kept (the least recently used goes first)
_REUSED_MAX = 32


@contextmanager
def reuse_simulations():
    """Within the block, runs whose simulated data are determined by equal settings share one
    dataset (made read-only) instead of simulating it again: the jobs of a sweep over
    strategies, K, lr or R. The data are those a fresh simulation gives, by construction: the
    key holds every setting :func:`simulated` reads. Nested blocks share the outer store."""
    global _REUSED
    saved = _REUSED
    if _REUSED is None:
        _REUSED = OrderedDict()
    try:
        yield
    finally:
        _REUSED = saved


def _simulation_key(settings: Settings, optimizer) -> str:
    """Every setting that :func:`simulated` reads: the system and feature map (the model), the
    data group, M, N, T, eps, repeats, seed, and whether the optimizer keeps the samples."""
    resolved = settings.resolved
    key = {k: resolved[k] for k in ("system", "feature_map", "data", "M", "N", "T", "eps",
                                    "repeats", "seed")}
    key["needs_samples"] = bool(optimizer.needs_samples)
    return json.dumps(key, sort_keys=True)


def _read_only(dataset: Dataset) -> Dataset:
    """``dataset`` with its arrays made read-only (a run that wrote into shared data fails)."""
    parts = [dataset.train, dataset.heldout]
    parts += dataset.heldout.blocks if dataset.heldout is not None else []
    for part in parts:
        for f in fields(part) if part is not None else ():
            a = getattr(part, f.name)
            if isinstance(a, np.ndarray):
                a.setflags(write=False)
    return dataset


# --- simulated ----------------------------------------------------------------------------------

@np.errstate(over="ignore", invalid="ignore")    # statistics that overflow: refused, not warned
def simulated(settings: Settings, model: Model, optimizer) -> Dataset:
    """Simulated clients; ``data.val_N`` held-out trajectories per client from their own
    random streams (the training data do not depend on them). Data whose statistics overflow
    float64 (states that grow without bound, huge initial states or inputs) are refused."""
    if not model.system.simulates:
        raise ConfigError(f"system={model.system.name} has no simulator; use data=files "
                          "data.path=... (see README, Your own data)")
    s = settings
    train = generate(model, s.M, s.N, s.T, s.eps, s.repeats, s.seed,
                     keep_samples=optimizer.needs_samples, shared_noise=s.data.shared_noise)
    n_val = s.data.val_N
    ho = None
    if n_val == 0:
        log.warning("data.val_N=0: no held-out trajectories: the held-out NRMSE columns are "
                    "empty")
    if n_val > 0:
        x, u = simulate_all(model, settings, n_val, rnd.HOLDOUT)
        ho = heldout_from_trajectories(model, x, u, np.ones(x.shape[:-1], bool))
    for which, arrays in (("training", (train.H, train.b, train.yy)),
                          ("held-out", () if ho is None else (ho.gram, ho.cross, ho.yy, ho.std))):
        bad = np.zeros((s.repeats, s.M), bool)
        for a in arrays:
            bad |= ~np.isfinite(a).reshape(s.repeats, s.M, -1).all(axis=-1)
        if bad.any():
            r, m = (int(k) for k in np.argwhere(bad)[0])
            raise ConfigError(
                f"data=simulated: the {which} statistics of client {m} (repeat {r}) overflow "
                "float64 (its features squared and summed over its samples: the simulated "
                f"states of system={model.system.name} grow too large); allowed: system.x0, "
                "system.inputs, system.disturbance and T for which the states stay finite when "
                "squared (|x| below about 1e154)")
    bad = np.zeros(s.repeats, bool)
    for a in (train.H, train.b, train.yy):
        bad |= ~np.isfinite(a.sum(axis=1)).reshape(s.repeats, -1).all(axis=-1)
    if bad.any():
        raise ConfigError(
            f"data=simulated: the training statistics of the {s.M} clients (repeat "
            f"{int(np.flatnonzero(bad)[0])}) summed overflow float64 (the pooled data of "
            "strategy=centralized and of the theory table), though each client's are finite; "
            "allowed: system.x0, system.inputs, system.disturbance and T for which the states "
            "of all clients stay finite when squared and summed")
    facts = {k: s.resolved[k] for k in ("M", "N", "T", "eps")}     # as given
    return Dataset(train, ho, [str(m) for m in range(s.M)], facts)


def simulate_all(model: Model, settings, n_traj: int, purpose: int):
    """States (S, M, n_traj, T + 1, n_x) and inputs (S, M, n_traj, T, n_u) of every client."""
    S, M, T = settings.repeats, settings.M, settings.T
    sys = model.system
    x = np.empty((S, M, n_traj, T + 1, sys.n_x))
    u = np.empty((S, M, n_traj, T, sys.n_u))

    def work(s, chunk):
        lo, hi = chunk[0][1], chunk[-1][2]
        _, x[s, lo:hi], u[s, lo:hi] = simulate_blocks(
            model, s, chunk, n_traj, T, settings.eps, settings.seed, settings.data.shared_noise,
            purpose)

    for_chunks(S, rnd.blocks(M), chunk_clients(model, n_traj, T), work)
    return x, u


def export_trajectories(model: Model, settings: Settings, dataset: Dataset
                        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A simulated run's trajectories and true parameters in the import format.

    Returns (trajectories, truth): trajectories with columns ``repeat, client, trajectory, t,
    split``, the states and inputs by name (a trajectory's last inputs are empty); truth with
    ``repeat, client, parameter, value``. Reading them back with ``data=files`` gives the same
    training statistics and held-out data.
    """
    import pandas as pd

    S, M = settings.repeats, settings.M
    N = np.broadcast_to(np.asarray(settings.N, int), (M,))
    x, u = simulate_all(model, settings, int(N.max()), rnd.TRAJECTORY)
    keep = np.arange(x.shape[2])[None, :] < N[:, None]            # (M, n_max)
    parts = [_long(x, u, np.broadcast_to(keep, x.shape[:3]), "train", model)]
    if dataset.heldout is not None:
        ho = dataset.heldout
        traj = N[None, :, None] + np.arange(ho.x.shape[2])       # ids after the training ones
        parts.append(_long(ho.x, ho.u, np.ones(ho.x.shape[:3], bool), "val", model, traj))
    df = pd.concat(parts, ignore_index=True).sort_values(
        ["repeat", "client", "trajectory", "t"], kind="stable", ignore_index=True)
    theta = dataset.train.theta_true
    truth = pd.DataFrame({
        "repeat": np.repeat(np.arange(S), M * model.p),
        "client": np.tile(np.repeat(np.arange(M), model.p), S),
        "parameter": np.tile(model.param_names, S * M),
        "value": theta.ravel(),
    })
    return df, truth


def _long(x, u, keep, split, model, traj=None) -> pd.DataFrame:
    """Rows (one per sample) of the trajectories ``x`` (S, M, J, L, n_x) where ``keep``."""
    S, M, J, L, _ = x.shape
    s, m, j = np.nonzero(keep)
    if traj is None:
        traj = np.broadcast_to(np.arange(J), (S, M, J))
    traj = np.broadcast_to(traj, (S, M, J))
    sys = model.system
    cols = {"repeat": np.repeat(s, L), "client": np.repeat(m, L),
            "trajectory": np.repeat(traj[s, m, j], L), "t": np.tile(np.arange(L), len(s)),
            "split": split}
    xs = x[s, m, j].reshape(-1, x.shape[-1])
    upad = np.concatenate([u[s, m, j], np.full((len(s), 1, u.shape[-1]), np.nan)], axis=1)
    us = upad.reshape(-1, u.shape[-1])
    for k, name in enumerate(sys.state_names):
        cols[name] = xs[:, k]
    for k, name in enumerate(sys.input_names):
        cols[name] = us[:, k]
    import pandas as pd

    return pd.DataFrame(cols)


# --- from files ---------------------------------------------------------------------------------

def column_names(settings, model: Model) -> tuple[list[str], list[str]]:
    """State and input column names: ``data.states``/``data.inputs`` or the system's own."""
    sys = model.system
    states = settings.data.states or sys.state_names
    inputs = settings.data.inputs
    inputs = sys.input_names if inputs is None else inputs
    if len(states) != sys.n_x or len(inputs) != sys.n_u:
        raise ConfigError(f"data.states={states}, data.inputs={inputs}: system="
                          f"{sys.name} has {sys.n_x} states ({', '.join(sys.state_names)}) and "
                          f"{sys.n_u} inputs ({', '.join(sys.input_names)})")
    return list(states), list(inputs)


def _generic_hint(exc: DataError, settings, model, given: frozenset[str]) -> DataError:
    """A state or input column of the default system missing from files read without a
    ``system=`` given: the error with the hint of ``system=generic`` (a fleet's own
    columns), else the error as it is."""
    msg = str(exc)
    own = settings.data.states is None or settings.data.inputs is None
    if "system" in given or not own or not re.search(
            r"\(data\.(states|inputs)\) is missing", msg):
        return exc
    return DataError(f"{msg}; system={model.system.name} reads its own columns "
                     f"({', '.join(model.system.state_names + model.system.input_names)}); "
                     "for your own columns give system=generic data.states=[...] "
                     "data.inputs=[...]")


def read_files(settings: Settings, model: Model, key: str = "path",
               given: frozenset[str] = frozenset(), client_file: bool = False):
    """The checked trajectories of ``data.<key>`` (``path`` or ``val_path``) as the run reads
    them: the model's state and input columns, the settings' column mapping; an error of
    ``data.path`` carries the generic system's hint (:func:`_generic_hint`)."""
    from fnsysid.data.files import ColumnMap, read_trajectories

    states, inputs = column_names(settings, model)
    columns = ColumnMap.of(settings.data)
    if key != "path":
        return read_trajectories(getattr(settings.data, key), states, inputs,
                                 setting=f"data.{key}", columns=columns)
    try:
        # with data.val_path the ignored names are checked on both (check_ignored)
        return read_trajectories(settings.data.path, states, inputs, client_file=client_file,
                                 columns=columns, every_ignored=not client_file
                                 and not settings.data.val_path)
    except DataError as exc:
        raise _generic_hint(exc, settings, model, given) from None


def _split_gaps(df, path) -> None:
    """The log line when a ``split`` column leaves some clients without held-out rows while
    others have them (a column in some files only): the held-out NRMSE and the model check
    then leave those clients out, and ``data.holdout`` does not apply to them."""
    val = df["split"] == "val"
    have = set(df.loc[val, "_client"])
    names = df.drop_duplicates("_client").set_index("_client")["client"]
    none = [str(names[c]) for c in sorted(set(df["_client"]) - have)]
    if none:
        log.warning("data.path=%s: the split column marks no row val for %d of %d clients "
                    "(%s%s): the held-out NRMSE (max and mean over clients) and the model "
                    "check leave them out, and data.holdout does not apply to them (it "
                    "applies only where no file has a split column); mark their held-out rows "
                    "split=val, or drop the column", path, len(none), len(names),
                    ", ".join(none[:10]), ", ..." if len(none) > 10 else "")


def _missing_line(df, setting: str) -> None:
    """The log line of ``data.missing=split`` when rows were left out (the reader's counts in
    ``df.attrs["missing"]``)."""
    info = df.attrs.get("missing")
    if not info or not info["rows"]:
        return
    single = (f", and {info['single_rows']} row(s) left alone between them (a part of one "
              "row has no transition)") if info["single_rows"] else ""
    log.warning("data.missing=split: %s: %d row(s) with an empty value left out; the %d "
                "trajectories that had them are now %d trajectories%s", setting, info["rows"],
                info["trajectories"], info["parts"], single)


def check_trajectory_files(settings: Settings, model: Model) -> None:
    """Read the trajectory files of ``data.path`` and ``data.val_path`` as
    :func:`from_files` reads them (:func:`read_files`), for their contents' errors only (the
    check of a sweep before its jobs start: each job would refuse the same file in the same
    words)."""
    from fnsysid.data.files import ColumnMap, check_ignored

    seen = []
    for key in ("path", "val_path"):
        if getattr(settings.data, key):
            seen += read_files(settings, model, key).attrs["columns"]
    if settings.data.val_path:
        check_ignored(ColumnMap.of(settings.data), seen)


@np.errstate(over="ignore", invalid="ignore")    # statistics that overflow: refused, not warned
def from_files(settings: Settings, model: Model, optimizer,
               given: frozenset[str] = frozenset(), budget=None,
               client_file: bool = False, tables=None, strategy=None) -> Dataset:
    """Clients read from ``data.path`` (and ``data.val_path``), truth from ``data.truth``.

    The files give the clients and repeats; an ``M`` or ``repeats`` in ``given`` (the
    settings given explicitly) that differs from them is refused. ``budget(need, what)``,
    when given, is called with the bytes the arrays of the data read will need
    (:func:`fnsysid.data.memory.built_bytes`) and a description of the data, before they are
    built; it raises to refuse them. ``client_file``: ``data.path`` is one client's file of a
    folder (a Flower node's own file). ``tables``: the trajectories as ``(name, DataFrame)``
    pairs, one per client, read already (data held in memory; ``data.path`` then only names
    them in messages), checked as files are (:func:`~fnsysid.data.files.check_tables`).
    ``strategy``: the run's, whose per-client arrays the memory check counts
    (:func:`fnsysid.data.memory.matrix_values`; None: a federated strategy's).
    """
    import pandas as pd

    from fnsysid.data.files import (
        ColumnMap,
        check_finite,
        check_ignored,
        check_tables,
        load_truth,
        truth_parameters,
    )

    states, inputs = column_names(settings, model)
    columns = ColumnMap.of(settings.data)
    if tables is None:
        df = read_files(settings, model, "path", given, client_file)
    else:
        try:
            df = check_tables(tables, states, inputs, columns=columns, every_ignored=True)
        except DataError as exc:
            raise _generic_hint(exc, settings, model, given) from None
    _missing_line(df, "data.path" if tables is None else "the data")
    clients = [str(c) for c in df.drop_duplicates("_client").sort_values("_client")["client"]]
    labels = df.attrs["repeats"]                         # the files' repeat labels
    S, M = len(labels), len(clients)
    for key, have, what in (("M", M, "clients"), ("repeats", S, "repeats")):
        value = getattr(settings, key)
        if key in given and value is not None and value != have:
            raise DataError(f"{key}={value} does not match data.path={settings.data.path}, "
                            f"which holds {have} {what}: drop {key} (the files give it)")
    if settings.data.val_path:
        if (df["split"] == "val").any():
            raise DataError(f"data.path={settings.data.path} marks held-out rows (split=val) and "
                            f"data.val_path={settings.data.val_path} gives held-out files: use one")
        val = read_files(settings, model, "val_path")
        _missing_line(val, "data.val_path")
        if not client_file:
            check_ignored(columns, df.attrs["columns"] + val.attrs["columns"])
        val_clients = pd.Index(clients).get_indexer(val["client"])
        if (val_clients < 0).any():
            bad = val["client"].to_numpy()[val_clients < 0][0]
            raise DataError(f"data.val_path={settings.data.val_path}: client '{bad}' is not in "
                            f"data.path's clients")
        if val.attrs["repeats"] != labels:
            raise DataError(f"data.val_path={settings.data.val_path} has repeats "
                            f"{_labels(val.attrs['repeats'])}, data.path "
                            f"{_labels(labels)}; allowed: the same repeat labels")
        val["_client"] = val_clients
        val["split"] = "val"
        val = val.sort_values(["repeat", "_client", "_trajectory"], kind="stable",
                              ignore_index=True)
        df = df[df["split"] == "train"]
    else:
        val = None
        split_column = df.attrs.get("split_column", False)
        df = _hold_out(df, settings.data.holdout, settings.data.path)
        if not (df["split"] == "val").any():
            why = ("its split column marks no row val" if split_column else
                   "data.holdout=0" if settings.data.holdout == 0 else
                   "no client has two trajectories")
            log.warning("data.path=%s: no held-out trajectories (%s): the held-out NRMSE "
                        "columns are empty", settings.data.path, why)
        elif split_column:
            _split_gaps(df, settings.data.path)
    train_rows = df[df["split"] == "train"]
    val_rows = df[df["split"] == "val"] if val is None else val
    if budget is not None:
        _check_budget(budget, model, optimizer, train_rows, val_rows, S, M, len(states) +
                      len(inputs), settings.data.path, strategy)
    train = _client_data(model, train_rows, S, M, states, inputs, optimizer.needs_samples,
                         settings.data.path, clients, labels)
    if settings.data.truth:
        train.theta_true = load_truth(settings.data.truth, clients, model.param_names, labels)
        scored = truth_parameters(train.theta_true)
        if not scored.all():
            left = [n for n, k in zip(model.param_names, scored, strict=True) if not k]
            log.warning("data.truth=%s gives %d of the %d parameters: e_r is taken over those, "
                        "%d left out (not scored): %s", settings.data.truth, int(scored.sum()),
                        model.p, len(left), ", ".join(some(left, 10)))
    ho = _heldout(model, val_rows, S, M, states, inputs) if len(val_rows) else None
    check_finite(train, ho, train_rows, val_rows, states, inputs, clients,
                 settings.data.path, labels)
    n_traj = train_rows.groupby(["repeat", "_client"])["_trajectory"].nunique()
    batch_size = getattr(settings.optimizer, "batch_size", None)
    if batch_size is not None:
        check_batch_size(batch_size, int(train.n.min()))
    N = n_traj.groupby(level=1).max().tolist()
    facts = {"M": M, "N": N[0] if len(set(N)) == 1 else N, "T": None, "eps": None,
             "repeats": S, "clients": some(clients, 50)}
    if settings.data.truth:                          # the parameters e_r is taken over
        facts["truth_parameters"] = int(truth_parameters(train.theta_true).sum())
    if labels != list(range(S)):                     # outputs number the repeats 0..S-1
        facts["repeat_labels"] = some(labels, 50)
    return Dataset(train, ho, clients, facts, labels)


def _labels(labels: list[int]) -> str:
    """Repeat labels for messages (the first 12)."""
    return ", ".join(map(str, labels[:12])) + (", ..." if len(labels) > 12 else "")


def _check_budget(budget, model: Model, optimizer, train_rows, val_rows, S: int, M: int,
                  columns: int, path, strategy=None) -> None:
    """Call ``budget`` with the memory the arrays of these rows need and what they are."""
    from fnsysid.data.memory import built_bytes

    seg = train_rows["repeat"].to_numpy() * M + train_rows["_client"].to_numpy()
    count = np.bincount(seg, minlength=S * M)
    blocks = [(len(c), J, L) for c, J, L in _heldout_layout(val_rows, M)[1]] \
        if len(val_rows) else []
    # the files' columns: states, inputs, repeat, client, trajectory, t, split
    need = built_bytes(model, len(train_rows) + len(val_rows), columns + 5,
                       S, M, count, optimizer.needs_samples, blocks, strategy)
    what = (f"data.path={path} ({len(train_rows) + len(val_rows)} rows, {M} clients"
            + (f" x {S} repeats" if S > 1 else "")
            + f", the longest client {int(count.max())} samples"
            + ("; optimizer=sgd keeps every client's samples, padded to the longest"
               if optimizer.needs_samples else "") + ")")
    budget(need, what)


def _hold_out(df: pd.DataFrame, frac: float, path: str) -> pd.DataFrame:
    """Mark the last ``round(frac * n)`` trajectories of each client (at least one when it
    has two or more, always at least one left for training) as ``val``, unless the files
    have a ``split`` column (``df.attrs["split_column"]``): then the files decide, also when
    they mark every row ``train`` (an export of data without held-out trajectories)."""
    if not 0.0 <= frac < 1.0:
        raise ConfigError(f"data.holdout={frac} is not allowed: a fraction in [0, 1)")
    if frac == 0.0 or df.attrs.get("split_column") or (df["split"] == "val").any():
        return df
    key = ["repeat", "_client"]
    traj = df.drop_duplicates(key + ["_trajectory"])[key + ["_trajectory"]]
    n = traj.groupby(key)["_trajectory"].transform("size").to_numpy()
    rank = traj.groupby(key).cumcount(ascending=False).to_numpy()   # 0 = last trajectory
    n_val = np.minimum(np.maximum(np.rint(frac * n), 1), n - 1)
    single = traj[n < 2]
    if len(single):
        names = df.drop_duplicates("_client").set_index("_client")["client"]
        few = sorted({names[c] for c in single["_client"]})
        log.warning("data.holdout: %d client(s) with one trajectory keep it for training and "
                    "are left out of the validation: %s", len(few), ", ".join(few[:10]))
    traj = traj.assign(split=np.where(rank < n_val, "val", "train"))
    df = df.drop(columns="split").merge(traj, on=key + ["_trajectory"], how="left")
    return df


def _positions(rows: pd.DataFrame, S: int, M: int):
    """Segment (repeat, client) of each transition and its position within the segment."""
    r = rows["repeat"].to_numpy()
    c = rows["_client"].to_numpy()
    tr = rows["_trajectory"].to_numpy()
    same_next = (r[1:] == r[:-1]) & (c[1:] == c[:-1]) & (tr[1:] == tr[:-1])
    seg = r[:-1] * M + c[:-1]
    return same_next, seg


def _client_data(model: Model, rows: pd.DataFrame, S: int, M: int, states, inputs,
                 keep_samples: bool, path, clients: list[str], repeats=None) -> ClientData:
    """Training statistics of the rows (sorted by repeat, client, trajectory, sample);
    ``clients`` the labels of the client indices, ``repeats`` those of the repeats."""
    X = rows[states].to_numpy(float)
    U = rows[inputs].to_numpy(float) if inputs else np.zeros((len(rows), 0))
    Phi, Y = model.regression(X, U[:-1])                 # consecutive rows: transitions
    valid, seg = _positions(rows, S, M)
    seg = seg[valid]
    Phi, Y = Phi[valid], Y[valid]
    count = np.bincount(seg, minlength=S * M)
    if (count == 0).any():
        k = int(np.flatnonzero(count == 0)[0])
        rep = (repeats or range(S))[k // M]
        raise DataError(f"data.path={path}: client '{clients[k % M]}' (repeat {rep}) has no "
                        "training trajectory (all are held out)")
    stats = ragged_stats(model, Phi, Y, count)           # segments in order: no padding
    H, b, yy, n, phi2max, phi_mean, y_mean, yy_t, factor, phimax = (
        a.reshape((S, M) + a.shape[1:]) for a in stats)
    theta_true = np.full((S, M, model.p), np.nan)
    if not keep_samples:
        return ClientData(theta_true, H, b, yy, n, None, None, None, phi2max, phi_mean, y_mean,
                          yy_t, factor, phimax)
    # mini-batch SGD draws from every client's samples at once: padded to the longest
    starts = np.concatenate([[0], np.cumsum(count)[:-1]])
    pos = np.arange(len(seg)) - starts[seg]
    n_max = int(count.max())
    n_phi, n_y = Phi.shape[-1], Y.shape[-1]
    P = np.zeros((S * M, n_max, n_phi))
    Yp = np.zeros((S * M, n_max, n_y))
    W = np.zeros((S * M, n_max))
    P[seg, pos], Yp[seg, pos], W[seg, pos] = Phi, Y, 1.0
    return ClientData(theta_true, H, b, yy, n, P.reshape(S, M, n_max, n_phi),
                      Yp.reshape(S, M, n_max, n_y), W.reshape(S, M, n_max), phi2max,
                      phi_mean, y_mean, yy_t, factor, phimax)


def _heldout_layout(rows: pd.DataFrame, M: int):
    """Where each held-out row goes: its repeat, client, trajectory within the client and
    position within the trajectory; and the blocks of clients (one length class of their
    number of trajectories and of their longest, the most over the repeats) with each
    block's clients, most trajectories ``J`` and longest trajectory ``L``."""
    rep = rows["repeat"].to_numpy()
    cl = rows["_client"].to_numpy()
    key = rep * M + cl
    tr = rows["_trajectory"].to_numpy()
    new_traj = np.append(True, (key[1:] != key[:-1]) | (tr[1:] != tr[:-1]))
    traj_id = np.cumsum(new_traj) - 1                                 # global trajectory index
    t_start = np.flatnonzero(new_traj)
    t_pos = np.arange(len(rows)) - t_start[traj_id]
    traj_key = key[t_start]
    new_seg = np.append(True, traj_key[1:] != traj_key[:-1])
    seg_start = np.flatnonzero(new_seg)
    j = np.arange(len(traj_key)) - seg_start[np.cumsum(new_seg) - 1]  # trajectory within client
    J_c, L_c = np.zeros(M, int), np.zeros(M, int)
    np.maximum.at(J_c, cl[t_start], j + 1)
    np.maximum.at(L_c, cl, t_pos + 1)
    has = np.flatnonzero(J_c > 0)
    cls = length_classes(J_c[has]) * 64 + length_classes(L_c[has])
    blocks = [(c, int(J_c[c].max()), int(L_c[c].max()))
              for c in (has[cls == k] for k in np.unique(cls))]
    return (rep, cl, j[traj_id], t_pos), blocks


def heldout_of(model: Model, rows: pd.DataFrame, S: int, M: int, states, inputs) -> HeldOut:
    """Held-out data (the scores' layout) of checked trajectory rows (as
    :func:`~fnsysid.data.files.check_tables` returns them) of ``S`` repeats and ``M``
    clients: the held-out data of a run are built from their rows this way."""
    return _heldout(model, rows, S, M, states, inputs)


def _heldout(model: Model, rows: pd.DataFrame, S: int, M: int, states, inputs) -> HeldOut:
    """Held-out trajectories in blocks of clients of similar size (:func:`_heldout_layout`),
    each block padded to its own largest: a few long clients do not pad the many short ones
    (see :class:`~fnsysid.data.heldout.HeldOut`)."""
    (rep, cl, jj, t_pos), blocks = _heldout_layout(rows, M)
    X = rows[states].to_numpy(float)
    U = rows[inputs].to_numpy(float) if inputs else np.zeros((len(rows), 0))
    ho = empty_heldout(model, S, M)
    rank = np.zeros(M, int)
    for clients, J, L in blocks:
        rank[clients] = np.arange(len(clients))
        sel = np.isin(cl, clients)
        at = (rep[sel], rank[cl[sel]], jj[sel], t_pos[sel])
        m = len(clients)
        x = np.zeros((S, m, J, L, len(states)))
        u = np.zeros((S, m, J, L, U.shape[1]))
        mask = np.zeros((S, m, J, L), bool)
        x[at], u[at], mask[at] = X[sel], U[sel], True
        add_block(model, ho, clients, x, u[..., :-1, :], mask)
    return ho
