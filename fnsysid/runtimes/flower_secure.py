"""Secure aggregation (SecAgg+) and central differential privacy with Flower's own blocks, on
the Flower runtime (``runtime.secure_aggregation=true``; ``privacy=central``), docs/PRIVACY.md.

A ``train`` exchange of such a run is not one of :mod:`fnsysid.runtimes.flower`'s own
messages: it is one round of Flower's legacy default workflow
(:class:`flwr.server.workflow.DefaultWorkflow` with ``num_rounds=1``) whose fit step is

- :class:`flwr.server.workflow.SecAggPlusWorkflow` with ``runtime.secure_aggregation=true``
  (the ClientApp runs :func:`flwr.client.mod.secaggplus_mod`): each client masks its
  quantized reply and the server unmasks only the sum of the replies of the round, never a
  client's own;
- Flower's plain fit workflow otherwise.

The strategy of that round is :class:`MeanOfReplies` (a :class:`flwr.server.strategy.Strategy`:
the server's message to every client, the mean of their replies back), wrapped with
``privacy=central`` in :class:`flwr.server.strategy.DifferentialPrivacyClientSideFixedClipping`
(the ClientApp runs :func:`flwr.client.mod.fixedclipping_mod`, which clips each client's model
change ``theta_i - theta_s`` to norm ``privacy.clip``; the wrapper adds Gaussian noise of
standard deviation ``noise_multiplier * clip / M`` to the mean). That is DP-FedAvg's round
(:func:`fnsysid.learning.privacy.private_change` with every client taking part), so the
accountant's epsilon is the in-process one.

The errors and held-out scores of the server model (what the history records) still travel
as :mod:`fnsysid.runtimes.flower`'s own ``evaluate`` messages, per client, in the clear.

SecAgg+'s quantization (:func:`quantization_bound`): each client's reply entries are clipped
to ``[-c, c]`` (``runtime.secagg.clipping_range``) and stochastically rounded to one of
``Q + 1`` levels (``runtime.secagg.quantization_range``), an error below one level, ``2 c / Q``;
the server divides the unmasked sum of ``n`` replies by ``n`` (every reply's weight is 1), so
each entry of the mean is within ``2 c / Q`` of the plain mean. A client whose reply has an
entry outside ``[-c, c]`` refuses to send it (Flower would clip it silently).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import fixedclipping_mod, make_ffn, secaggplus_mod
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.constant import ErrorCode
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_PARAMS_RECORD

from fnsysid.runtimes.check import FlowerError

#: the record of fnsysid's own messages (:func:`fnsysid.runtimes.flower.exchange`); a train
#: message without it is one of Flower's workflow
OWN = "arrays"
#: SecAgg+'s modulus (Flower's default and largest): the sum of the clients' quantized
#: entries, each at most ``quantization_range``, must stay below it
MODULUS = 2 ** 32
#: the reply arrays of a secured ``train`` exchange (fedavg, fedprox)
REPLY = ("theta",)
#: a node's record (its context's state, and the ``query`` asking for it) of why its last
#: workflow round failed: Flower's workflows keep the clients' errors to themselves
WHY = "workflow-failure"


def secure(settings) -> bool:
    """Whether the run's train exchanges go through SecAgg+."""
    return bool(getattr(settings.runtime, "secure_aggregation", False))


def central_dp(settings) -> bool:
    """Whether the run's train exchanges use Flower's central DP blocks (asked on the Flower
    runtime only: a deployed node's settings may name no runtime, the server's always do)."""
    return settings.privacy.name == "central"


def applies(settings) -> bool:
    """Whether the run's train exchanges are Flower workflow rounds (this module)."""
    return secure(settings) or central_dp(settings)


def quantization_bound(clipping_range: float, quantization_range: int) -> float:
    """Largest difference of an entry of SecAgg+'s mean from the plain mean: ``2 c / Q``
    (stochastic rounding moves each client's entry by less than one level ``2 c / Q``, and
    the mean of the errors of ``n`` clients is below it too)."""
    return 2.0 * float(clipping_range) / int(quantization_range)


