"""``fnsysid.FederatedSysID``: an estimator for notebooks over the command line's engine.

>>> m = fnsysid.FederatedSysID(feature_map="polynomial", R=60)        # doctest: +SKIP
>>> m.fit(df, states=["x1", "x2"], inputs=["u"])                      # doctest: +SKIP
>>> m.equations(), m.nrmse(df_val)                                    # doctest: +SKIP

One code path: :meth:`FederatedSysID.fit` composes and checks the settings as ``fnsysid.run``
does (:func:`fnsysid.app.api.run_job`), and trajectories held in memory take the checks of
trajectory files (:func:`fnsysid.data.files.check_tables`). ``predict``, ``simulate`` and
``score`` evaluate the model with the engine's functions (``Model.predict``,
:func:`fnsysid.results.metrics.free_run`, :class:`~fnsysid.results.metrics.HeldOutScores`),
so a score equals the run's ``nrmse_*_mean`` on the same held-out data.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from fnsysid.app.api import run_job
from fnsysid.app.experiment import Result
from fnsysid.config.checks import ConfigError, DataError, override_key
from fnsysid.config.errors import some
from fnsysid.config.groups import options
from fnsysid.config.overrides import as_overrides
from fnsysid.config.schema import GROUPS
from fnsysid.data.files import (
    PUBLIC_COLUMNS,
    ColumnMap,
    check_id_types,
    check_tables,
    read_trajectories,
)
from fnsysid.data.source import column_names, heldout_of
from fnsysid.results.equations import equations
from fnsysid.results.metrics import HeldOutScores, free_run, over_clients

#: ``data.path`` of trajectories held in memory (it names them in messages)
IN_MEMORY = "<DataFrame>"
#: strategies whose result holds a model of each client (``client=``)
PER_CLIENT = ("local",)
#: the two kinds of score
KINDS = ("one_step", "free_run")
#: estimates-table columns passed through by :meth:`FederatedSysID.coefficients`
UNCERTAINTY = ("se", "ci_lo", "ci_hi")


@dataclass(frozen=True)
class _Table:
    """One client's rows held in memory, named in messages as a file is (``stem``: the
    client, ``parent``: the data they belong to)."""

    stem: str
    parent: str

    def __str__(self) -> str:
        return f"{self.parent}, client '{self.stem}'"


def _tables(data, what: str, rows: bool = False) -> tuple[list[tuple[_Table, pd.DataFrame]],
                                                         pd.DataFrame | None, list[np.ndarray]]:
    """Per-client tables of ``data`` (a DataFrame with a ``client`` column or a mapping client
    -> DataFrame), with ``rows`` the rows as one DataFrame (``client`` filled in; else None)
    and each table's row positions in it."""
    if isinstance(data, pd.DataFrame):
        cols = [str(c) for c in data.columns]
        twice = [c for c in cols if cols.count(c) > 1]
        if twice:
            raise DataError(f"{what}: column '{twice[0]}' appears twice; allowed: one column "
                            "per name")
        if "client" not in cols:
            raise DataError(f"{what}: column 'client' is missing; columns: {', '.join(cols)}; "
                            "allowed: a DataFrame with a client column, or a mapping client -> "
                            "DataFrame")
        if len(data) == 0:
            raise DataError(f"{what}: no rows; allowed: a DataFrame with one row per sample")
        frame = data.copy(deep=False)
        frame.columns = cols
        client = frame["client"]
        empty = client.isna().to_numpy() | (client.astype(str).str.strip() == "").to_numpy()
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            raise DataError(f"{what}: row {i + 1} (index {_label(data.index[i])}), column "
                            "'client' is empty; allowed: a client id in every row")
        check_id_types(client, what)                # 0 and '0' would be one client
        labels = client.astype(str).str.strip()
        groups = labels.groupby(labels.to_numpy(), sort=False).indices    # label -> positions
        where = list(groups.values())
        tables = [(_Table(str(k), what), frame.iloc[w]) for k, w in groups.items()]
        return tables, frame, where
    if isinstance(data, Mapping):
        if not data:
            raise DataError(f"{what}: an empty mapping; allowed: client -> DataFrame, one or "
                            "more")
        tables, seen, frames, where, start = [], {}, [], [], 0
        for key, df in data.items():
            name = str(key).strip()
            if not isinstance(df, pd.DataFrame):
                raise DataError(f"{what}['{name}']: a {type(df).__name__}, not a DataFrame")
            if name in seen:
                raise DataError(f"{what}: keys {seen[name]!r} and {key!r} both give client "
                                f"'{name}'; keep one table per client")
            seen[name] = key
            tables.append((_Table(name, what), df.copy(deep=False)))
            frames.append(df.set_axis([str(c) for c in df.columns], axis=1).assign(client=name)
                          if rows else None)
            where.append(np.arange(start, start + len(df)))
            start += len(df)
        return tables, pd.concat(frames, ignore_index=True) if rows else None, where
    raise ConfigError(f"{what}: a value of type {type(data).__name__} is not trajectory data; "
                      "allowed: a DataFrame (columns client, trajectory, t, the states and "
                      "inputs), a mapping client -> DataFrame, or a path to trajectory files")


