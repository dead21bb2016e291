"""The CSV cell rule (OWASP): formula starts are neutralised, numbers and plain text kept."""

import pytest

from portal.csv_cells import csv_cell


@pytest.mark.parametrize("text", ["=1+1", "+1+1", "-1+1", "@SUM(A1)", "\tx", "\rx", "-"])
def test_it_prefixes_a_cell_a_spreadsheet_would_run(text):
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize("value", ["alice", "-12", "-0.5", "3e-4", 7, -3.5, None, ""])
def test_it_keeps_plain_text_and_numbers(value):
    assert csv_cell(value) == value
