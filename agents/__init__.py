"""GPU Portal node agent: runs on every GPU node, never imports Django."""

__version__ = "0.1.0"
