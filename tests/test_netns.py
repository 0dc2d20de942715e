"""scripts/flower_deploy.py --netns: a deployment across network namespaces (one host each),
TLS and node authentication, a rogue device refused, a SuperNode killed and restarted."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fnsysid.runtimes import check as runtime

ROOT = Path(__file__).resolve().parent.parent
is_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and ip (iproute2)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_netns_is_refused_in_one_line_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as stop:
        _script("flower_deploy").main(["--netns", "--out", "/nonexistent/never"])
    assert str(stop.value) == ("flower_deploy: --netns needs root (it creates network "
                               "namespaces with ip netns); run it as root, or without --netns")
    assert not Path("/nonexistent/never").exists()


def _routes(nets, name: str) -> list[str]:
    out = subprocess.run(["ip", "-n", nets.ns(name), "route"], capture_output=True, text=True,
                         check=True)
    return out.stdout.splitlines()


@is_root
def test_namespaces_have_their_own_addresses_no_route_out_and_are_removed_on_error():
    netns = _script("flower_netns")
    mine = f"fnsysid{os.getpid()}-"
    with pytest.raises(RuntimeError, match="boom"), netns.Namespaces(["a", "b"]) as nets:
        assert nets.addr == {"a": "10.213.0.1", "b": "10.213.0.2"}
        assert sorted(n for n in netns.left_over() if n.startswith(mine)) == [
            f"{mine}a", f"{mine}b", f"{mine}bridge"]
        # only the private /24: no default route, so nothing can leave the namespaces
        assert [r.split()[0] for r in _routes(nets, "a")] == ["10.213.0.0/24"]
        # b listens on its address, a reaches it across the bridge
        server = subprocess.Popen(nets.cmd("b", [sys.executable, "-c", (
            "import socket; s = socket.create_server(('10.213.0.2', 9000)); "
            "print('up', flush=True); c, _ = s.accept(); c.sendall(b'hello'); c.close()")]),
            stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline() == "up\n"
        got = subprocess.run(nets.cmd("a", [sys.executable, "-c", (
            "import socket; print(socket.create_connection(('10.213.0.2', 9000), 5)"
            ".recv(5).decode())")]), capture_output=True, text=True, timeout=30)
        assert got.stdout == "hello\n"
        server.wait(timeout=30)
        raise RuntimeError("boom")
    assert [n for n in netns.left_over() if n.startswith(mine)] == []


@pytest.mark.flower
@pytest.mark.slow
@is_root
@pytest.mark.skipif(not runtime.flower_installed() or shutil.which("nginx") is None,
                    reason="needs the flower extra and nginx")
def test_netns_deployment_refuses_a_rogue_device_survives_a_killed_node_and_matches(tmp_path):
    """Three SuperNodes and the SuperLink on hosts of their own (network namespaces), TLS
    and node authentication: a device with ca.crt and a key of its own can neither register
    the key nor submit a run; SuperNode 1 killed after round 1 stops the run, named with its
    round; restarted, the next run agrees with the in-process one to 1e-10; no namespace is
    left."""
    deploy, netns = _script("flower_deploy"), _script("flower_netns")
    mine = f"fnsysid{os.getpid()}-"
    try:
        report = deploy.main(["--netns", "--out", str(tmp_path), "system=synthetic", "R=3",
                              "repeats=2"])
    finally:
        assert [n for n in netns.left_over() if n.startswith(mine)] == []
    assert report["max_abs_diff"] <= 1e-10 and report["tls"] and report["netns"]
    fleet, link = report["rogue"]["fleet port 9092"], report["rogue"]["link port 9093"]
    assert fleet["reaches"] and not link["reaches"]   # the port it may use, the one it may not
    for what in ("register", "run"):
        assert fleet[what][0] not in (0, None) and "403 Forbidden" in fleet[what][1]
        assert link[what][0] not in (0, None)
    assert report["rogue_refused"] and report["registered_nodes"] == 3
    access = (tmp_path / "nginx" / "nginx-access.log").read_text().splitlines()
    rogue = [line for line in access if line.startswith(report["addresses"]["rogue"] + " ")]
    control = [line for line in rogue if "/v1/control/" in line]
    assert [line.split('"')[1] for line in control] == [
        "POST /v1/control/register-node HTTP/1.1", "POST /v1/control/start-run HTTP/1.1"]
    assert all('" 403 ' in line for line in control)
    # its SuperNode with an unregistered key reached the Fleet API and got no 200
    fleet_calls = [line for line in rogue if "/v1/fleet/" in line]
    assert fleet_calls and not [line for line in fleet_calls if '" 200 ' in line]
    assert report["rogue"]["supernode"][0] != 0
    killed = report["killed"]
    assert (killed["supernode"], killed["after_round"], killed["status"]) == (1, 1,
                                                                              "interrupted")
    # "round 3: SuperNode ... (client 1) failed on train: ..." (or "the evaluation after
    # round 3: ...", when the last exchange is the one that misses the node)
    assert re.match(r"(the evaluation after )?round [23]: SuperNode \d+ \(client 1\) failed "
                    r"on (train|evaluate): ", killed["error"]), killed["error"]
    assert killed["client"] == "1"
    assert 1 <= killed["rounds_completed"] < 3
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["rounds_completed"] == 3


@pytest.mark.flower
@pytest.mark.slow
@is_root
@pytest.mark.skipif(not runtime.flower_installed() or shutil.which("nginx") is None,
                    reason="needs the flower extra and nginx")
def test_ctrl_c_during_the_netns_deployment_removes_every_namespace(tmp_path):
    """Ctrl-C (SIGINT) once the SuperNodes run: the command ends, and its namespaces (with
    their veth pairs and every process in them) are gone."""
    import signal
    import time

    netns = _script("flower_netns")
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "flower_deploy.py"),
                             "--netns", "--out", str(tmp_path), "system=synthetic", "R=3",
                             "repeats=2"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    mine = f"fnsysid{proc.pid}-"
    try:
        t0 = time.monotonic()
        while not (tmp_path / "supernode2.log").exists() and time.monotonic() - t0 < 300:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        assert len([n for n in netns.left_over() if n.startswith(mine)]) == 6
        pids = subprocess.run(["ip", "netns", "pids", f"{mine}superlink"],
                              capture_output=True, text=True).stdout.split()
        assert pids                                 # the SuperLink (and nginx) run there
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert [n for n in netns.left_over() if n.startswith(mine)] == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