def _estimates(table: pd.DataFrame, names: list[str], column: str, what: str
               ) -> tuple[np.ndarray, list[str]]:
    """The parameters (S, C, p) of a run's estimates table (rows repeat, client, parameter
    in the run's order) and its client labels (``server``: one model)."""
    if set(table["parameter"].astype(str)) != set(names):
        raise ConfigError(f"{what}: its parameters are not those of the run's model "
                          f"({', '.join(some(names, 8))})")
    clients = list(dict.fromkeys(table["client"].astype(str)))
    S = int(table["repeat"].max()) + 1
    est = np.full((S, len(clients), len(names)), np.nan)
    rep = table["repeat"].to_numpy(int)
    cli = pd.Index(clients).get_indexer(table["client"].astype(str))
    par = pd.Index(names).get_indexer(table["parameter"].astype(str))
    est[rep, cli, par] = table[column].to_numpy(float)
    if np.isnan(est).any():
        raise ConfigError(f"{what}: a (repeat, client, parameter) has no value; the run's "
                          "files are incomplete")
    return est, clients


@contextmanager
def _row_index(tables):
    """A :class:`DataError` that names a row of one of ``tables`` (``<table>: row N``, N
    counted from 1 within the client's rows) also gives the row's index label in its
    DataFrame (``row N (index 7)``): what ``df.loc`` takes."""
    try:
        yield
    except DataError as exc:
        msg = str(exc)
        for label, df in tables or ():
            head = f"{label}: row "
            n = re.match(r"\d+", msg[len(head):]) if msg.startswith(head) else None
            if n and 1 <= int(n.group()) <= len(df):
                rest = msg[len(head) + n.end():]
                raise DataError(f"{head}{n.group()} (index {_label(df.index[int(n.group()) - 1])})"
                                f"{rest}") from None
        raise


def _label(v) -> str:
    """An index label for messages: numbers as they print, other labels quoted."""
    return str(v) if isinstance(v, (int, np.integer)) else repr(v)


def _is_path(data) -> bool:
    return isinstance(data, (str, os.PathLike))


#: the constructor's settings: the config groups (``group=option``) and the top-level knobs,
#: each None for the config's default
GROUP_PARAMS = ("data", "system", "feature_map", "optimizer", "strategy", "runtime",
                "personalize", "sparsity", "privacy", "experiment")
KNOB_PARAMS = ("M", "N", "T", "eps", "K", "lr", "R", "repeats", "seed", "progress")
#: the other constructor parameters
OTHER_PARAMS = ("config", "output_dir", "config_dir")


