"""docs/FEDERATED.md as a test: the deployment's commands run as the guide gives them.

The bash blocks between the guide's two ``tests/test_guide.py`` comments run in order, each in
``bash -eu`` in one folder, on this machine: the first block (the shell variables) is replaced
by this test's values (the server reached at 127.0.0.2, its SuperLink listening on all of
the machine's addresses, free ports, folders of the test); every other block
runs as written, with ``I=<i>`` for the device block, once per device. The SuperLink and the
SuperNodes run in the background (each in a session of its own, stopped at the end with the
helper processes Flower starts for them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import needs_flower

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "FEDERATED.md"
START = "<!-- tests/test_guide.py runs the bash blocks"
END = "<!-- end of the commands tests/test_guide.py runs -->"
#: the variables of the guide's first block, the only ones this test sets
VARIABLES = ("SERVER", "LISTEN", "PORT", "NODE_PORT", "OUTDIR", "FLWR_HOME")


def guide_blocks() -> list[str]:
    """The bash blocks of the guide's tested part, in order."""
    text = GUIDE.read_text()
    part = text[text.index(START):text.index(END)]
    return re.findall(r"```bash\n(.*?)```", part, flags=re.S)


def test_the_guide_tested_part_sets_only_the_variables_this_test_replaces():
    """The block this test replaces holds the six variables and nothing else, and the run
    command of the guide gives no data.path (the server holds no data)."""
    blocks = guide_blocks()
    lines = [ln.split("#")[0].strip() for ln in blocks[0].splitlines()]
    names = [re.match(r"(?:export )?(\w+)=", ln).group(1) for ln in lines if ln]
    assert tuple(names) == VARIABLES
    run = [b for b in blocks if "fnsysid-flower-run" in b]
    assert len(run) == 1 and "data.path" not in run[0] and "data=files" in run[0]
    assert sum(b.lstrip().startswith("I=0") for b in blocks) == 1


def _free_port(n: int = 1) -> int:
    """A port p with p .. p+n-1 free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        socks = []
        try:
            for k in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free ports")


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, log.read_text()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


@needs_flower
@pytest.mark.flower
@pytest.mark.slow
def test_the_deployment_guide_runs_as_written(tmp_path):
    """Steps 1 to 5 of docs/FEDERATED.md on this machine (server at 127.0.0.2): TLS, node
    authentication, three SuperNodes on one host (one port each), a server without
    data.path; the run exits 0 and its errors equal the in-process run on the same files; a
    run the ServerApp refuses exits 1 with one line; no process of the deployment is
    left."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("flower_deploy",
                                                  ROOT / "scripts" / "flower_deploy.py")
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)

    work = tmp_path / "work"
    work.mkdir()
    for folder in ("scripts", "examples"):          # "in a clone of the repository"
        (work / folder).symlink_to(ROOT / folder)
    port, node_port = _free_port(), _free_port(3)
    # the devices and the workstation reach the server at another address than the
    # 127.0.0.1 of the SuperLink's own flower-superexec, as on real machines (all of 127/8
    # is this machine's loopback), so a certificate without 127.0.0.1 fails here too
    values = {"SERVER": "127.0.0.2", "LISTEN": "0.0.0.0", "PORT": str(port),
              "NODE_PORT": str(node_port), "OUTDIR": str(tmp_path / "results"),
              "FLWR_HOME": str(tmp_path / "flwr-home")}
    prelude = "".join(f"export {k}={v}\n" for k, v in values.items())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}"}
    env.pop("FLWR_HOME", None)
    blocks = guide_blocks()[1:]
    background: list[subprocess.Popen] = []
    outputs: list[str] = []

    def start(name: str, script: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["bash", "-euc", prelude + script], cwd=work, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        background.append(proc)
        return proc

    try:
        for block in blocks:
            first = block.split()[0]
            if first == "flower-superlink":
                proc = start("superlink", block)
                _wait_port(port, proc, tmp_path / "superlink.log")
            elif block.lstrip().startswith("I=0"):
                for i in range(3):
                    start(f"supernode{i}", block.replace("I=0", f"I={i}", 1))
            else:
                res = subprocess.run(["bash", "-euc", prelude + block], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=900)
                outputs.append(res.stdout)
                assert res.returncode == 0, f"{block}\n{res.stdout}\n{res.stderr}"
        run_out = next(o for o in outputs if "fnsysid: run " in o)
        assert "round 5 of 5 done: 3 of 3 clients answered" in run_out, run_out
        summary = json.loads((tmp_path / "results" / "summary.json").read_text())
        assert summary["status"] == "ok" and summary["runtime"] == "flower"
        assert summary["M"] == 3
        flower = pd.read_csv(tmp_path / "results" / "errors.csv")
        assert flower["e_max"].notna().all()

        # the same files in process (the truth files together)
        import fnsysid

        truth = pd.concat([pd.read_csv(f) for f in sorted((work / "fleet").glob("*_truth.csv"))])
        data = tmp_path / "data"
        data.mkdir()
        for f in (work / "fleet").glob("robot?.csv"):
            (data / f.name).symlink_to(f)
        truth.to_csv(tmp_path / "truth.csv", index=False, float_format="%.17g")
        inprocess = fnsysid.run(["system=synthetic", "data=files", f"data.path={data}",
                                 f"data.truth={tmp_path / 'truth.csv'}", "R=5",
                                 "strategy=fedavg", "output.plot=false"]).errors
        assert len(inprocess) == len(flower)
        for c in ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean"):
            np.testing.assert_allclose(flower[c], inprocess[c], rtol=0, atol=1e-10)

        # a run the ServerApp refuses (no M): exit 1, one line naming the cause
        bad = subprocess.run(
            ["bash", "-euc", prelude + "fnsysid-flower-run fleet --run-config "
             "\"overrides='system=synthetic data=files R=2' outdir='$OUTDIR-bad'\""],
            cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and re.match(r"fnsysid: error: run \d+ finished:failed: M is "
                                            r"missing: ", lines[0]), bad.stderr
        assert "Traceback" not in bad.stdout + bad.stderr
    finally:
        pids = [p.pid for p in background]
        for proc in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in background:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        marks = [f"127.0.0.{h}:{p}" for p in (port, node_port, node_port + 1, node_port + 2)
                 for h in (1, 2)]
        marks += [f"--parent-pid {p}" for p in pids]
        # a SuperLink's flower-superexec runs in a session of its own and leaves when it sees
        # its parent gone, which it checks now and then: it is given that time, then any
        # Flower process of this deployment still running is one it left behind
        t0 = time.monotonic()
        left = deploy.leftover(marks)
        while left and time.monotonic() - t0 < 30:
            time.sleep(0.5)
            left = [p for p in left if _alive(p)]
        for p in left:
            p.terminate()
    assert not left, [p.pid for p in left]


def _alive(proc) -> bool:
    """Whether the psutil process ``proc`` still runs (not exited, not a zombie)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
