"""The examples in the package's docstrings run and print what they say (``doctest``)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fnsysid"
#: every module of the package whose docstrings hold an example
MODULES = sorted(
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
    for p in PACKAGE.rglob("*.py") if ">>> " in p.read_text())


def test_the_examples_are_found():
    assert len(MODULES) >= 9 and "fnsysid.learning.optim" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if "flower" in name and importlib.util.find_spec("flwr") is None:
        pytest.skip("the flower extra is not installed")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    lines = [ln for ln in Path(module.__file__).read_text().splitlines() if ">>> " in ln]
    skipped = sum("doctest: +SKIP" in ln for ln in lines)
    assert result.attempted == len(lines) - skipped > 0 or skipped == len(lines)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