# ---------------------------------------------------------------------------------------------
# server side


class MeanOfReplies(Strategy):
    """One fit round of Flower's legacy workflow: every node in ``fitins`` gets its FitIns,
    and the mean of the replies' arrays (the sum over the number of replies under SecAgg+,
    which hands every result the unmasked mean) is kept in :attr:`mean`."""

    def __init__(self, fitins: dict[int, FitIns], summed: bool):
        self.fitins, self.summed = fitins, summed
        self.mean: list[np.ndarray] | None = None
        self.failures: list = []

    def initialize_parameters(self, client_manager) -> Parameters | None:
        return next(iter(self.fitins.values())).parameters

    def configure_fit(self, server_round, parameters, client_manager):
        proxies = client_manager.all().values()
        return [(p, self.fitins[p.node_id]) for p in proxies if p.node_id in self.fitins]

    def aggregate_fit(self, server_round, results, failures):
        self.failures = list(failures)
        if failures or not results:
            return None, {}
        if self.summed:                 # SecAgg+ gave every result the same unmasked mean
            mean = parameters_to_ndarrays(results[0][1].parameters)
        else:
            arrays = [parameters_to_ndarrays(r.parameters) for _, r in results]
            mean = [np.mean(np.stack(a), axis=0) for a in zip(*arrays, strict=True)]
        self.mean = mean
        return ndarrays_to_parameters(mean), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


def _no_evaluation(grid, context) -> None:
    """The workflow's federated evaluation: none (the scores travel as fnsysid's own
    ``evaluate`` messages)."""


def workflow_round(grid, settings, strategy, exchange: str, msg: dict, nodes: list[int],
                   timeout: float) -> dict[str, np.ndarray]:
    """The mean over ``nodes`` of their replies to ``msg`` in ``exchange``, each (S, ...),
    from one round of Flower's workflow (SecAgg+ and/or central DP, see the module); with
    central DP the mean carries the wrapper's noise. Raises
    :class:`~fnsysid.runtimes.check.FlowerError` when the round gives no mean."""

    keys = sorted(msg)
    params = ndarrays_to_parameters([np.ascontiguousarray(msg[k]) for k in keys])
    config = {"exchange": exchange, "keys": ",".join(keys), "reply": ",".join(REPLY)}
    fitins = {n: FitIns(params, dict(config)) for n in nodes}
    inner = MeanOfReplies(fitins, summed=secure(settings))
    outer: Strategy = inner
    if central_dp(settings):
        pv = strategy.privacy
        # the noise the wrapper adds to the mean, per coefficient (privacy.round_noise_sd)
        pv.round_noise(float(pv.noise_multiplier) * float(pv.clip) / len(nodes))
        outer = DifferentialPrivacyClientSideFixedClipping(
            inner, noise_multiplier=float(pv.noise_multiplier), clipping_norm=float(pv.clip),
            num_sampled_clients=len(nodes))
    fit = None
    if secure(settings):
        sa = settings.runtime.secagg
        fit = SecAggPlusWorkflow(num_shares=float(sa.num_shares),
                                 reconstruction_threshold=float(sa.reconstruction_threshold),
                                 max_weight=1.0, clipping_range=float(sa.clipping_range),
                                 quantization_range=int(sa.quantization_range),
                                 modulus_range=MODULUS, timeout=timeout)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}),
                            config=ServerConfig(num_rounds=1, round_timeout=timeout),
                            strategy=outer)
    DefaultWorkflow(fit_workflow=fit, evaluate_workflow=_no_evaluation)(grid, context)
    if inner.mean is None or inner.failures:
        what = f"the {'SecAgg+ ' if secure(settings) else ''}{exchange} exchange"
        why = why_failed(grid, nodes, timeout)
        raise FlowerError(f"{what} gave no aggregate: "
                          + ("; ".join(why) if why else "Flower's workflow halted (see its log)"))
    mean = outer_mean(context, inner)
    return dict(zip(REPLY, mean, strict=True))


