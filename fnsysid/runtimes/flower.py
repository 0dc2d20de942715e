"""The Flower runtime (``runtime=flower``): the same experiment as a Flower app.

A :class:`flwr.serverapp.ServerApp` runs the strategy's server side; one
:class:`flwr.clientapp.ClientApp` per client holds only that client's data and answers with
the strategy's :meth:`~fnsysid.learning.strategies.Federated.client_update`, the function the
in-process engine calls for all clients at once. A client's data are simulated from that client's
own random streams (:func:`fnsysid.dynamics.model.generate` with ``clients=[i]``: the same data as
in process) or read from its own trajectory file (``data=files``). Only models, gradients and
control variates cross the network (with ``sparsity=stlsq`` also each client's statistics,
once); each client computes its errors ``e_r^(i)`` against its own
true parameters (when known) and sends back those numbers.

Messages (``message_type``):

- ``query``: a client answers with its label and its sample counts ``n`` (S,) (the weights
  of ``strategy.weighting=samples``), and with ``sparsity=stlsq`` its statistics ``H``
  (S, p, p), ``b`` (S, p) and its targets' sums of squares ``yy``, whose sums choose the
  support (:mod:`fnsysid.learning.sparsity`; ``yy`` for ``sparsity.scale=unit``,
  :func:`query_reply`), and with ``sparsity.threshold=auto`` its held-out statistics, whose
  sums score the candidate supports;
- ``train``: one exchange of the strategy (config ``exchange``, ``round``, ``evaluate``),
  arrays (S, ...) from :meth:`~fnsysid.learning.strategies.Federated.message` (and ``active`` (S,),
  the repeats the client takes part in, when clients are sampled); the reply holds the
  client's arrays of :meth:`~fnsysid.learning.strategies.Federated.client_update`, and with
  ``evaluate`` its scores (:data:`SCORES`, each (S,)) of the model it received: its error
  ``_e``, its held-out one-step and free-run NRMSE ``_n1``/``_ns`` (the free run when the
  config's ``free_run`` says so) and ``_v``, whether it is scored (federated evaluation);
- ``evaluate``: the model to evaluate (S, p) (config ``free_run``); the reply holds the
  client's scores;
- ``train`` with config ``exchange=model_check``, once after the last round
  (``output.model_check``): the reply holds the client's statistics of the model check on
  its own fit and held-out data (:func:`fnsysid.results.modelcheck.client_statistics`: sums,
  counts and p-values, no trajectory), which the server combines as in process
  (:func:`serve_model_check`).

A client's own state between rounds (SCAFFOLD's ``c_i``) lives in its node's Flower
``Context.state``. :func:`run` drives Flower's simulation engine; the objects ``flwr run``
loads in a deployment (``deploy/flower/``, docs/FEDERATED.md) are built from these in
:mod:`fnsysid.app.flower_apps`, which composes and builds each node's objects from the run
config.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fnsysid.config.errors import some
from fnsysid.learning.start import initial_model
from fnsysid.results.metrics import HeldOutScores
from fnsysid.runtimes import flower_personal as personal
from fnsysid.runtimes import flower_secure as secure
from fnsysid.runtimes import flower_traffic as traffic
from fnsysid.runtimes import interrupt
from fnsysid.runtimes.check import FlowerError, node_settings
from fnsysid.runtimes.reaper import Reaper

log = logging.getLogger("fnsysid")


def to_record(arrays: dict[str, np.ndarray], squeeze_client: bool = False) -> ArrayRecord:
    """Arrays as a Flower ArrayRecord (a client's (S, 1, ...) replies lose the client axis)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v[:, 0] if squeeze_client else v))
                        for k, v in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


#: ``data.path`` of a deployed run whose overrides give none (``data=files``): the data are on
#: the SuperNodes, each its own file (node config ``data-path``); the server reads no file
ON_NODES = "<on the SuperNodes>"

#: keys of the app's ``[tool.flwr.app.config]`` that are not run.py settings
APP_KEYS = ("overrides", "outdir")


def deployed_overrides(run_config) -> tuple[list[str], bool]:
    """The ``run.py`` overrides of a deployed run from its Flower run config: the
    ``overrides`` string, then every other key of ``[tool.flwr.app.config]`` but ``outdir`` as
    a typed setting (``M = 12`` is ``M=12``, ``strategy = "scaffold"`` is
    ``strategy=scaffold``). With ``data=files`` and no ``data.path``, ``data.path`` is
    :data:`ON_NODES`; the second value says so (the server then checks no data path)."""
    import shlex

    from fnsysid.config.checks import ConfigError, override_key

    try:
        given = shlex.split(str(run_config.get("overrides", "")))
    except ValueError as exc:
        raise ConfigError(f"overrides={run_config.get('overrides')!r}: {exc}; allowed: run.py "
                          "overrides, e.g. 'M=12 strategy=scaffold'") from None
    keys = {override_key(o) for o in given}
    for key, value in run_config.items():
        if key in APP_KEYS:
            continue
        if key in keys:
            raise ConfigError(f"{key} is given twice: in overrides and as a key of "
                              "[tool.flwr.app.config] (--run-config); allowed: one of them")
        given.append(f"{key}={_value(value)}")
    choice = {override_key(o): o.split("=", 1)[1] for o in given if "=" in o}
    placeholder = choice.get("data") == "files" and "data.path" not in choice
    if placeholder:
        given.append(f"data.path={_value(ON_NODES)}")
    return given, placeholder


def _value(v) -> str:
    """A TOML value of the run config as override text Hydra parses back to it (a name such
    as ``scaffold`` as it is, other text quoted)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, str):
        if re.fullmatch(r"[\w./@:-]+", v):
            return v
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(v)


def client_order(settings, labels: list[str]) -> list:
    """Sort keys of client labels: the in-process order (index, or file name for files)."""
    if settings.data.source == "simulated":
        return [int(c) for c in labels]
    return list(labels)


# ---------------------------------------------------------------------------------------------
# client side


class ClientNode:
    """What one client holds: its data, its label, the strategy's client side on its data.

    ``index``: the client's position among the run's clients (simulated data: its random
    streams; ``data=files`` with a folder: its file). ``data_path``/``truth_path``: its own
    trajectory file and true parameters (a deployed node's ``data-path``/``truth-path``),
    which win over ``index``.
    """

    def __init__(self, settings, model, optimizer, strategy, index: int | None,
                 data_path: str | None = None, truth_path: str | None = None,
                 truth: np.ndarray | None = None):
        from fnsysid.dynamics.model import generate

        self.strategy = strategy
        self.settings, self.model = settings, model
        if settings.files:
            self.label, self.data = self._from_file(settings, model, optimizer, index, data_path,
                                                    truth_path, truth)
        else:
            if index is None:
                raise ValueError("a node with simulated data needs node config client=<index>")
            self.label = str(index)
            s = settings
            self.data = generate(model, s.M, s.N, s.T, s.eps, s.repeats, s.seed,
                                 shared_noise=s.data.shared_noise, clients=[index])
        optimizer.setup(self.data, model, settings.seed)
        self.model, self.seed, self.support = model, settings.seed, None   # sparsity's support
        self.clients = self.strategy.make_clients(optimizer, self._local_steps(settings, index),
                                                  settings.lr)
        if not settings.files:
            self.heldout = self._simulated_heldout(settings, model, index)
        self.scores = None if self.heldout is None else HeldOutScores(model, self.heldout)

    @staticmethod
    def _simulated_heldout(settings, model, index: int):
        """This client's ``data.val_N`` held-out trajectories, from its own random streams
        (those the in-process run draws for it), or None."""
        from fnsysid.data.heldout import heldout_from_trajectories
        from fnsysid.dynamics import random as rnd
        from fnsysid.dynamics.model import simulate_clients

        s = settings
        if s.data.val_N <= 0:
            return None
        x, u = simulate_clients(model, [index], s.data.val_N, s.T, s.eps, s.repeats, s.seed,
                                s.data.shared_noise, rnd.HOLDOUT)
        return heldout_from_trajectories(model, x, u, np.ones(x.shape[:-1], bool))

    def _local_steps(self, settings, index):
        """This client's ``K_i`` (S, 1), or ``K`` when all clients share it."""
        from fnsysid.learning.local_work import is_heterogeneous, local_steps

        if not is_heterogeneous(settings.K):
            return int(settings.K)
        if index is None:
            raise ValueError("per-client K needs the node's position: node config client=<i>")
        M = settings.M
        if M is None:           # data=files in the simulation engine: the folder's files
            from fnsysid.data.files import data_files

            M = len(data_files(settings.data.path))
        return local_steps(settings.K, M, self.data.shape[0], settings.seed, clients=[index])

    def _from_file(self, settings, model, optimizer, index, data_path, truth_path, truth):
        """This client's training data from its own file (its held-out rows in
        :attr:`heldout`); its truth from its own truth file, or ``truth`` (S, 1, p), its rows
        of the run's ``data.truth`` (read once by the run, :class:`NodeSources`)."""
        from fnsysid.data.files import data_files
        from fnsysid.data.source import from_files

        if data_path is None and settings.data.path == ON_NODES:
            raise ValueError("this SuperNode has no trajectory file: start it with "
                             "--node-config \"data-path='<its file>'\" (data=files)")
        if data_path is None and index is None:
            raise ValueError("a node with data=files needs node config data-path=<its file>")
        path = data_path or data_files(settings.data.path)[index]
        own = node_settings(settings, path, truth_path)
        dataset = from_files(own, model, optimizer, client_file=True)
        label, data = dataset.clients[0], dataset.train
        self.heldout = dataset.heldout
        if truth_path is None and truth is not None:      # its rows of data.truth
            data.theta_true = truth
        elif truth_path is None and settings.data.truth:
            raise ValueError("data.truth is read by the run, not by a SuperNode: give each "
                             "SuperNode its own truth file, --node-config \"truth-path='<file>'\"")
        return label, data

    def errors(self, theta: np.ndarray) -> np.ndarray:
        """This client's errors ``e^(i)`` (S, 1) of server models ``theta`` (S, p); NaN
        where its true parameters are unknown."""
        from fnsysid.results.metrics import client_errors

        with np.errstate(invalid="ignore"):
            return client_errors(theta[:, None, :], self.data.theta_true)

    def truth_norm(self) -> np.ndarray:
        """The norm of this client's true parameters (S, 1), over the known ones (NaN where
        none is known), the denominator of its errors."""
        from fnsysid.results.metrics import ParameterErrors

        return ParameterErrors(self.data.theta_true).norm

    def nrmse(self, theta: np.ndarray, free_run: bool) -> dict[str, np.ndarray]:
        """This client's held-out scores of server models ``theta`` (S, p), each (S, 1), with
        the in-process functions (:class:`~fnsysid.results.metrics.HeldOutScores`): ``_n1``
        the one-step NRMSE, ``_ns`` the free-run NRMSE (NaN unless ``free_run``), ``_v`` 1
        where the client is scored (held-out data in which a predicted state varies), else 0
        (then both are NaN), ``_h`` the mark of its held-out data
        (:func:`~fnsysid.data.heldout.heldout_marks`, 0 without any)."""
        S = theta.shape[0]
        if self.scores is None:
            nan = np.full((S, 1), np.nan)
            return {"_n1": nan, "_ns": nan, "_v": np.zeros((S, 1)), "_h": np.zeros((S, 1))}
        est = theta[:, None, :]
        with np.errstate(all="ignore"):
            n1 = self.scores.one_step(est)
            ns = self.scores.free_run(est) if free_run else np.full((S, 1), np.nan)
        return {"_n1": n1, "_ns": ns, "_v": self.scores.valid.astype(float),
                "_h": self.heldout.marks()}


class NodeSources:
    """Where each client of a simulated Flower run with ``data=files`` finds its data, made
    once by the run (which reads and checks the folder before Flower starts) and given to
    every ClientApp: the folder's files (``files[i]`` is client i's file) and, with
    ``data.truth``, each client's true parameters, so that a node opens its own file only and
    neither lists the folder nor reads the truth file (O(its data), not O(M))."""

    def __init__(self, files: list[str], clients: list[str], truth: np.ndarray | None):
        self.files = list(files)
        self.row = {c: j for j, c in enumerate(clients)}
        self.truth = truth                      # (S, M, p) in the order of ``clients``
        self._saved: str | None = None          # the file it crosses to the nodes as

    # Flower's simulation engine sends the ClientApp, and with it this object, along with every
    # message (Ray pickles the app's loader with each call): pickled whole, a message would
    # carry O(M) bytes and each copy would be a new object, so that a node's cache of its
    # ClientNode (:func:`fnsysid.app.build.client_node`) missed and the node read its file
    # again for every message. It crosses as the name of a file written once instead (read
    # once per process), and copies of it are equal.
    def __getstate__(self) -> dict:
        if self._saved is None:
            import pickle
            import shutil
            import tempfile
            import weakref

            folder = tempfile.mkdtemp(prefix="fnsysid-sources-")
            path = os.path.join(folder, "sources.pkl")
            with open(path, "wb") as f:
                pickle.dump((self.files, self.row, self.truth), f)
            weakref.finalize(self, shutil.rmtree, folder, True)
            self._saved = path
        return {"saved": self._saved}

    def __setstate__(self, state: dict) -> None:
        self._saved = state["saved"]
        self.files, self.row, self.truth = _saved_sources(self._saved)

    def __eq__(self, other) -> bool:
        if not isinstance(other, NodeSources):
            return NotImplemented
        return self is other or (self._saved is not None and self._saved == other._saved)

    def __hash__(self) -> int:
        return hash(self._saved) if self._saved is not None else id(self)

    def of(self, index: int) -> tuple[str, np.ndarray | None]:
        """Client ``index``'s file and true parameters (S, 1, p) or None."""
        from pathlib import Path

        path = self.files[index]
        if self.truth is None:
            return path, None
        j = self.row[Path(path).stem]
        return path, self.truth[:, j:j + 1].copy()


@functools.lru_cache(maxsize=8)
def _saved_sources(path: str):
    """What a :class:`NodeSources` saved to ``path`` holds, read once per process."""
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


def node_identity(context: Context) -> tuple[int | None, str | None, str | None]:
    """Which client a node holds, from its node config: (index, data path, truth path).

    ``data-path`` (its trajectory file; ``truth-path`` its true parameters, if known), else
    ``client`` (index), else ``partition-id`` (Flower's simulation engine)."""
    ncfg = context.node_config
    index = ncfg.get("client", ncfg.get("partition-id"))
    path, truth = ncfg.get("data-path"), ncfg.get("truth-path")
    return (None if index is None else int(index), None if path is None else str(path),
            None if truth is None else str(truth))


def query_reply(data, sparse: bool, heldout=None, model=None) -> dict[str, np.ndarray]:
    """A node's answer to the first ``query``: its sample counts and, with ``sparsity=stlsq``
    (``sparse``), the statistics whose sums choose the support (``H``, ``b``) and each
    target's sum of squares ``yy`` (what ``sparsity.scale=unit`` scales the coefficients
    with), each (S, 1, ...). With ``sparsity.threshold=auto`` (``heldout`` given: the node's
    :class:`~fnsysid.data.heldout.HeldOut`, or False when it has none) also its held-out
    statistics ``hgram``, ``hcross``, ``hyy``, ``hn`` (zeros without held-out data), whose
    sums score the candidate supports."""
    out = {"n": data.n}
    if sparse:
        out.update(H=data.H, b=data.b, yy=data.yy_target)
    if heldout is not None:
        if heldout is False:
            S, (n_y, n_phi) = data.n.shape[0], model.structure.shape[:2]
            out.update(hgram=np.zeros((S, 1, n_phi, n_phi)), hcross=np.zeros((S, 1, n_y, n_phi)),
                       hyy=np.zeros((S, 1, n_y)), hn=np.zeros((S, 1)))
        else:
            out.update(hgram=heldout.gram, hcross=heldout.cross, hyy=heldout.yy,
                       hn=np.asarray(heldout.n, float))
    return out


#: the exchange after the last round in which each client sends its statistics of the model
#: check (:mod:`fnsysid.results.modelcheck`)
MODEL_CHECK = "model_check"


def model_check_reply(node: ClientNode, arrays: dict) -> dict[str, np.ndarray]:
    """A client's statistics of the model check (:func:`fnsysid.results.modelcheck.
    client_statistics`), each (S, 1, ...), from its own training and held-out data and its own
    random stream (named by its label); ``arrays["support"]`` (S, p): the server's support
    under ``sparsity``. Only these sums, counts and p-values leave the node."""
    from fnsysid.results import modelcheck
    from fnsysid.results.metrics import roundoff_facts, roundoff_loss

    support = arrays.get("support")
    support = None if support is None else np.asarray(support) > 0
    S = node.data.n.shape[0]
    if node.heldout is None or not (node.heldout.n > 0).any():
        out = modelcheck.empty_statistics(node.model, S, 1)
    else:
        out = modelcheck.client_statistics(node.model, node.data, node.heldout, node.label,
                                           support)
    # the round-off of the client's own least squares, against its targets' spread (the
    # server holds no H_i to perturb the pooled sums with): four numbers a repeat
    d = node.data
    if node.model.library is not None and d.factor is not None and d.y_mean is not None \
            and d.yy_target is not None:     # against a stable solve of its own
        facts = {k[4:]: v for k, v in roundoff_loss(node.model, d, support,
                                                      pooled=False).items()}
    else:
        facts = roundoff_facts(d, support, np.abs(node.model.structure).sum(axis=1) > 0)
    return {**out, **{f"{ROUNDOFF}{k}": v for k, v in facts.items()}}


#: the prefix of the round-off facts in a model-check reply
ROUNDOFF = "roundoff_"


def make_client_app(node: Callable[[Context], ClientNode]) -> ClientApp:
    """A ClientApp whose messages are answered by the :class:`ClientNode` that ``node``
    gives for a node's context (built by the caller, once per client)."""
    app = ClientApp(mods=[secure.client_mod(node)])

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        me = node(context)
        sp = me.settings.sparsity
        auto = sp.name != "none" and sp.threshold == "auto"
        arrays = query_reply(me.data, sp.name != "none",
                             (me.heldout if me.heldout is not None else False) if auto else None,
                             me.model)
        return Message(RecordDict({"info": ConfigRecord({"client": me.label}),
                                   "arrays": to_record(arrays, True)}),
                       reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        me = node(context)
        if secure.OWN not in msg.content.array_records:     # a round of Flower's workflow
            return secure.client_fit(me, msg)
        config = msg.content["config"]
        arrays = from_record(msg.content["arrays"])
        state = context.state.array_records.get("state")
        me.clients.state = {} if state is None else from_record(state)
        if str(config["exchange"]) in personal.EXCHANGES:        # after the last round
            replies = personal.client_reply(me, str(config["exchange"]), arrays)
            return Message(RecordDict({"arrays": to_record(replies, True)}), reply_to=msg)
        if str(config["exchange"]) == MODEL_CHECK:              # after the last round
            return Message(RecordDict({"arrays": to_record(model_check_reply(me, arrays),
                                                           True)}), reply_to=msg)
        if "support" in arrays:         # sparsity: the server's common support
            from fnsysid.learning.sparsity import restrict_client

            me.support = restrict_client(me.clients, me.data, me.model, me.seed,
                                         arrays.pop("support"), me.support)
        replies = me.strategy.client_update(str(config["exchange"]), arrays, me.clients)
        if me.clients.state:
            context.state["state"] = to_record(me.clients.state)
        if config.get("evaluate"):
            replies["_e"], replies["_t"] = me.errors(arrays["theta"]), me.truth_norm()
            replies.update(me.nrmse(arrays["theta"], bool(config.get("free_run"))))
        return Message(RecordDict({"arrays": to_record(replies, True)}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        me = node(context)
        theta = from_record(msg.content["arrays"])["theta"]
        config = msg.content.config_records.get("config") or {}
        scores = {"_e": me.errors(theta), "_t": me.truth_norm(),
                  **me.nrmse(theta, bool(config.get("free_run")))}
        return Message(RecordDict({"arrays": to_record(scores, True)}), reply_to=msg)

    return app


# ---------------------------------------------------------------------------------------------
# server side


def wait_for_nodes(grid: Grid, n: int, timeout: float = 300.0) -> list[int]:
    """The ids of the ``n`` connected nodes, once ``n`` are connected (each connected node is
    one client: more than ``n`` is refused, since which of them would be the clients is not
    said); after ``timeout`` seconds (``runtime.node_timeout``) with fewer, the run stops
    naming those connected."""
    t0 = time.monotonic()
    while len(nodes := sorted(grid.get_node_ids())) < n:
        if time.monotonic() - t0 > timeout:
            raise FlowerError(f"only {len(nodes)} of M={n} SuperNodes connected after "
                              f"{timeout:g} s (runtime.node_timeout)"
                              + (f": {', '.join(map(str, nodes))}" if nodes else ""))
        time.sleep(0.2)
    if len(nodes) > n:
        raise FlowerError(f"{len(nodes)} SuperNodes are connected ({', '.join(map(str, nodes))})"
                          f" but M={n}; allowed: M equal to the number of connected SuperNodes "
                          f"(each is one client), or stop the SuperNodes that are not clients "
                          f"of this run")
    return nodes


#: seconds between two looks for replies (Flower's in-memory grid polls as often)
PULL_INTERVAL = 0.1


class Aborted(FlowerError):
    """The run was told to stop at once (a second SIGINT/SIGTERM) while waiting for replies."""


def node_name(node: int, names: dict | None) -> str:
    """A node as messages name it: its id and, once known, its client."""
    return f"SuperNode {node} (client {names[node]})" if names and node in names else \
        f"node {node}"


def exchange(grid: Grid, sends: list[tuple], names: dict | None = None,
             timeout: float | None = None) -> list[RecordDict]:
    """Send messages ``(node, message_type, arrays, config or None)``; the replies' contents
    in the order of ``sends``. ``names``: node id -> client label, for messages.

    Waits for the replies with the grid's ``push_messages``/``pull_messages``, looking every
    :data:`PULL_INTERVAL` seconds, and gives up (:class:`Aborted`) as soon as the run is
    told to stop at once (:func:`fnsysid.runtimes.interrupt.aborted`), or with a
    :class:`FlowerError` naming the nodes that have not answered once ``timeout`` seconds
    (``runtime.reply_timeout``) have passed.
    """
    msgs = []
    for node, message_type, arrays, config in sends:
        content = {"arrays": to_record(arrays or {})}
        if config:
            content["config"] = ConfigRecord(config)
        msgs.append(Message(RecordDict(content), dst_node_id=node, message_type=message_type))
    ids = list(grid.push_messages(msgs))
    if len(ids) != len(msgs):
        raise FlowerError(f"the grid took {len(ids)} of {len(msgs)} messages")
    dst = {i: (node, kind) for i, (node, kind, *_) in zip(ids, sends, strict=True)}
    waiting = set(ids)
    by_node = {}
    t0 = time.monotonic()
    while waiting:
        for rep in grid.pull_messages(waiting):
            sent = rep.metadata.reply_to_message_id
            waiting.discard(sent)
            node, kind = dst.get(sent, (rep.metadata.src_node_id, rep.metadata.message_type))
            if rep.has_error():         # (an error from the SuperLink names it as the source)
                raise FlowerError(f"{node_name(node, names)} failed on {kind}: "
                                  f"{rep.error.reason.strip().rstrip('.')}")
            by_node[node] = rep.content
        if waiting:
            if interrupt.aborted():
                raise Aborted("stopped at once by a second signal")
            if timeout is not None and time.monotonic() - t0 > timeout:
                late = [node_name(dst[i][0], names) for i in ids if i in waiting]
                raise FlowerError(f"no reply within {timeout:g} s (runtime.reply_timeout) "
                                  f"from {', '.join(some(late, 10))}")
            time.sleep(PULL_INTERVAL)
    missing = [node_name(node, names) for node, *_ in sends if node not in by_node]
    if missing:
        raise FlowerError(f"no reply from {', '.join(missing)}")
    replies = [by_node[node] for node, *_ in sends]
    traffic.record(msgs, replies)           # communication.measured
    return replies


#: what a client sends of a model it scores: its parameter error, held-out one-step and
#: free-run NRMSE, whether it is scored (:meth:`ClientNode.nrmse`), and the norm of its true
#: parameters (the scale of the divergence rule, :func:`~fnsysid.results.history.errors_diverged`)
#: and the mark of its held-out data (``_h``, ``summary.json: heldout``)
SCORES = ("_e", "_n1", "_ns", "_v", "_t", "_h")


def stacked(replies: list[RecordDict]) -> dict[str, np.ndarray]:
    """The clients' reply arrays stacked on a clients axis: (S, M, ...)."""
    arrays = [from_record(r["arrays"]) for r in replies]
    return {k: np.stack([a[k] for a in arrays], axis=1) for k in arrays[0]}


def serve(grid: Grid, settings, model, strategy, M: int, keep_clients: bool):
    """The server side of a run: ``settings.R`` rounds of ``strategy`` with M client nodes.

    Each round the clients the strategy samples (``strategy.fraction``; all by default) get
    ``train`` messages, with the repeats they take part in (``active``); the first exchange
    of a round also asks every client for its error of the current server model (the others
    get an ``evaluate`` message), so the errors cover all clients and a round costs one network
    round trip per exchange. One ``evaluate`` exchange after the last round gives the final
    errors. Returns (history, diverged round or None, start model (S, p), client labels,
    failure or None); the clients are ordered as in process. A node that fails or does not
    answer (a SuperNode that died) ends the rounds: ``failure`` is one line naming the round
    and the node, and the history holds the rounds whose errors all clients had sent. A
    SIGINT/SIGTERM (:mod:`fnsysid.runtimes.interrupt`) stops the rounds before the next one
    starts: the model of the last finished round is evaluated and the rounds so far are
    returned. A repeat diverges as in process (:func:`fnsysid.runtimes.inprocess.train`):
    when its server model is not finite or, with a ground truth, some client's error is not
    finite or grows past the limit; the errors of a round's model arrive with the next round's
    first exchange. Its rows are NaN from then on and the other repeats run on; the rounds stop
    when every repeat diverged (with sparsity, at the first). ``history.diverged_at`` gives
    each repeat's round.
    """
    from fnsysid.results.history import (
    History,
    Repeats,
    errors_diverged,
    fleet_errors,
    growth_limit,
)
    from fnsysid.results.metrics import over_clients

    nodes = wait_for_nodes(grid, M, float(getattr(settings.runtime, "node_timeout", 300.0)))
    traffic.start()                         # communication.measured
    wait = float(getattr(settings.runtime, "reply_timeout", 600.0))
    info = exchange(grid, [(n, "query", None, None) for n in nodes], timeout=wait)
    labels = [str(r["info"]["client"]) for r in info]
    if len(set(labels)) != len(labels):
        raise FlowerError(f"two nodes hold the same client: {sorted(labels)}")
    order = np.argsort(client_order(settings, labels), kind="stable")
    nodes, labels = [nodes[i] for i in order], [labels[i] for i in order]
    stats = stacked([info[i] for i in order])
    n = stats["n"]
    theta0 = initial_model(model, None, settings.system.init, repeats=n.shape[0])
    strategy.setup_server(theta0, n, settings.seed)
    sparsity = getattr(strategy, "sparsity", None)      # sparsity=stlsq: the server prunes
    if sparsity is not None:
        held = None if "hn" not in stats else (
            stats["hgram"].sum(axis=1), stats["hcross"].sum(axis=1), stats["hyy"].sum(axis=1),
            stats["hn"].sum(axis=1))
        sparsity.start_server(strategy, stats["H"].sum(axis=1), stats["b"].sum(axis=1),
                              stats["yy"].sum(axis=1), model, n, settings.seed, held)
    names = dict(zip(nodes, labels, strict=True))

    hist = History(per_client=[] if keep_clients else None)
    limit = None                        # set from the start errors (or the start NRMSE)
    has_truth = False
    answered: dict[int, int] = {}       # round -> clients that trained in it
    S = n.shape[0]
    repeats = Repeats(S, stop_at_first=sparsity is not None)   # as in the other runtime
    judge, blank = repeats.judge, repeats.blank
    dead, diverged_at = repeats.dead, repeats.diverged_at

    def free_run_due(r: int) -> bool:
        """Whether the free-run NRMSE of round ``r``'s model is scored (as in process)."""
        return r == 0 or r == settings.R or r % settings.output.eval_every == 0

    def record(r: int, a: dict) -> bool:
        """Record the scores ``a`` (``_e``, ``_n1``, ``_ns``, ``_v``, each (S, M)) of the model
        after round ``r``; False if the run stops there (every repeat diverged). As in process
        (:func:`fnsysid.runtimes.inprocess.train`), the parameter errors judge divergence when
        every client knows its truth, else the held-out one-step NRMSE; a repeat that diverged
        is left out from then on (its rows NaN) and the others run on."""
        nonlocal limit, has_truth
        e, n1, valid = a["_e"], a["_n1"], a["_v"] > 0.5
        step = over_clients(n1, valid)
        if r == 0:
            has_truth = bool(np.isfinite(e).all())
            start = (float(e.max()) if has_truth
                     else float(np.nanmax(step[0], initial=0.0)) if valid.any() else 1.0)
            limit = growth_limit(start)
        else:
            bad = (np.array([errors_diverged(e_s, limit, t_s)       # on the fleet's scale
                             for e_s, t_s in zip(e, a["_t"], strict=True)]) if has_truth
                   else step[0] > limit)        # NaN (no scored client) never diverges
            if judge(r, bad):
                return False
        hist.record(blank(e), blank(n1), blank(a["_ns"]) if free_run_due(r) else None, valid)
        hist.heldout_marks = a["_h"]
        if has_truth:                   # the growth rule's errors, round 0 and the last
            scaled = blank(fleet_errors(e, a["_t"]))
            hist.fleet = {"start": scaled if r == 0 else hist.fleet["start"], "final": scaled}
        log_round(r, over_clients(blank(n1), valid))
        return True

    def log_round(r: int, step) -> None:
        """One line per finished round: the clients that answered, the mean errors."""
        if r == 0:
            return
        parts = [f"round {r} of {settings.R} done: {answered.get(r, M)} of {M} clients "
                 "answered"]
        if has_truth and np.isfinite(hist.e_max[-1]).any():
            parts.append(f"e_max {float(np.nanmean(hist.e_max[-1])):.6g}")
        if np.isfinite(step[1]).any():
            parts.append(f"held-out NRMSE {float(np.nanmean(step[1])):.6g} (one step, mean "
                         "over clients)")
        log.info(", ".join(parts))

    workflow = secure.applies(settings)     # train exchanges as Flower workflow rounds
    last = settings.R                   # the last round whose model is evaluated
    stopped = False                     # every repeat diverged (or one, under sparsity)
    failure, stage = None, "round 1"
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            for r in range(1, settings.R + 1):
                if interrupt.requested():       # SIGINT/SIGTERM: stop between rounds
                    last = r - 1
                    break
                stage = f"round {r}"
                active = strategy.participants(r)
                on = np.arange(M) if active is None else np.flatnonzero(active.any(axis=0))
                off = np.setdiff1d(np.arange(M), on)
                answered[r] = len(on)
                for j, ex in enumerate(strategy.exchanges):
                    msg = strategy.message(ex)
                    if sparsity is not None:
                        msg = sparsity.message(msg)
                    if workflow:                # SecAgg+ / Flower's DP: flower_secure
                        if j == 0 and not record(r - 1, stacked(exchange(grid, [
                                (nd, "evaluate", {"theta": msg["theta"]},
                                 {"free_run": free_run_due(r - 1)}) for nd in nodes],
                                names, wait))):
                            stopped = True
                            break
                        mean = secure.workflow_round(grid, settings, strategy, ex, msg,
                                                     [nodes[i] for i in on], wait)
                        strategy.server_update(ex, {k: v[:, None] for k, v in mean.items()})
                        continue
                    config = {"exchange": ex, "round": r, "evaluate": j == 0,
                              "free_run": free_run_due(r - 1)}
                    sends = [(nodes[i], "train", msg if active is None else
                              {**msg, "active": active[:, i]}, config) for i in on]
                    if j == 0:
                        sends += [(nodes[i], "evaluate", {"theta": msg["theta"]},
                                   {"free_run": free_run_due(r - 1)}) for i in off]
                    replies = exchange(grid, sends, names, wait)
                    arrays = stacked(replies[:len(on)])
                    if j == 0:
                        scores = {}
                        for k in SCORES:
                            scores[k] = np.empty((n.shape[0], M))
                            scores[k][:, on] = arrays.pop(k)
                            if len(off):
                                scores[k][:, off] = stacked(replies[len(on):])[k]
                        if not record(r - 1, scores):
                            stopped = True
                            break
                    strategy.server_update(ex, arrays, sel=on,
                                           active=None if active is None else active[:, on])
                if stopped:
                    break
                if sparsity is not None:
                    sparsity.server_round(strategy, r)
                if judge(r, ~np.isfinite(strategy.server).reshape(S, -1).all(axis=1)):
                    stopped = True
                    break
            if not stopped:
                stage = f"the evaluation after round {last}"
                final = exchange(grid, [(nd, "evaluate", {"theta": strategy.server},
                                         {"free_run": free_run_due(last)}) for nd in nodes],
                                 names, wait)
                record(last, stacked(final))
            if (not dead.any() and settings.personalize.name != "none"
                    and not interrupt.requested()):
                stage = f"the personalization after round {last}"

                def ask(name: str, arrays: dict, r: int = last) -> dict:
                    config = {"exchange": name, "round": r, "evaluate": False}
                    return stacked(exchange(grid, [(nd, "train", arrays, config)
                                                   for nd in nodes], names))

                hist.personal = personal.serve_personalize(ask, settings, strategy, model)
            if not dead.any() and settings.output.model_check:
                stage = f"the model check after round {last}"
                hist.model_check, hist.roundoff = serve_model_check(
                    grid, nodes, names, wait, settings, strategy, model, last)
    except Aborted:
        raise
    except FlowerError as exc:
        failure = f"{stage}: {exc}"
    hist.diverged_at = diverged_at
    hist.traffic = traffic.summary(S, M)
    if workflow:             # the train exchanges were Flower's workflow messages, not counted
        hist.traffic = {"not_measured": "the train exchanges ran as rounds of Flower's "
                        "workflow (SecAgg+ or its DP blocks), whose messages are Flower's own; "
                        "only fnsysid's other messages were seen", "partial": hist.traffic}
    diverged = min((d for d in diverged_at if d is not None), default=None)
    return hist, diverged, theta0, labels, failure


def serve_model_check(grid: Grid, nodes: list[int], names: dict, wait: float, settings,
                      strategy, model, last: int) -> tuple[dict | None, dict | None]:
    """The model check after the last round: every client sends its statistics
    (:func:`model_check_reply`, exchange :data:`MODEL_CHECK`) and the server combines them
    as the in-process run does (:func:`fnsysid.results.modelcheck.combine`); the result with
    client positions in the clients' order, or None without held-out data; and the clients'
    round-off facts of their own least squares (:func:`fnsysid.results.metrics.
    roundoff_facts`, each (S, M)), which the run judges as the in-process run judges the
    pooled sums' (:func:`fnsysid.app.experiment.roundoff_lost`). Not made under ``privacy``
    (its statistics are sums over a client's data that no noise protects): the result then
    says so in ``reason``, and there are no round-off facts (None)."""
    from fnsysid.results.modelcheck import combine

    privacy = getattr(strategy, "privacy", None)
    if privacy is not None:         # its sums would leave the clients without the noise
        return {"ok": None, "verdict": None, "white": None, "test": "billings-voon",
                "tests": 0, "reason": f"not made under runtime=flower with privacy="
                f"{privacy.mode}: the clients' statistics would leave them without noise"}, None
    sparsity = getattr(strategy, "sparsity", None)
    support = None if sparsity is None else sparsity.support
    arrays = {} if support is None else {"support": np.asarray(support, float)}
    config = {"exchange": MODEL_CHECK, "round": last, "evaluate": False}
    stats = stacked(exchange(grid, [(nd, "train", arrays, config) for nd in nodes], names,
                             wait))
    roundoff = {k[len(ROUNDOFF):]: stats.pop(k) for k in list(stats) if k.startswith(ROUNDOFF)}
    return combine(model, stats, support), roundoff or None


def make_server_app(settings, model, strategy, M: int, keep_clients: bool,
                    result: dict) -> ServerApp:
    """A ServerApp that runs :func:`serve` and leaves its result in ``result``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        result["serve"] = serve(grid, settings, model, strategy, M, keep_clients)

    return app


def server_dataset(settings, labels: list[str] | None = None):
    """What the server of a Flower run knows of the data: the clients (``labels``, or the
    file names of a ``data=files`` folder, which are counted, not read) and the settings for
    the summary."""
    from fnsysid.data.source import Dataset

    if settings.files:
        if labels is None:
            from fnsysid.data.files import data_files

            labels = [f.stem for f in data_files(settings.data.path)]
        facts = {"M": len(labels), "N": None, "T": None, "eps": None, "clients": labels}
    else:
        labels = [str(m) for m in range(settings.M)] if labels is None else labels
        facts = {k: settings.resolved[k] for k in ("M", "N", "T", "eps")}     # as given
    return Dataset(None, None, list(labels), facts)


class _DropDeprecation(logging.Filter):
    def filter(self, record):
        return "deprecated" not in record.getMessage().lower()


def quiet_flower() -> None:
    """Flower's and Ray's logs down to warnings (errors still reach the run's log)."""
    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    if not any(isinstance(f, _DropDeprecation) for f in flwr_log.filters):
        flwr_log.addFilter(_DropDeprecation())
    logging.getLogger("alembic").setLevel(logging.WARNING)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def start_ray() -> bool:
    """Start Ray for Flower's simulation engine (as Flower starts it), unless it runs already;
    True if started here.

    ``ray.init`` installs a SIGTERM handler of its own (which exits at once); the handlers in
    place before it are put back, so that SIGTERM, like SIGINT, stops the run at the end of a
    round (:mod:`fnsysid.runtimes.interrupt`).
    """
    import ray

    if ray.is_initialized():
        return False
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS} if main else {}
    pythonpath = os.pathsep.join([*sys.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    for s, handler in saved.items():
        if handler is not None:
            signal.signal(s, handler)
    return True


def run(settings, model, strategy, dataset, keep_clients: bool, client_app: ClientApp):
    """Run the rounds of ``settings`` on Flower's simulation engine (Ray backend), one virtual
    SuperNode per client of ``dataset`` (:func:`server_dataset`), answered by ``client_app``.

    Returns (history, diverged round or None, start model, failure or None: why the rounds
    stopped early, e.g. a reply timeout, with the finished rounds in the history);
    ``dataset.settings`` gets the number of repeats the clients reported. Ray is shut down
    whatever the end (the last round, an error, a signal), so none of its processes outlives
    the run; when the run is killed (SIGKILL) a watchdog ends them
    (:class:`~fnsysid.runtimes.reaper.Reaper`, when Ray is started here).
    """
    quiet_flower()                      # before flwr.simulation's imports log at INFO
    import ray
    from flwr.simulation import run_simulation

    result: dict = {}
    M = len(dataset.clients)
    server = make_server_app(settings, model, strategy, M, keep_clients, result)
    backend = {"client_resources": {"num_cpus": float(settings.runtime.client_cpus),
                                    "num_gpus": 0.0},
               "init_args": {"logging_level": "ERROR", "log_to_driver": False}}
    log.info("starting Flower's simulation engine (Ray) with %d ClientApps", M)
    with contextlib.ExitStack() as watch:
        try:
            if not ray.is_initialized():        # Ray's processes end with this one
                watch.enter_context(Reaper())
            start_ray()
            run_simulation(server, client_app, num_supernodes=M, backend_config=backend)
        finally:
            ray.shutdown()
    if "serve" not in result:
        raise FlowerError("the Flower ServerApp stopped before the last round; see the log")
    hist, diverged, theta0, labels, failure = result["serve"]
    if failure is not None and not hist.e_max:
        raise FlowerError(f"{failure}; no round finished")
    dataset.clients[:] = labels
    dataset.settings.setdefault("repeats", theta0.shape[0])
    return hist, diverged, theta0, failure
