"""The one way the portal writes CSV: every cell a spreadsheet could run as a formula is
neutralised (OWASP's CSV injection rule).

A text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading
single quote, so Excel, LibreOffice and Google Sheets show it as text. Usernames, node models
and details in the audit log and the accounting report come from users and nodes, so every
export goes through `csv_dict_writer`.
"""

import csv
import re

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def csv_cell(value):
    """The value as it may stand in a CSV cell: a formula-like text is prefixed with `'`; a
    plain number (a negative one included) is left as it is."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    if _NUMBER.fullmatch(value):
        return value
    return "'" + value


class SafeDictWriter(csv.DictWriter):
    """csv.DictWriter whose every cell goes through csv_cell."""

    def writerow(self, rowdict):
        return super().writerow({k: csv_cell(v) for k, v in rowdict.items()})

    def writerows(self, rowdicts):
        for row in rowdicts:
            self.writerow(row)


def csv_dict_writer(out, fieldnames) -> SafeDictWriter:
    """A writer for rows of dicts with a header row; header names are neutralised too."""
    writer = SafeDictWriter(out, fieldnames=list(fieldnames), lineterminator="\n")
    writer.writer.writerow([csv_cell(name) for name in writer.fieldnames])
    return writer
