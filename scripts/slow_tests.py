"""Which tests of the fast suite are slow: the rule that keeps ``make test`` near 40 s.

A test function is marked ``@pytest.mark.slow`` when the mean time of its cases (setup, call
and teardown, as ``pytest --durations=0`` reports them; a module-scoped fixture's setup counts
to the first test that uses it) is above 0.3 s on a quiet 2-core machine. The slow tests run
in ``make test-slow-core`` (CI runs it after ``make test``), so marking a test slow drops no
check from CI. A test's time varies by about 0.1 s from run to run, marking the first user
of a shared fixture hands the fixture's setup to the next one, and the first test of a worker
that imports a large library (``scipy.stats``, scikit-learn) carries the import, 0.3-0.7 s,
which the worker pays once whichever test comes first. So the check has a margin:
``python scripts/slow_tests.py`` runs ``make test``'s command with ``--durations=0
--durations-min=0`` (every phase of every test, so that each case is counted) and lists the
test functions of the fast suite whose cases take more than ``--limit`` seconds (0.75) on
average, slowest first; it exits 1 if there are any. ``--from FILE`` reads the output of
such a run instead of running the suite (without ``--durations-min=0`` pytest hides the
phases under 0.005 s, and a function's fast cases would not be counted).

The shared sweep of ``tests/test_sweep.py`` (``two_key_sweep``, about 2 s) stays in the fast
suite on purpose, so that ``make test`` runs one multirun sweep end to end: it is listed as
``kept`` and does not count.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a line of ``--durations=0``: seconds, phase, node id
LINE = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S.*?)\s*$")
#: tests kept in the fast suite whatever their time (see the module's docstring)
KEPT = {"tests/test_sweep.py::test_results_csv_one_row_per_job_and_round_one_column_per_swept_key"}


def function_times(text: str) -> tuple[Counter, Counter]:
    """Seconds and number of cases of each test function (parameters together) in the output
    of ``pytest --durations=0``: a case is a test id with a line of any phase."""
    seconds: Counter = Counter()
    ids: dict[str, set] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            function = m.group(3).split("[")[0]
            seconds[function] += float(m.group(1))
            ids.setdefault(function, set()).add(m.group(3))
    return seconds, Counter({f: len(v) for f, v in ids.items()})


def over(seconds: Counter, cases: Counter, limit: float) -> list[tuple[str, float, int]]:
    """The functions whose mean seconds per case exceed ``limit``, slowest first."""
    rows = [(f, s, max(cases[f], 1)) for f, s in seconds.items() if s / max(cases[f], 1) > limit]
    return sorted(rows, key=lambda r: -r[1] / r[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=0.75,
                        help="seconds per case above which a test is slow (default 0.75)")
    parser.add_argument("--from", dest="path", type=Path,
                        help="read the output of `pytest --durations=0` from this file")
    args = parser.parse_args(argv)
    if not args.limit > 0:
        parser.error(f"--limit must be a positive number of seconds, got {args.limit}")
    if args.path is not None:
        try:
            text = args.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"slow_tests.py: error: --from {args.path}: cannot be read "
                  f"({exc.strerror if isinstance(exc, OSError) else exc})", file=sys.stderr)
            return 2
    else:
        command = [sys.executable, "-m", "pytest", "-q", "-n", "auto", "--dist", "loadfile",
                   "-p", "no:cacheprovider", "--durations=0", "--durations-min=0"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "FNSYSID_TEST_FLOWER": "0"})
        text = done.stdout
        print(text.strip().splitlines()[-1] if text.strip() else done.stderr.strip())
        if done.returncode != 0:
            print("the fast suite did not pass; its durations are not judged", file=sys.stderr)
            return done.returncode
    seconds, cases = function_times(text)
    if not seconds:
        print("no durations found (was pytest run with --durations=0?)", file=sys.stderr)
        return 2
    slow = [(f, s, n) for f, s, n in over(seconds, cases, args.limit)]
    found = 0
    for function, s, n in slow:
        kept = function in KEPT
        found += not kept
        print(f"{s / n:6.2f} s per case, {n:3d} case(s){'  kept' if kept else ''}  {function}")
    print(f"{sum(seconds.values()):.1f} s in all; {found} function(s) over {args.limit} s per case "
          "to mark @pytest.mark.slow")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
