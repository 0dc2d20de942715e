"""The Flower apps of a deployment, the objects ``flwr run`` loads (``deploy/flower/``).

A node composes the run's config from the run config's ``overrides`` (checked as the command
line checks them), builds its objects once and answers with :mod:`fnsysid.runtimes.flower`'s
client side; the server runs :func:`fnsysid.runtimes.flower.serve` and writes the run's files.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fnsysid.app.build import build, build_client_app
from fnsysid.config.checks import ConfigError, check_run
from fnsysid.runtimes.flower import (
    FlowerError,
    deployed_overrides,
    quiet_flower,
    serve,
    server_dataset,
)

log = logging.getLogger("fnsysid")


def deployed_config(context: Context):
    """The run's config composed from the run config (:func:`~fnsysid.runtimes.flower.
    deployed_overrides`: ``overrides``, a string of ``run.py`` overrides such as ``"M=3
    strategy=scaffold"``, and the app's typed keys), checked as ``run.py`` checks it. With
    ``data=files`` the server needs no ``data.path``: the data are on the SuperNodes, and
    ``M`` (the SuperNodes to wait for) must then be given."""
    from fnsysid.app.api import compose

    overrides, on_nodes = deployed_overrides(context.run_config)
    cfg, _ = compose([*overrides, "progress=false"], data_in_memory=on_nodes)
    settings = check_run(cfg)
    if settings.M is None:
        raise ConfigError("M is missing: a deployed run with data=files waits for M "
                          "SuperNodes; allowed: M=<number of SuperNodes>, e.g. overrides="
                          "'data=files M=12 ...'")
    if settings.runtime.name == "flower":          # runtime=flower runtime.reply_timeout=...
        return settings
    return settings.replace(runtime={"name": "flower", "client_cpus": 1})


def log_to_console() -> None:
    """fnsysid's INFO lines (one per round, the results) on the ServerApp's stderr, which
    ``flwr run --stream`` shows, unless the process set up logging already."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def app_dir() -> Path:
    """The folder of the Flower app that ``flwr run`` submits: ``fnsysid/deploy/flower/`` of
    an installed wheel, else ``deploy/flower/`` of the repository (an editable install), as
    :data:`fnsysid.config.groups.CONF_DIR` finds ``conf/``; ``python -m
    fnsysid.app.flower_apps`` prints it."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / "deploy" / "flower"
    return shipped if shipped.is_dir() else package.parent / "deploy" / "flower"


server_app = ServerApp()


@server_app.main()
def deployed_main(grid: Grid, context: Context) -> None:
    """Server of a deployed run: waits for ``M`` SuperNodes, runs the rounds and writes the
    run's files into the run config's ``outdir`` (``summary.json`` says ``runtime: flower``).

    A SuperNode that fails or dies ends the run: the rounds every client evaluated are
    written with ``status: interrupted`` and the line naming the round and the node in
    ``error``, and the ServerApp then fails with that line (Flower marks the run failed).
    Every failure is logged as one line, ``fnsysid: error: <cause>``, and is the run's
    ``details`` that ``flwr ls`` shows (:mod:`fnsysid.app.flower_run` reads it)."""
    quiet_flower()
    log_to_console()
    try:
        _deployed_main(grid, context)
    except Exception as exc:            # one line naming the cause, then Flower's failure
        line = one_line_error(exc)
        log.error("fnsysid: error: %s", line)
        raise ServerAppError(line) from None


class ServerAppError(RuntimeError):
    """Why a deployed ServerApp failed, in one line (Flower records it as the run's
    ``details``: ``ServerApp failed with exception: <line>``)."""


def one_line_error(exc: BaseException) -> str:
    """The one line of an error: fnsysid's own errors as they are, others with their type."""
    from fnsysid.config.errors import one_line

    if isinstance(exc, (ConfigError, FlowerError, ValueError, OSError)):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return one_line(RuntimeError(text))


def _deployed_main(grid: Grid, context: Context) -> None:
    from fnsysid.app.experiment import make_result
    from fnsysid.results.files import write_outputs
    from fnsysid.results.history import keep_per_client

    t_start = time.perf_counter()
    cfg = deployed_config(context)
    model, _, strategy = build(cfg)
    M = cfg.M
    keep_clients = keep_per_client(cfg, M)
    hist, diverged, theta0, labels, failure = serve(grid, cfg, model, strategy, M,
                                                    keep_clients)
    out = Path(str(context.run_config.get("outdir", "outputs/flower")))
    if failure is not None and not hist.e_max:
        raise FlowerError(f"{failure}; no round finished, nothing written to {out}")
    dataset = server_dataset(cfg, labels)
    dataset.settings["repeats"] = theta0.shape[0]
    elapsed = time.perf_counter() - t_start
    choices = {"system": model.system.name, "data": cfg.data.source,
               "strategy": type(strategy).__name__.lower()}
    result = make_result(cfg, model, strategy, dataset, hist, diverged, theta0, None, None,
                         keep_clients, dict(data_s=0.0, train_s=elapsed, total_s=elapsed),
                         choices, failure)
    write_outputs(out, cfg, result)
    if failure is not None:
        raise FlowerError(f"{failure}; rounds 0 to {result.summary['rounds_completed']} "
                          f"written to {out.resolve()} (status: interrupted)")
    log.info("results: %s (final e_max %s)", out.resolve(), result.summary["final_e_max_mean"])


client_app = build_client_app()


if __name__ == "__main__":
    print(app_dir())
