"""The `argument-table` directive: an operator's (or the sensor's) arguments as a table, read from the
class itself, never written by hand.

Its rows come from argument_rows.py (what each argument is, and where that is read from). An argument
without doc text is a warning, so `make docs` (-W) fails on it.

In a Markdown page::

    ```{argument-table} airflow_volcano.operators.pytorch.VolcanoPyTorchJobOperator
    ```
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from argument_rows import PACKAGE, Argument, anchor, arguments, import_object, refused
from docutils import nodes
from docutils.parsers.rst import Parser
from docutils.utils import new_document
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


HEADER = ("argument", "lands in the Job", "meaning")
WIDTHS = (30, 20, 50)


def row(cls: type, argument: Argument) -> tuple[str, ...]:
    """The row's cells after the argument's name, as reST text: its type, default and templating; where it
    lands; its text (and the class declaring it, when a base class does)."""
    facts = [f"``{argument.annotation}``" if argument.annotation else "", f"default ``{argument.default}``"]
    if argument.templated:
        facts.append("**T** (templated)")
    source = f" (from {argument.declared_in})" if argument.declared_in != cls.__name__ else ""
    return ("\n\n".join(fact for fact in facts if fact), argument.lands, argument.doc + source)


class ArgumentTable(SphinxDirective):
    """`.. argument-table:: package.module.Class` (in Markdown: a `{argument-table}` fence). The page may be
    Markdown, so the cells are parsed as reST on their own (the docstrings' markup) and the table built here."""

    required_arguments = 1
    has_content = False

    def rst(self, text: str) -> list[nodes.Node]:
        document = new_document(self.arguments[0], self.state.document.settings)
        # The docstrings write `name` for code (conf.py's default_role, which a document of its own lacks).
        Parser().parse(re.sub(r"(?<![`:])`([^`]+)`(?!`)", r"``\1``", text), document)
        return list(document.children)

    def run(self) -> list[nodes.Node]:
        path = self.arguments[0]
        try:
            cls = import_object(path)
        except (ImportError, AttributeError) as error:
            logger.warning("argument-table: cannot import %s: %s", path, error, location=self.get_location())
            return []
        # The table is read from the source of these classes (and the declarations' `lands`): an incremental
        # build rereads the page when one of them changes, as after regenerating the signatures.
        sources = {inspect.getsourcefile(klass) for klass in cls.__mro__ if klass.__module__.startswith(PACKAGE)}
        sources.add(inspect.getsourcefile(importlib.import_module("airflow_volcano.manifest.request")))
        for source in sorted(filter(None, sources)):
            self.env.note_dependency(source)
        table = nodes.table(classes=["argument-table"])
        group = nodes.tgroup(cols=len(HEADER))
        table += group
        group += [nodes.colspec(colwidth=width) for width in WIDTHS]
        head, body = nodes.thead(), nodes.tbody()
        head += nodes.row("", *(nodes.entry("", nodes.paragraph(text=title)) for title in HEADER))
        group += [head, body]
        for argument in arguments(cls):
            if not argument.doc:
                logger.warning("argument-table: %s.%s has no :param line in the class docstrings along its MRO",
                               cls.__name__, argument.name, location=self.get_location())
            facts, lands, doc = row(cls, argument)
            name = nodes.paragraph("", "", nodes.strong("", "", nodes.literal(text=argument.name)),
                                   ids=[anchor(cls, argument.name)])
            body += nodes.row("", nodes.entry("", name, *self.rst(facts)), nodes.entry("", *self.rst(lands)),
                              nodes.entry("", *self.rst(doc)))
        result: list[nodes.Node] = [table]
        if refused(cls):
            result += self.rst("Not taken by this class (it builds them itself, or they have no meaning here): "
                               + ", ".join(f"``{name}``" for name in refused(cls)) + ".")
        return result


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("argument-table", ArgumentTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
