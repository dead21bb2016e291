"""Serve plotly.js from the plotly Python package: no CDN, no copy of it in the repository."""

import os

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DIR = os.path.join(os.path.dirname(plotly.__file__), "package_data")
PLOTLY_FILE = "plotly.min.js"
PREFIX = "vendor/plotly"


class PlotlyFinder(BaseFinder):
    """Finds exactly one file, vendor/plotly/plotly.min.js (not the package's data sets)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=PLOTLY_DIR)
        self.storage.prefix = PREFIX

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path == f"{PREFIX}/{PLOTLY_FILE}":
            found = os.path.join(PLOTLY_DIR, PLOTLY_FILE)
            return [found] if find_all else found
        return [] if find_all else None

    def list(self, ignore_patterns):
        yield PLOTLY_FILE, self.storage
