"""``fnsysid-flower-run``: submit the Flower app with ``flwr run`` and exit with the run's status.

``flwr run --stream`` exits 0 even when the ServerApp fails (Flower 1.42). This command runs
it, shows fnsysid's own lines of the ServerApp's log as they arrive (one per round, the
results folder), then asks the SuperLink for the run's status with ``flwr ls --run-id
<id> --format json`` and exits 0 only when the run finished as ``completed``; otherwise it
prints one line, ``fnsysid: error: run <id> <status>: <cause>``, and exits 1 (``flwr run``
itself failing: its exit status)::

    fnsysid-flower-run fleet --run-config "overrides='data=files M=12 R=50' outdir='/srv/x'"

Everything ``flwr run`` prints goes to ``--log`` when given. ``--app``: the Flower app folder
(default: the one of the installed fnsysid, :func:`fnsysid.app.flower_apps.app_dir`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: the ServerApp's lines written by fnsysid (``[INFO] round 3 of 50 done: ...``); Flower's
#: own lines (``INFO :  ...``) and tracebacks go to ``--log`` only
OWN_LINE = re.compile(r"^\[(INFO|WARNING)\] ")
#: the line of ``flwr run`` that gives the run's id
STARTED = re.compile(r"Successfully started run (\d+)")
#: what Flower puts before a ServerApp's exception in the run's details
PREFIX = "ServerApp failed with exception: "


def flwr() -> str:
    """The ``flwr`` command next to this Python (a virtualenv's), else on PATH."""
    here = Path(sys.executable).parent / "flwr"
    return str(here) if here.exists() else (shutil.which("flwr") or "flwr")


def run_status(run_id: str, superlink: list[str], timeout: float) -> tuple[str, str]:
    """(status, details) of run ``run_id`` once it has finished (``flwr ls``), or the last
    status seen after ``timeout`` seconds."""
    t0, status, details = time.monotonic(), "unknown", ""
    while True:
        res = subprocess.run([flwr(), "ls", *superlink, "--run-id", run_id, "--format", "json"],
                             capture_output=True, text=True)
        try:
            runs = json.loads(res.stdout).get("runs") or []
        except json.JSONDecodeError:
            runs = []
        if runs:
            status, details = str(runs[0]["status"]), str(runs[0].get("status-details") or "")
            if status.startswith("finished"):
                return status, details
        elif res.returncode:
            details = " ".join((res.stdout + res.stderr).split())[:300]
        if time.monotonic() - t0 > timeout:
            return status, details
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    from fnsysid.app.flower_apps import app_dir

    ap = argparse.ArgumentParser(prog="fnsysid-flower-run", description=__doc__.splitlines()[0])
    ap.add_argument("superlink", nargs="?", help="the SuperLink connection of config.toml "
                    "(default: its default)")
    ap.add_argument("--run-config", "-c", action="append", default=[],
                    help="as flwr run's --run-config: overrides='...' outdir='...' or keys of "
                         "[tool.flwr.app.config]")
    ap.add_argument("--app", default=None, help="the Flower app folder (default: fnsysid's)")
    ap.add_argument("--log", default=None, help="file for everything flwr run prints")
    ap.add_argument("--status-timeout", type=float, default=60.0,
                    help="seconds to wait for the run's final status after the stream ends")
    args = ap.parse_args(argv)
    superlink = [args.superlink] if args.superlink else []
    cmd = [flwr(), "run", args.app or str(app_dir()), *superlink, "--stream"]
    for c in args.run_config:
        cmd += ["--run-config", c]
    log = open(args.log, "w") if args.log else None  # noqa: SIM115 - closed below
    run_id, said = None, []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        for line in proc.stdout:
            if log:
                log.write(line)
                log.flush()
            said.append(line.strip())
            if run_id is None and (hit := STARTED.search(line)):
                run_id = hit.group(1)
                print(f"fnsysid: run {run_id} started", flush=True)
            elif OWN_LINE.match(line):
                print(line.rstrip(), flush=True)
        code = proc.wait()
    finally:
        if log:
            log.close()
    if run_id is None:
        last = " ".join(ln for ln in said[-5:] if ln)[:400] or "no output"
        print(f"fnsysid: error: flwr run failed (exit {code or 1}): {last}", file=sys.stderr)
        return code or 1
    status, details = run_status(run_id, superlink, args.status_timeout)
    if status == "finished:completed":
        return 0
    cause = details[len(PREFIX):] if details.startswith(PREFIX) else details
    print(f"fnsysid: error: run {run_id} {status}: {cause or 'no details'}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
