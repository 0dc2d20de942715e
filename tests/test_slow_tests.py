"""scripts/slow_tests.py: the rule that says which tests belong to the slow suite."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = runpy.run_path(str(ROOT / "scripts" / "slow_tests.py"))

DURATIONS = """\
============================= slowest durations ==============================
2.10s setup    tests/test_a.py::test_shared_fixture_user
0.40s call     tests/test_a.py::test_cases[1]
0.30s call     tests/test_a.py::test_cases[2]
0.20s setup    tests/test_a.py::test_cases[2]
0.05s call     tests/test_a.py::test_shared_fixture_user
0.90s call     tests/test_b.py::test_one
0.10s teardown tests/test_b.py::test_one
(300 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_times_add_the_phases_and_the_cases_of_a_function():
    seconds, cases = SCRIPT["function_times"](DURATIONS)
    assert seconds["tests/test_a.py::test_cases"] == pytest.approx(0.9)
    assert cases["tests/test_a.py::test_cases"] == 2
    assert seconds["tests/test_a.py::test_shared_fixture_user"] == pytest.approx(2.15)
    assert seconds["tests/test_b.py::test_one"] == pytest.approx(1.0)
    # mean per case: 0.45, 2.15 and 1.0 s
    over = SCRIPT["over"](seconds, cases, 0.5)
    assert [f for f, _, _ in over] == ["tests/test_a.py::test_shared_fixture_user",
                                       "tests/test_b.py::test_one"]
    assert [f for f, _, _ in SCRIPT["over"](seconds, cases, 0.4)][-1] == \
        "tests/test_a.py::test_cases"


def test_the_check_fails_on_a_slow_test_and_passes_without_one(tmp_path, capsys):
    path = tmp_path / "durations.txt"
    path.write_text(DURATIONS)
    assert SCRIPT["main"](["--from", str(path), "--limit", "0.75"]) == 1
    out = capsys.readouterr().out
    assert "2 function(s) over 0.75 s" in out and "test_cases" not in out
    assert SCRIPT["main"](["--from", str(path), "--limit", "3"]) == 0
    path.write_text("no durations here\n")
    assert SCRIPT["main"](["--from", str(path)]) == 2
    assert SCRIPT["main"](["--from", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("slow_tests.py: error: --from ") and "cannot be read" in err[-1]