def outer_mean(context: LegacyContext, inner: MeanOfReplies) -> list[np.ndarray]:
    """The round's result as the workflow left it (the wrapper's noisy mean under central DP,
    else the inner mean)."""
    record = context.state.array_records.get(MAIN_PARAMS_RECORD)
    if record is None:
        return inner.mean
    return parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, keep_input=True))


def why_failed(grid, nodes: list[int], timeout: float) -> list[str]:
    """The lines in which ``nodes`` say why their last workflow round failed (those that
    failed), asked with a ``query`` message that :func:`client_mod` answers."""
    msgs = [Message(RecordDict({WHY: ConfigRecord({})}), dst_node_id=n,
                    message_type=MessageType.QUERY) for n in nodes]
    lines = []
    for rep in grid.send_and_receive(msgs, timeout=timeout):
        if rep.has_error() or WHY not in rep.content.config_records:
            continue
        line = str(rep.content.config_records[WHY].get("line", ""))
        if line:
            lines.append(f"node {rep.metadata.src_node_id}: {line}")
    return sorted(lines)


# ---------------------------------------------------------------------------------------------
# client side


def client_mod(node):
    """The ClientApp's mod: a ``train`` message of Flower's workflow (not one of fnsysid's own)
    runs through Flower's ``secaggplus_mod`` (``runtime.secure_aggregation=true``) and
    ``fixedclipping_mod`` (``privacy=central``), in that order (the clipping acts on the
    reply before SecAgg+ masks it); fnsysid's own messages pass as they are. ``node``: the
    node's :class:`~fnsysid.runtimes.flower.ClientNode` for a context."""

    def mod(msg: Message, context: Context, call_next):
        if msg.metadata.message_type == MessageType.QUERY and WHY in msg.content.config_records:
            kept = context.state.config_records.get(WHY)
            return Message(RecordDict({WHY: ConfigRecord(dict(kept or {}))}), reply_to=msg)
        if (msg.metadata.message_type != MessageType.TRAIN
                or OWN in msg.content.array_records):
            return call_next(msg, context)
        settings = node(context).settings
        mods = ([secaggplus_mod] if secure(settings) else []) + \
            ([fixedclipping_mod] if central_dp(settings) else [])
        context.state.config_records[WHY] = ConfigRecord({"line": ""})
        try:
            return make_ffn(call_next, mods)(msg, context)
        except Exception as exc:        # kept for why_failed (a raise would drop the state)
            line = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            context.state.config_records[WHY] = ConfigRecord({"line": line})
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=line),
                           reply_to=msg)

    return mod


def client_fit(me, msg: Message) -> Message:
    """A client's reply to a fit message of Flower's workflow: its
    :meth:`~fnsysid.learning.strategies.Federated.client_update` arrays (without the client
    axis) as the FitRes's parameters, weight 1. Under SecAgg+ an entry outside
    ``[-clipping_range, clipping_range]`` (of the reply or of the server model it starts
    from) is refused in one line: Flower's quantizer would clip it and the sum be wrong. A
    failure's line is kept in the node's state by :func:`client_mod`."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    keys = str(fitins.config["keys"]).split(",")
    arrays = dict(zip(keys, parameters_to_ndarrays(fitins.parameters), strict=True))
    replies = me.strategy.client_update(str(fitins.config["exchange"]), arrays, me.clients)
    out = [np.ascontiguousarray(replies[k][:, 0]) for k in str(fitins.config["reply"]).split(",")]
    if secure(me.settings):
        c = float(me.settings.runtime.secagg.clipping_range)
        for name, a in (("reply", out), ("server model", [arrays["theta"]])):
            worst = max(float(np.max(np.abs(x), initial=0.0)) for x in a)
            if not worst <= c:
                raise ValueError(
                    f"runtime.secagg.clipping_range={c:g}: client {me.label}'s {name} has an "
                    f"entry of size {worst:.6g}, which SecAgg+ would clip (the sum would be "
                    "wrong); allowed: a runtime.secagg.clipping_range above it")
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(out), num_examples=1, metrics={})
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)
