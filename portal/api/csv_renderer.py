"""text/csv for list answers (`?format=csv` or `Accept: text/csv`), e.g. the accounting report."""

import io

from rest_framework.renderers import BaseRenderer

from portal.csv_cells import csv_dict_writer


class CsvRenderer(BaseRenderer):
    """A list of flat objects as CSV with a header row; an error answer as its JSON text.

    With no rows the header comes from the view's `csv_columns`, so an empty period is still a
    CSV a spreadsheet or script can read."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        rows = data.get("results") if isinstance(data, dict) and "results" in data else data
        if not isinstance(rows, list):  # an error shape: keep it readable
            import json

            return json.dumps(data).encode()
        out = io.StringIO()
        view = (renderer_context or {}).get("view")
        columns = list(rows[0]) if rows else getattr(view, "csv_columns", None)
        if columns:
            csv_dict_writer(out, columns).writerows(rows)
        return out.getvalue().encode()
