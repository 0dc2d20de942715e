"""What the Flower runtime's messages carry, measured (``summary.json``'s
``communication.measured``, beside the figures the strategy declares).

:func:`fnsysid.runtimes.flower.exchange` hands every message it sends and the reply to it
to :func:`record`; :func:`fnsysid.runtimes.flower.serve` starts a count with :func:`start`
and ends it with :func:`summary`. Each array of a message's ``arrays`` record is counted
twice, with Flower's public record API: its numbers (``prod(shape)`` times the dtype's item
size, what the declared figures count) and Flower's own ``ArrayRecord.count_bytes()`` (each
array's serialized bytes, NumPy's header included, plus its key). Configs (exchange name,
round) are not counted.

Arrays are sorted by what they are for:

- the algorithm (``start``: the ``query`` exchange before round 1; ``round``: the strategy's
  exchanges; ``end``: the requests of ``personalize`` after the last round and the
  statistics sent for ``personalize=auto``), the part the declared figures count;
- ``evaluation``: the scores a client sends of the models it receives (arrays named ``_*``,
  ``evaluate`` messages, the personalized models sent back for ``client_estimates.csv``, the
  model check's statistics after the last round);
- ``control``: the sample counts ``n`` of the first query and the participation mask
  ``active`` of partial participation.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

#: the running count (one ServerApp per process)
_count: dict | None = None

#: the exchanges after the last round whose requests and replies both serve the algorithm
_ALGORITHM_END = ("personalize_stats",)


def start() -> None:
    """Start a new count (at the start of a server's rounds)."""
    global _count
    _count = defaultdict(float)


def _stage(message) -> str:
    kind = message.metadata.message_type
    if kind == "query":
        return "start"
    if kind == "evaluate":
        return "evaluation"
    config = message.content.config_records.get("config") or {}
    name = str(config.get("exchange", ""))
    if name.startswith("personalize"):
        return "end"
    if name == "model_check":              # a diagnostic of the model, like the scores
        return "evaluation"
    return "round"


def _add(record, stage: str, way: str, reply_of: str | None = None) -> None:
    """Count the arrays of ``record`` (an ArrayRecord) sent ``way`` at ``stage``."""
    if record is None:
        return
    for key, array in record.items():
        if stage == "evaluation" or key.startswith("_") or (
                reply_of is not None and reply_of.startswith("personalize")
                and reply_of not in _ALGORITHM_END):
            part = "evaluation"
        elif key in ("n", "active"):
            part = "control"
        else:
            part = stage
        numbers = math.prod(array.shape) * np.dtype(array.dtype).itemsize
        _count[f"{part}.{way}"] += numbers
        _count[f"{part}.{way}.serialized"] += len(array.data) + len(key)
        _count[f"{part}.{way}.arrays"] += 1
    if stage != "evaluation":
        _count[f"{stage}.{way}.messages"] += 1


def record(messages: list, replies: list) -> None:
    """Count the messages one exchange sent and their replies' contents (RecordDicts), in
    the same order; nothing unless a count was started."""
    if _count is None:
        return
    for msg, reply in zip(messages, replies, strict=True):
        stage = _stage(msg)
        config = msg.content.config_records.get("config") or {}
        name = str(config.get("exchange", "")) or None
        _add(msg.content.array_records.get("arrays"), stage, "down")
        _add(reply.array_records.get("arrays"), stage, "up", name)


def summary(repeats: int, clients: int) -> dict:
    """The count so far, per repeat (a message carries the arrays of all ``repeats``): bytes
    of the algorithm's arrays up and down (``up_total``, ``down_total``, ``per_client_total``
    over ``clients``), the same by stage, Flower's serialized bytes (``count_bytes``) and the
    evaluation and control traffic apart. Ends the count (later exchanges are not counted
    until the next :func:`start`)."""
    global _count
    c, _count = _count or {}, None

    def per_repeat(key: str) -> float:
        v = c.get(key, 0.0) / repeats
        return int(v) if float(v).is_integer() else v

    up = sum(per_repeat(f"{s}.up") for s in ("start", "round", "end"))
    down = sum(per_repeat(f"{s}.down") for s in ("start", "round", "end"))
    return {
        "how": "sum of the arrays' numbers (shape x item size) in the messages sent, per "
               "repeat; serialized: Flower's ArrayRecord.count_bytes() (NumPy headers and "
               "keys included)",
        "up_total": up, "down_total": down, "per_client_total": (up + down) / clients,
        **{f"{s}_{w}": per_repeat(f"{s}.{w}") for s in ("start", "round", "end")
           for w in ("up", "down")},
        "messages": int(sum(c.get(f"{s}.{w}.messages", 0) for s in ("start", "round", "end")
                            for w in ("up", "down"))),
        "serialized_up_total": sum(per_repeat(f"{s}.up.serialized")
                                   for s in ("start", "round", "end")),
        "serialized_down_total": sum(per_repeat(f"{s}.down.serialized")
                                     for s in ("start", "round", "end")),
        "evaluation_up": per_repeat("evaluation.up"),
        "evaluation_down": per_repeat("evaluation.down"),
        "control_up": per_repeat("control.up"),
        "control_down": per_repeat("control.down"),
    }
