"""Sphinx configuration of the airflow-volcano docs (`make docs`): Markdown pages (myst-parser), the API
reference from the docstrings (autodoc, autosummary over the whole package), and the argument tables
generated from the operators themselves (_ext/argument_tables.py)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS / "_ext"), str(DOCS.parent)]

project = "airflow-volcano"
author = "The airflow-volcano authors"
copyright = "The airflow-volcano authors, Apache License 2.0"
# The version's one place is pyproject.toml (the package reads its own from the installed metadata).
release = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["version"]
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "argument_tables",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_templates"]
templates_path = ["_templates"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4
# Docstrings write `name` for code, as the argument tables show it.
default_role = "literal"

autosummary_generate = True
# The sitecustomize the training pods run with stall_timeout: importing it registers a signal handler and
# writes files beside it. Package data, not an API: never imported here (so left out of the reference).
autosummary_mock_imports = ["airflow_volcano.shell.stack_dumps"]
# A package's page documents what it defines, not what it re-exports (documented where defined).
autodoc_default_options = {"members": True, "show-inheritance": True, "member-order": "bysource",
                           "ignore-module-all": True}
autodoc_typehints = "signature"
# Nitpicky (-n) for this package's own references; Airflow's, Kubernetes' and the standard library's
# types cannot be resolved without intersphinx, which needs the network.
# A TypeVar (`T`) and a private base class (`_VolcanoLink`) have no page of their own either.
nitpick_ignore_regex = [(r"py:.*", r"(?!airflow_volcano\.).*"), (r"py:.*", r"airflow_volcano\..*\.(T|_\w+)")]

html_theme = "furo"
html_title = f"airflow-volcano {release}"
html_static_path = ["_static"]
html_css_files = ["argument-table.css"]
