"""The Flower runtime (``runtime=flower``): the same experiment as a Flower app.

A :class:`flwr.serverapp.ServerApp` runs the strategy's server side; one
:class:`flwr.clientapp.ClientApp` per client holds only that client's data, drawn from that
client's own random streams (:func:`fnsysid.model.generate` with ``clients=[i]``), and answers
with the strategy's :meth:`~fnsysid.strategies.Federated.client_update`, the function the
in-process engine calls for all clients at once. Only models, gradients and control variates
cross the network; the errors ``e_r^(i)`` are computed by each client against its own true
parameters and sent back as numbers.

Messages (``message_type``):

- ``query``: a client answers with its index and its sample counts ``n`` (S,) (weights of
  ``strategy.weighting=samples``);
- ``train``: one exchange of the strategy (config ``exchange``, ``round``), arrays
  (S, ...) from :meth:`~fnsysid.strategies.Federated.message`; the reply holds the client's
  arrays of :meth:`~fnsysid.strategies.Federated.client_update`;
- ``evaluate``: the model to evaluate (S, p); the reply holds the client's errors (S,).

A client's own state between rounds (SCAFFOLD's ``c_i``) lives in the node's Flower
``Context.state``. :func:`run` drives Flower's simulation engine from a run of ``run.py``.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from omegaconf import OmegaConf

from .strategies import Clients

log = logging.getLogger("fnsysid")


def to_record(arrays: dict[str, np.ndarray], squeeze_client: bool = False) -> ArrayRecord:
    """Arrays as a Flower ArrayRecord (a client's (S, 1, ...) replies lose the client axis)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v[:, 0] if squeeze_client else v))
                        for k, v in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


# ---------------------------------------------------------------------------------------------
# client side


class ClientNode:
    """What one client holds: its data, its local solver and the strategy's client side."""

    def __init__(self, cfg_yaml: str, index: int):
        from .experiment import build
        from .model import generate
        from .validate import plain

        cfg = OmegaConf.create(cfg_yaml)
        self.index = index
        model, optimizer, self.strategy = build(cfg)
        self.data = generate(model, cfg.M, plain(cfg.N), cfg.T, cfg.eps, cfg.repeats, cfg.seed,
                             shared_noise=bool(cfg.data.shared_noise), clients=[index])
        optimizer.setup(self.data, model, cfg.seed)
        self.clients = Clients(optimizer, cfg.K, cfg.lr)


@lru_cache(maxsize=4096)
def client_node(cfg_yaml: str, index: int) -> ClientNode:
    """The node of client ``index`` (built once per process: it is a pure function of both)."""
    return ClientNode(cfg_yaml, index)


def make_client_app(cfg_yaml: str) -> ClientApp:
    """The ClientApp of a run with resolved config ``cfg_yaml``; a node's client index is its
    ``partition-id`` (simulation) or ``client`` (deployment) node config."""
    app = ClientApp()

    def node(context: Context) -> ClientNode:
        cfg = context.node_config
        index = cfg["client"] if "client" in cfg else cfg["partition-id"]
        return client_node(cfg_yaml, int(index))

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        me = node(context)
        return Message(RecordDict({"info": ConfigRecord({"client": me.index}),
                                   "arrays": to_record({"n": me.data.n}, True)}),
                       reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        me = node(context)
        exchange = str(msg.content["config"]["exchange"])
        state = context.state.array_records.get("state")
        me.clients.state = {} if state is None else from_record(state)
        replies = me.strategy.client_update(exchange, from_record(msg.content["arrays"]),
                                            me.clients)
        if me.clients.state:
            context.state["state"] = to_record(me.clients.state)
        return Message(RecordDict({"arrays": to_record(replies, True)}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        from .experiment import client_errors

        me = node(context)
        theta = from_record(msg.content["arrays"])["theta"]
        e = client_errors(theta[:, None, :], me.data.theta_true)
        return Message(RecordDict({"arrays": to_record({"e": e}, True)}), reply_to=msg)

    return app


# ---------------------------------------------------------------------------------------------
# server side


class FlowerError(RuntimeError):
    """A client answered with an error, or did not answer."""


def wait_for_nodes(grid: Grid, n: int, timeout: float = 120.0) -> list[int]:
    """Node ids once ``n`` nodes are connected."""
    t0 = time.monotonic()
    while len(nodes := sorted(grid.get_node_ids())) < n:
        if time.monotonic() - t0 > timeout:
            raise FlowerError(f"only {len(nodes)} of {n} nodes connected after {timeout:g} s")
        time.sleep(0.2)
    return nodes


def exchange(grid: Grid, nodes: list[int], message_type: str, arrays: dict | None = None,
             config: dict | None = None) -> list[RecordDict]:
    """Send one message to each of ``nodes``; the replies' contents in the order of ``nodes``."""
    content = {"arrays": to_record(arrays or {})}
    if config:
        content["config"] = ConfigRecord(config)
    msgs = [Message(RecordDict(content), dst_node_id=n, message_type=message_type)
            for n in nodes]
    by_node = {}
    for rep in grid.send_and_receive(msgs):
        if rep.has_error():
            raise FlowerError(f"node {rep.metadata.src_node_id} failed on {message_type}: "
                              f"{rep.error.reason}")
        by_node[rep.metadata.src_node_id] = rep.content
    missing = [n for n in nodes if n not in by_node]
    if missing:
        raise FlowerError(f"no {message_type} reply from nodes {missing}")
    return [by_node[n] for n in nodes]


def stacked(replies: list[RecordDict]) -> dict[str, np.ndarray]:
    """The clients' reply arrays stacked on a clients axis: (S, M, ...)."""
    arrays = [from_record(r["arrays"]) for r in replies]
    return {k: np.stack([a[k] for a in arrays], axis=1) for k in arrays[0]}


def serve(grid: Grid, strategy, theta0: np.ndarray, M: int, R: int, keep_clients: bool):
    """The server side of a run: R rounds of ``strategy`` with M client nodes.

    Returns (history, diverged round or None), as :func:`fnsysid.experiment.train`.
    """
    from .experiment import History

    nodes = wait_for_nodes(grid, M)
    info = exchange(grid, nodes, "query")
    index = [int(r["info"]["client"]) for r in info]
    if sorted(index) != list(range(M)):
        raise FlowerError(f"the {M} nodes hold clients {sorted(index)}; expected 0..{M - 1}, "
                          "one each")
    order = np.argsort(index)
    nodes = [nodes[i] for i in order]
    strategy.setup_server(theta0, stacked([info[i] for i in order])["n"])

    def evaluate():
        return stacked(exchange(grid, nodes, "evaluate", {"theta": strategy.server}))["e"]

    hist = History(per_client=[] if keep_clients else None)
    hist.record(evaluate())
    diverged = None
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(1, R + 1):
            for ex in strategy.exchanges:
                replies = exchange(grid, nodes, "train", strategy.message(ex),
                                   {"exchange": ex, "round": r})
                strategy.server_update(ex, stacked(replies))
            e = evaluate()
            if not np.isfinite(e).all():
                diverged = r
                break
            hist.record(e)
    return hist, diverged


def make_server_app(strategy, theta0, M: int, R: int, keep_clients: bool,
                    result: dict) -> ServerApp:
    """A ServerApp that runs :func:`serve` and leaves its result in ``result``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        result["history"], result["diverged"] = serve(grid, strategy, theta0, M, R,
                                                      keep_clients)

    return app


class _DropDeprecation(logging.Filter):
    def filter(self, record):
        return "DEPRECATED" not in record.getMessage() and "deprecated" not in record.getMessage()


def run(cfg, strategy, theta0, keep_clients: bool):
    """Run the rounds of ``cfg`` on Flower's simulation engine (Ray backend), one virtual
    SuperNode per client. Returns (history, diverged round or None)."""
    from flwr.simulation import run_simulation

    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    flwr_log.addFilter(_DropDeprecation())
    result: dict = {}
    cfg_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    server = make_server_app(strategy, theta0, cfg.M, cfg.R, keep_clients, result)
    backend = {"client_resources": {"num_cpus": float(cfg.runtime.client_cpus),
                                    "num_gpus": 0.0},
               "init_args": {"logging_level": "ERROR", "log_to_driver": False}}
    run_simulation(server, make_client_app(cfg_yaml), num_supernodes=cfg.M,
                   backend_config=backend)
    if "history" not in result:
        raise FlowerError("the Flower ServerApp stopped before the last round; see the log")
    return result["history"], result["diverged"]