class FederatedSysID:
    """Federated identification of a fleet, fitted from DataFrames, files or a simulation.

    A scikit-learn estimator (``get_params``, ``set_params``, ``sklearn.base.clone``,
    ``GridSearchCV``) without depending on scikit-learn: the protocol is implemented here.

    Parameters
    ----------
    data, system, feature_map, optimizer, strategy : str or None, default=None
        The option of each config group, as on the command line (``system="generic"``,
        ``feature_map="combined"``, ``strategy="fedavg"``); None: the config's default.
    runtime, personalize, sparsity, privacy, experiment : str or None, default=None
        Likewise.
    M, N, T, eps, K, lr, R, repeats, seed, progress : int, float, list or None, default=None
        The top-level knobs (``R=60``); None: the config's (or the system's) default.
    config : dict or list of str, default=None
        Further settings: a dict with dotted keys (``{"feature_map.degree": 3}``) or a list
        of override strings (``["feature_map.degree=3"]``).
    output_dir : str or path, default=None
        A folder to write the run's files into (as ``fnsysid.run``); None: nothing is
        written.
    config_dir : str or path, default=None
        A folder of your own config groups (like ``--config-dir``).

    Attributes
    ----------
    result_ : Result
        The run's :class:`~fnsysid.app.experiment.Result` (after :meth:`fit` or :meth:`load`).
    summary_ : dict
        What ``summary.json`` holds (``status``, final errors, settings).
    history_ : DataFrame
        Per-round errors (``errors.csv``).
    clients_ : list of str
        The client labels (``states_``, ``inputs_``: the state and input columns).

    Notes
    -----
    Parameters are stored as given and checked when :meth:`fit` composes the config. Bad
    settings raise :class:`~fnsysid.config.errors.ConfigError` and bad data
    :class:`~fnsysid.config.errors.DataError`, with the command line's one-line message.
    """

    def __init__(self, *, data=None, system=None, feature_map=None, optimizer=None,
                 strategy=None, runtime=None, personalize=None, sparsity=None, privacy=None,
                 experiment=None,
                 M=None, N=None, T=None, eps=None, K=None, lr=None, R=None, repeats=None,
                 seed=None, progress=None, config=None, output_dir=None, config_dir=None):
        self.data = data
        self.system = system
        self.feature_map = feature_map
        self.optimizer = optimizer
        self.strategy = strategy
        self.runtime = runtime
        self.personalize = personalize
        self.sparsity = sparsity
        self.privacy = privacy
        self.experiment = experiment
        self.M = M
        self.N = N
        self.T = T
        self.eps = eps
        self.K = K
        self.lr = lr
        self.R = R
        self.repeats = repeats
        self.seed = seed
        self.progress = progress
        self.config = config
        self.output_dir = output_dir
        self.config_dir = config_dir

    # --- the scikit-learn protocol ----------------------------------------------------------

    @classmethod
    def _get_param_names(cls) -> list[str]:
        return [*GROUP_PARAMS, *KNOB_PARAMS, *OTHER_PARAMS]

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's parameters as stored.

        Parameters
        ----------
        deep : bool, default=True
            scikit-learn's flag for nested estimators; there are none to descend into.

        Returns
        -------
        dict
            Each constructor parameter and its value (None: the config's default)."""
        return {k: getattr(self, k) for k in self._get_param_names()}

    def set_params(self, **params) -> FederatedSysID:
        """Set constructor parameters (``set_params(R=60)``).

        Parameters
        ----------
        **params : str, int, float, list, dict or None
            Constructor parameters by name, as :class:`FederatedSysID` takes them.

        Returns
        -------
        FederatedSysID
            ``self``.

        Raises
        ------
        ValueError
            A name that is not a parameter (the message names the allowed ones)."""
        names = self._get_param_names()
        for key, value in params.items():
            if key not in names:
                raise ValueError(f"{key} is not a parameter of FederatedSysID; allowed: "
                                 f"{', '.join(names)}")
            setattr(self, key, value)
        return self

    def __sklearn_tags__(self):
        """scikit-learn's tags (read only by scikit-learn, so imported from it here): no
        target ``y`` (the targets are the data's next states), not a classifier, regressor or
        transformer."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False))

    @property
    def settings(self) -> dict:
        """The settings given to the constructor (groups and knobs not None)."""
        return {k: getattr(self, k) for k in (*GROUP_PARAMS, *KNOB_PARAMS)
                if getattr(self, k) is not None}

    # --- fitting ----------------------------------------------------------------------------

    def _overrides(self, data, states, inputs, columns=None) -> list[str]:
        given = as_overrides(self.settings)
        try:
            extra = as_overrides(self.config) if self.config is not None else []
        except ConfigError as exc:                  # the argument is config=, not overrides
            msg = str(exc)
            raise ConfigError("config" + msg.removeprefix("overrides") if
                              msg.startswith("overrides") else msg) from None
        both = sorted({override_key(o) for o in given} & {override_key(o) for o in extra})
        if both:         # the later would win, unseen by get_params (and so by a grid search)
            raise ConfigError(f"{both[0]}: given to the constructor and in config; allowed: "
                              "each setting once (a constructor parameter, which get_params "
                              "and GridSearchCV see, or config)")
        overrides = given + extra
        keys = {override_key(o) for o in overrides}
        if data is not None:
            for key in ("data", "data.path"):
                if key in keys:
                    raise ConfigError(f"{key}: fit() was given data; give the data to fit() "
                                      f"or the setting {key}, not both")
            path = str(data) if _is_path(data) else IN_MEMORY
            overrides = ["data=files", *overrides, *as_overrides({"data.path": path})]
            if "system" not in keys:
                if states is None and "data.states" not in keys:
                    raise ConfigError("states: fit(data) identifies system=generic from named "
                                      "columns; allowed: fit(data, states=[...], inputs=[...]) "
                                      "(or a system= whose columns the data carry)")
                overrides.insert(0, "system=generic")
        for key, value in (("data.states", states), ("data.inputs", inputs),
                           ("data.ignore", (columns or {}).get("ignore"))):
            if value is None:
                continue
            try:          # once: an iterator gives its names one time
                names = ([value] if isinstance(value, str) else
                         None if hasattr(value, "columns") else list(value))   # a table
            except TypeError:
                names = None
            if names is None or not all(isinstance(v, str) for v in names):
                name = key.removeprefix("data.")
                raise ConfigError(
                    f"{name}: got a {type(value).__name__}, not column names; allowed: a str "
                    f"or a list of str (fit(df, states=[...], inputs=[...]): the data are one "
                    "table whose columns the states and inputs name, not scikit-learn's "
                    "fit(X, y))")
            if key in keys:
                raise ConfigError(f"{key}: given to fit() and in the settings; give it once")
            overrides += as_overrides({key: names})
        for name in ("trajectory", "time", "missing"):
            value = (columns or {}).get(name)
            if value is None:
                continue
            if f"data.{name}" in keys:
                raise ConfigError(f"data.{name}: given to fit() and in the settings; give it "
                                  "once")
            overrides += as_overrides({f"data.{name}": value})
        return overrides

    def fit(self, data=None, states=None, inputs=None, *, trajectory=None, time=None,
            ignore=None, missing=None) -> FederatedSysID:
        """Identify the fleet's model.

        Held-out rows (``split=val``, else ``data.holdout`` of each client's trajectories) give
        the NRMSE of :attr:`history_` and :attr:`summary_`. A fit that does not end ``ok``
        warns with its status.

        Parameters
        ----------
        data : DataFrame, mapping of str to DataFrame, str, path or None, default=None
            A DataFrame in the layout of trajectory files (columns ``client``, optional
            ``trajectory``, ``t``, ``split``, ``repeat``, the states and the inputs), a
            mapping client -> DataFrame (without the ``client`` column), or a path to
            trajectory files (as ``data=files data.path=...``); None: the settings' data (a
            simulation by default). With data and no ``system`` setting, ``system=generic``.
        states : list of str or None, default=None
            The state columns (``data.states``).
        inputs : list of str or None, default=None
            The input columns (``data.inputs``).
        trajectory : str or None, default=None
            The column of the trajectory ids (``data.trajectory``; None: ``trajectory``).
        time : str or None, default=None
            The column of the times (``data.time``; None: ``t``).
        ignore : str, list of str or None, default=None
            Columns not used (``data.ignore``).
        missing : {"refuse", "split"} or None, default=None
            A row with an empty time, state or input (``data.missing``; None: ``refuse``):
            refused, or left out with its trajectory split there. ``predict``, ``simulate``
            and ``score`` refuse such rows (one result per row).

        Returns
        -------
        FederatedSysID
            ``self``, fitted (:attr:`result_`, :attr:`summary_`, :attr:`history_`).

        Raises
        ------
        ConfigError
            A setting that is not allowed, or data that cannot be used (:class:`DataError`),
            with the command line's one-line message; nothing is fitted then.
        """
        tables = None
        if data is not None and not _is_path(data):
            tables = _tables(data, "data")[0]
        with _row_index(tables):
            res = run_job(self._overrides(data, states, inputs, {
                "trajectory": trajectory, "time": time, "ignore": ignore,
                "missing": missing}), self.output_dir,
                self.config_dir, tables)
        self.result_ = res
        self.summary_ = res.summary
        self.history_ = res.errors
        self.clients_ = list(res.dataset.clients)
        self.states_, self.inputs_ = column_names(res.settings, res.model)
        status = res.summary["status"]
        if status != "ok":
            warnings.warn(f"fnsysid: the fit ended with status '{status}' (see summary_ and "
                          "history_): do not trust its model", stacklevel=2)
        return self

    @classmethod
    def load(cls, run_dir) -> FederatedSysID:
        """A fitted estimator of a finished run's folder.

        The model is built from the folder's ``config.yaml``, the final estimates read from
        ``estimates.csv`` (and the clients' own models from ``client_estimates.csv``) bit for
        bit, ``summary_`` and ``history_`` from ``summary.json`` and ``errors.csv``. It
        predicts, simulates, scores and prints equations as the estimator that ran; it holds
        no training data (``result_.dataset`` has only the client labels) and the repeats are
        labelled 0..S-1.

        Parameters
        ----------
        run_dir : str or path
            The folder of a finished run of the command line, :func:`fnsysid.run` or
            :meth:`fit` with ``output_dir``.

        Returns
        -------
        FederatedSysID
            A fitted estimator.

        Raises
        ------
        ConfigError
            A folder that is not a finished run (the message names it)."""
        from fnsysid.app.build import build
        from fnsysid.data.source import Dataset
        from fnsysid.results.equations import read_run

        run = read_run(run_dir, "run_dir")
        settings = run["settings"]
        model = build(settings)[0]
        est_table = run["tables"]["estimates"]
        names = list(model.param_names)
        est, clients = _estimates(est_table, names, "estimate", f"{run_dir}/estimates.csv")
        own = None
        if "client_estimates" in run["tables"]:
            own, clients = _estimates(run["tables"]["client_estimates"], names, "estimate",
                                      f"{run_dir}/client_estimates.csv")
        elif est.shape[1] == 1:
            clients = run["clients"]
        dataset = Dataset(train=None, heldout=None, clients=clients)
        res = Result(tables=run["tables"], summary=run["summary"], model=model, estimate=est,
                     dataset=dataset, settings=settings, client_models=own)
        m = cls()
        m.result_, m.summary_ = res, res.summary
        m.history_ = run["tables"]["errors"]
        m.clients_ = list(clients)
        m.states_, m.inputs_ = column_names(settings, model)
        return m

    # --- the fitted model -------------------------------------------------------------------

    def _result(self, usable: bool = True) -> Result:
        res = getattr(self, "result_", None)
        if res is None:
            raise ValueError("this FederatedSysID is not fitted yet: call fit(data) first")
        if usable and res.diverged is not None:
            raise ValueError(f"the fit diverged at round {res.diverged} (summary_['status'] is "
                             "'diverged'): its model is not usable; fit again with a smaller lr")
        return res

    def _own_models(self) -> np.ndarray | None:
        """The clients' own models (S, M, p): personalized ones where the result holds them
        (``Result.client_models``), else a per-client strategy's estimates; None."""
        res = self._result()
        own = getattr(res, "client_models", None)
        if own is not None:
            return np.asarray(own, float)
        return res.estimate if res.estimate.shape[1] > 1 else None

    def _client_index(self, client) -> int:
        res = self._result()
        name = str(client)
        if self._own_models() is None:
            ways = [f"strategy={s}" for s in PER_CLIENT]
            if "personalize" in GROUPS:
                ways += [f"personalize={o}" for o in options("personalize") if o != "none"]
            raise ConfigError(f"client={name}: strategy={res.summary.get('strategy')} gives one "
                              "server model, no model of each client; allowed: client=None, or "
                              f"a fit that gives one per client ({', '.join(ways)})")
        if name not in self.clients_:
            raise ConfigError(f"client={name} is not a client of the fit; allowed: "
                              f"{', '.join(some(self.clients_, 12))}")
        return self.clients_.index(name)

    def _repeat_labels(self) -> list[int]:
        """The fit's repeat labels (the data's ``repeat`` values; 0..S-1 without them)."""
        res = self._result()
        return [int(r) for r in (res.dataset.repeats or range(res.estimate.shape[0]))]

    def _repeat(self, repeat) -> int:
        """The position of the fit's repeat labelled ``repeat`` (None: the only one; with
        several repeats a :class:`ConfigError` asking for one)."""
        labels = self._repeat_labels()
        shown = ", ".join(map(str, some(labels, 12)))
        if repeat is None:
            if len(labels) > 1:
                raise ConfigError(f"repeat=None: the fit has {len(labels)} repeats; allowed: "
                                  f"repeat= one of {shown}")
            return 0
        if isinstance(repeat, (bool, np.bool_)) or not isinstance(repeat, (int, np.integer)) \
                or int(repeat) not in labels:
            raise ConfigError(f"repeat={repeat} is not a repeat of the fit; allowed: {shown}")
        return labels.index(int(repeat))

    def _theta(self, client=None, repeat=None) -> np.ndarray:
        """The parameters (p,) of the server model or of ``client``."""
        est = self._result().estimate[self._repeat(repeat)]
        if client is not None:
            return self._own_models()[self._repeat(repeat), self._client_index(client)]
        if est.shape[0] > 1:
            strategy = self._result().summary.get("strategy")
            raise ConfigError(f"client=None: strategy={strategy} gives a model of each client "
                              f"and no server model; allowed: client= one of "
                              f"{', '.join(some(self.clients_, 12))}")
        return est[0]

    def coefficients(self, client=None) -> pd.DataFrame:
        """The identified parameters.

        Parameters
        ----------
        client : str or None, default=None
            A client's own model (personalized, or of a per-client strategy); None: the
            server's model (each client's, for a per-client strategy).

        Returns
        -------
        DataFrame
            Columns ``parameter``, ``value`` (and ``se``, ``ci_lo``, ``ci_hi`` where the run's
            estimates give them); with several repeats a ``repeat`` column (the data's repeat
            labels), with a model per client a ``client`` column."""
        res = self._result()
        table = res.estimates
        if client is None:
            est = res.estimate
            labels = ["server"] if est.shape[1] == 1 else list(self.clients_)
        else:
            m = self._client_index(client)
            est, labels = self._own_models()[:, m:m + 1], [self.clients_[m]]
            if getattr(res, "client_models", None) is not None:       # personalized models
                table = res.tables.get("client_estimates")
        S, C, _ = est.shape
        reps = self._repeat_labels()
        rows = [(reps[s], labels[c], name, float(est[s, c, k])) for s in range(S) for c in range(C)
                for k, name in enumerate(res.model.param_names)]
        out = pd.DataFrame(rows, columns=["repeat", "client", "parameter", "value"])
        extra = [c for c in UNCERTAINTY if table is not None and c in table.columns]
        if extra:
            t = table[["repeat", "client", "parameter", *extra]].astype({"client": str})
            t = t.assign(repeat=[reps[int(r)] for r in t["repeat"]])    # 0..S-1: labels
            out = out.merge(t, on=["repeat", "client", "parameter"], how="left")
            extra = [c for c in extra if out[c].notna().any()]   # none: no intervals here
        keep = (["repeat"] if S > 1 else []) + (["client"] if C > 1 or client is not None
                                                else [])
        return out[keep + ["parameter", "value", *extra]]

    def equations(self, client=None, precision: int = 4, repeat=None) -> list[str]:
        """The identified model as text, as in a run's ``equations.txt``.

        Terms whose coefficient is exactly 0 are left out; a feature whose name starts with
        a sign or holds a ``+``/``-`` is written in parentheses
        (:func:`fnsysid.results.equations.equations`).

        Parameters
        ----------
        client : str or None, default=None
            A client's own model (as in :meth:`coefficients`); None: the server's.
        precision : int, default=4
            Significant digits of each coefficient (a small one reads ``1.2e-05``, not 0).
        repeat : int or None, default=None
            With several repeats, whose model (the data's repeat label); None with one.

        Returns
        -------
        list of str
            One equation per regression target (for ``system=generic`` and the feature-map
            systems one per state): ``"x1+ = 1 x1 + 0.05 x2"``."""
        if isinstance(precision, (bool, np.bool_)) or not isinstance(
                precision, (int, np.integer)) or precision < 1:
            raise ConfigError(f"precision={precision!r} is not allowed; allowed: an integer "
                              ">= 1 (significant digits)")
        return equations(self._result().model, self._theta(client, repeat), int(precision))

    # --- prediction -------------------------------------------------------------------------

    def _columns(self) -> ColumnMap:
        """The fit's column mapping (``data.trajectory``, ``data.time``, ``data.ignore``) for
        data to predict or score: one result per row, so a row with an empty value is refused
        whatever ``data.missing``."""
        return replace(ColumnMap.of(self._result().settings.data), missing="refuse")

    def _columns_of(self, frame: pd.DataFrame) -> ColumnMap:
        """The fit's column mapping for the rows ``frame`` (:meth:`ColumnMap.for_columns`:
        the layout's own ``trajectory``, ``t`` where the fit's are absent)."""
        return self._columns().for_columns(frame.columns)

    def _rows(self, data, what: str):
        """Checked rows of ``data`` (the fit's states and inputs), the data's rows as given
        (a DataFrame) and where each checked row is among them."""
        if _is_path(data):
            rows = read_trajectories(data, self.states_, self.inputs_, setting=what,
                                     columns=self._columns())
            frame = rows[PUBLIC_COLUMNS + self.states_ + self.inputs_].copy()
            frame["repeat"] = frame["repeat"].map(dict(enumerate(rows.attrs["repeats"])))
            cm = self._columns()
            frame = frame.rename(columns={"trajectory": cm.trajectory, "t": cm.time})
            return rows, frame.reset_index(drop=True), np.arange(len(rows))
        tables, frame, where = _tables(data, what, rows=True)
        with _row_index(tables):
            rows = check_tables(tables, self.states_, self.inputs_,
                                columns=self._columns_of(frame))
        codes = rows["_file"].cat.codes.to_numpy()
        pos = np.empty(len(rows), int)
        for k, w in enumerate(where):
            sel = codes == k
            pos[sel] = w[rows["_row"].to_numpy()[sel] - 1]
        return rows, frame, pos

    def _row_thetas(self, rows, client, what: str, repeat=None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The parameters of each row's model (n, p) and the fit's repeat of each of the
        data's repeats (the data's repeat labels are the fit's; ``repeat=``: the fit's repeat
        of data without a ``repeat`` column). A fit of several repeats needs one or the
        other."""
        res = self._result()
        fit_labels = self._repeat_labels()
        labelled = rows.attrs.get("repeat_column", True)
        if repeat is not None and labelled:
            raise ConfigError(f"repeat={repeat}: {what} has a repeat column; allowed: "
                              "repeat=None (the column says whose model), or data without it")
        if repeat is not None or (not labelled and len(fit_labels) > 1):
            if repeat is None:
                raise ConfigError(f"repeat=None: the fit has {len(fit_labels)} repeats and "
                                  f"{what} has no repeat column; allowed: repeat= one of "
                                  f"{', '.join(map(str, some(fit_labels, 12)))}, or a repeat "
                                  "column")
            reps = np.full(len(rows.attrs["repeats"]), self._repeat(repeat))
        else:
            reps = []
            for label in rows.attrs["repeats"]:
                if label not in fit_labels:
                    raise DataError(f"{what}: repeat {label} is not a repeat of the fit; "
                                    f"allowed: {', '.join(map(str, some(fit_labels, 12)))}")
                reps.append(fit_labels.index(label))
            reps = np.asarray(reps)
        rep = reps[rows["repeat"].to_numpy()]
        est = res.estimate
        if client is not None:
            return self._own_models()[rep, self._client_index(client)], reps
        if est.shape[1] == 1:
            return est[rep, 0], reps
        labels = rows["client"].to_numpy(dtype=str)
        idx = pd.Index(self.clients_).get_indexer(labels)
        if (idx < 0).any():
            name = labels[idx < 0][0]
            raise DataError(f"{what}: client '{name}' has no model of its own (strategy="
                            f"{res.summary.get('strategy')} fitted clients "
                            f"{', '.join(some(self.clients_, 12))}); give client= one of them")
        return est[rep, idx], reps

    def _out(self, frame, pos, values, columns) -> pd.DataFrame:
        """The data's own columns of the layout (by the data's names: ``data.trajectory``,
        ``data.time``) and ``values`` (checked rows' order) as columns, one row per row of the
        data, in its order."""
        cm = self._columns_of(frame)
        names = {"trajectory": cm.trajectory, "t": cm.time}
        layout = [names.get(c, c) for c in PUBLIC_COLUMNS]
        out = frame[[c for c in layout if c in frame.columns and c not in cm.ignore]].copy()
        full = np.full((len(frame), values.shape[1]), np.nan)
        full[pos] = values
        for k, c in enumerate(columns):
            out[c] = full[:, k]
        return out

    def _arrays(self, x, u, client, what: str) -> pd.DataFrame:
        """One client's arrays as the rows of a DataFrame: ``x`` (T, n_x) one trajectory or
        (n, T, n_x) several of one length, ``u`` the inputs alike (None without inputs)."""
        x = np.asarray(x, float)
        n_x, n_u = len(self.states_), len(self.inputs_)
        if x.ndim not in (2, 3) or x.shape[-1] != n_x:
            raise DataError(f"{what}: an array of shape {x.shape}; allowed: (T, {n_x}) or "
                            f"(trajectories, T, {n_x}): the states {', '.join(self.states_)}")
        x3 = x if x.ndim == 3 else x[None]
        if n_u:
            if u is None:
                raise DataError(f"u: missing; allowed: the inputs {', '.join(self.inputs_)} "
                                f"as an array of shape {x.shape[:-1] + (n_u,)}")
            u3 = np.asarray(u, float)
            u3 = u3 if u3.ndim == 3 else u3[None]
            if u3.shape != x3.shape[:-1] + (n_u,):
                raise DataError(f"u: an array of shape {np.shape(u)}; allowed: "
                                f"{x.shape[:-1] + (n_u,)} (the inputs beside each state)")
        elif u is not None and np.size(u):
            raise DataError("u: the fit has no inputs; allowed: u=None")
        n, T = x3.shape[:2]
        frame = pd.DataFrame(x3.reshape(n * T, n_x), columns=self.states_)
        for k, name in enumerate(self.inputs_):
            frame[name] = u3[..., k].reshape(-1)
        cm = self._columns()
        frame.insert(0, cm.time, np.tile(np.arange(T, dtype=float), n))
        frame.insert(0, cm.trajectory, np.repeat(np.arange(n), T))
        frame.insert(0, "client", str(client) if client is not None else "client")
        return frame

    def _evaluate(self, how, data, client, repeat, u):
        """``how`` (predict or simulate) of a DataFrame, files or one client's arrays (then
        an array of the shape of ``data``)."""
        if isinstance(data, (np.ndarray, list, tuple)):
            self._result()
            shape = np.shape(data)
            out = how(self._arrays(data, u, client, "data"), client, repeat)
            return out[self.states_].to_numpy(float).reshape(shape)
        if u is not None:
            raise ConfigError("u: given with a DataFrame; allowed: u= with one client's arrays "
                              "only (a DataFrame carries its inputs)")
        return how(data, client, repeat)

    def predict(self, data, client=None, repeat=None, *, u=None):
        """One-step predictions: each row's states predicted from the trajectory's previous
        row (states and inputs).

        Parameters
        ----------
        data : DataFrame, str, path or array_like
            A DataFrame or files in :meth:`fit`'s layout, or one client's states as an array
            (T, n_x), or (n, T, n_x) for n trajectories of one length.
        client : str or None, default=None
            Whose model, with a model per client (as in :meth:`coefficients`); None: the
            server's, or each row's client's with a per-client strategy.
        repeat : int or None, default=None
            With several repeats and data without a ``repeat`` column, whose model (the
            fit's repeat label).
        u : array_like or None, default=None
            With an array ``data``: the inputs beside each state, (T, n_u) or (n, T, n_u).

        Returns
        -------
        DataFrame or numpy.ndarray
            Of a DataFrame or files, one row per row of ``data`` in its order (its layout
            columns under the data's own names); of arrays, an array of the shape of
            ``data``. NaN at each trajectory's first step."""
        return self._evaluate(self._predict, data, client, repeat, u)

    def simulate(self, data, client=None, repeat=None, *, u=None):
        """Free run: each trajectory simulated from its first state with its recorded inputs.

        Parameters
        ----------
        data : DataFrame, str, path or array_like
            As in :meth:`predict`.
        client : str or None, default=None
            As in :meth:`predict`.
        repeat : int or None, default=None
            As in :meth:`predict`.
        u : array_like or None, default=None
            As in :meth:`predict`.

        Returns
        -------
        DataFrame or numpy.ndarray
            As in :meth:`predict`; each trajectory's first step is its measured state."""
        return self._evaluate(self._simulate, data, client, repeat, u)

    def _predict(self, data, client=None, repeat=None) -> pd.DataFrame:
        """One-step predictions: for each row, its states predicted from the trajectory's
        previous row (states and inputs); NaN in a trajectory's first row. One row per row of
        ``data`` (same layout as :meth:`fit`'s, in its order), with its layout columns under
        the data's own names. A fit of several repeats takes each row's model from the data's
        ``repeat`` column, or ``repeat=`` (a label) for data without one."""
        self._result()
        rows, frame, pos = self._rows(data, "data")
        theta, _ = self._row_thetas(rows, client, "data", repeat)
        X = rows[self.states_].to_numpy(float)
        U = rows[self.inputs_].to_numpy(float) if self.inputs_ else np.zeros((len(rows), 0))
        key = rows[["repeat", "_client", "_trajectory"]].to_numpy()
        same = (key[1:] == key[:-1]).all(axis=1)
        pred = np.full(X.shape, np.nan)
        with np.errstate(all="ignore"):
            step = self.result_.model.predict(X[:-1], U[:-1], theta[:-1])
        pred[1:][same] = step[same]
        return self._out(frame, pos, pred, self.states_)

    def _simulate(self, data, client=None, repeat=None) -> pd.DataFrame:
        """Free run: each trajectory simulated from its first state with its recorded inputs
        (the first row holds the measured state). One row per row of ``data``, in its order;
        ``repeat`` as in :meth:`predict`."""
        self._result()
        rows, frame, pos = self._rows(data, "data")
        theta, _ = self._row_thetas(rows, client, "data", repeat)
        key = rows[["repeat", "_client", "_trajectory"]].to_numpy()
        start = np.flatnonzero(np.append(True, (key[1:] != key[:-1]).any(axis=1)))
        lengths = np.diff(np.append(start, len(rows)))
        n, L = len(start), int(lengths.max())
        traj = np.repeat(np.arange(n), lengths)
        t = np.arange(len(rows)) - start[traj]
        n_x, n_u = len(self.states_), len(self.inputs_)
        x = np.zeros((1, n, 1, L, n_x))
        u = np.zeros((1, n, 1, L, n_u))
        x[0, traj, 0, t] = rows[self.states_].to_numpy(float)
        if n_u:
            u[0, traj, 0, t] = rows[self.inputs_].to_numpy(float)
        sim = free_run(self.result_.model, theta[start][None], x, u[..., :-1, :])
        return self._out(frame, pos, sim[0, traj, 0, t], self.states_)

    def score(self, data, y=None, kind: str = "one_step", client=None, repeat=None) -> float:
        """Minus the held-out NRMSE of ``data`` (:meth:`nrmse`): higher is better
        (scikit-learn's convention, what ``GridSearchCV`` maximizes), 0 a perfect prediction.

        Parameters
        ----------
        data : DataFrame, str or path
            As in :meth:`nrmse`.
        y : None, default=None
            Not used (the targets are the data's next states); scikit-learn's signature.
        kind : {"one_step", "free_run"}, default="one_step"
            As in :meth:`nrmse`.
        client : str or None, default=None
            As in :meth:`predict`.
        repeat : int or None, default=None
            As in :meth:`predict`.

        Returns
        -------
        float
            ``-nrmse(data, kind, client, repeat)``."""
        return -self.nrmse(data, kind=kind, client=client, repeat=repeat)

    def nrmse(self, data, kind: str = "one_step", client=None, repeat=None) -> float:
        """The held-out NRMSE of ``data`` (lower is better).

        Every row given is scored, or with a ``split`` column that marks rows ``val`` only
        those (as the run scores its held-out rows). Per client, each predicted state's RMSE
        over its standard deviation, averaged over the states; then the mean over the
        clients (and over repeats): the run's ``nrmse_1step_mean`` or ``nrmse_sim_mean`` on
        the same data.

        Parameters
        ----------
        data : DataFrame, str or path
            A DataFrame or files in :meth:`fit`'s layout.
        kind : {"one_step", "free_run"}, default="one_step"
            One-step predictions (:meth:`predict`) or free runs (:meth:`simulate`).
        client : str or None, default=None
            As in :meth:`predict`.
        repeat : int or None, default=None
            As in :meth:`predict`.

        Returns
        -------
        float
            The mean NRMSE.

        Raises
        ------
        ConfigError
            ``kind`` not allowed (the message names the allowed ones)."""
        if kind not in KINDS:
            raise ConfigError(f"kind={kind} is not allowed; allowed: {', '.join(KINDS)}")
        res = self._result()
        rows, _, _ = self._rows(data, "data")
        val = rows["split"].to_numpy() == "val"
        if rows.attrs.get("split_column") and val.any():   # the held-out rows only
            attrs = dict(rows.attrs)
            rows = rows[val].reset_index(drop=True)
            rows.attrs = attrs
        theta, reps = self._row_thetas(rows, client, "data", repeat)
        S = len(rows.attrs["repeats"])
        M = int(rows["_client"].max()) + 1
        first = rows.drop_duplicates(["repeat", "_client"])
        per = np.zeros((S, M, theta.shape[-1]))
        per[first["repeat"].to_numpy(), first["_client"].to_numpy()] = \
            theta[first.index.to_numpy()]
        if client is None and res.estimate.shape[1] == 1:
            per = res.estimate[reps]                           # one model per repeat
        ho = heldout_of(res.model, rows, S, M, self.states_, self.inputs_)
        scores = HeldOutScores(res.model, ho)
        v = scores.one_step(per) if kind == "one_step" else scores.free_run(per)
        mean = over_clients(v, scores.valid)[1]
        return float(np.mean(mean))

    def plot_fit(self, data=None, ax=None, repeat: int = 0):
        """The fit of one trajectory as a matplotlib Figure (inline in a notebook):
        :meth:`fnsysid.app.experiment.Result.plot_fit` of the fit's result.

        Parameters
        ----------
        data : DataFrame or None, default=None
            None: the fit's held-out trajectory; a DataFrame in :meth:`fit`'s layout: its
            first client's first trajectory.
        ax : matplotlib Axes, sequence of Axes or None, default=None
            One Axes per state, or one for all; None: a new figure.
        repeat : int, default=0
            The repeat whose model and data are drawn.

        Returns
        -------
        matplotlib.figure.Figure"""
        return self._result().plot_fit(data, ax=ax, repeat=repeat)

    # --- display ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        res = getattr(self, "result_", None)
        if res is None:
            given = [f"{k}={v!r}" for k, v in self.settings.items()]
            if self.config is not None:
                given.append(f"config={self.config!r}")
            return f"FederatedSysID({', '.join(given)}) (not fitted)"
        s = res.summary
        head = (f"FederatedSysID(system={s['system']}, feature_map={s['feature_map']}, "
                f"strategy={s['strategy']}, M={s['M']}, R={s['R']})")
        line = f"  status {s['status']}, {s['rounds_completed']} rounds"
        one, sim = s.get("final_nrmse_1step_mean"), s.get("final_nrmse_sim_mean")
        if one is not None:
            line += f"; held-out NRMSE (mean over clients) one-step {one:.4g}"
            if sim is not None:
                line += f", free run {sim:.4g}"
        return f"{head}\n{line}"

    def __str__(self) -> str:
        if getattr(self, "result_", None) is None or self.result_.diverged is not None:
            return repr(self)
        labels = self._repeat_labels()
        head, rep = [], None
        if len(labels) > 1:                                   # several repeats: the first
            rep = labels[0]
            head = [f"repeat {rep} (of {len(labels)}: {', '.join(map(str, some(labels, 12)))})"
                    ":"]
        if self.result_.estimate.shape[1] == 1:
            eqs = head + self.equations(repeat=rep)
        else:                                                 # a model per client: the first
            eqs = head + [f"client {self.clients_[0]}:"] + self.equations(
                client=self.clients_[0], repeat=rep)
        return "\n".join([repr(self)] + [f"  {e}" for e in eqs])
