"""errors_problem: a well-formed errors.csv passes; each kind of damage is named."""

import pytest

from fnsysid.results.folder import errors_problem

HEADER = "repeat,round,e_max,e_mean"
ROWS = ["0,0,0.5,0.25", "0,1,1e-05,", "0,2,nan,inf", "1,0,-0.5,+2.5E+300", "1,1,0.1,0.2",
        "1,2,3,4"]
SUMMARY = {"rounds_completed": 2, "repeats": 2}


def _problem(tmp_path, rows, end="\n"):
    (tmp_path / "errors.csv").write_bytes((end.join([HEADER, *rows]) + end).encode())
    return errors_problem(tmp_path, SUMMARY)


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_a_well_formed_table_has_no_problem(tmp_path, end):
    assert _problem(tmp_path, ROWS, end) is None


@pytest.mark.parametrize(("line", "text", "problem"), [
    (2, "00,2,nan,inf", "errors.csv: line 4 is not the row of repeat 0, round 2 with 4 fields"),
    (1, "0,1,1e-05", "errors.csv: line 3 is not the row of repeat 0, round 1 with 4 fields"),
    (4, "1,1,0.1,0.2,", "errors.csv: line 6 is not the row of repeat 1, round 1 with 4 fields"),
    (0, "0,1,0.5,0.25", "errors.csv: line 2 is not the row of repeat 0, round 0 with 4 fields"),
    (3, "1,0,x,2", "errors.csv holds 'x', not a number"),
    (5, "1,2,3,\u00e9", "errors.csv holds '\u00e9', not a number"),
])
def test_each_damaged_line_is_named(tmp_path, line, text, problem):
    rows = list(ROWS)
    rows[line] = text
    assert _problem(tmp_path, rows) == problem


def test_a_field_moved_between_two_lines_is_found(tmp_path):
    """Same number of commas in all, one line short of a field and the next one over."""
    rows = list(ROWS)
    rows[1], rows[2] = "0,1,1e-05", "0,2,nan,inf,"
    assert _problem(tmp_path, rows) == ("errors.csv: line 3 is not the row of repeat 0, "
                                        "round 1 with 4 fields")
