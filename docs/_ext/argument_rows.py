"""An operator's (or the sensor's) arguments, read from the class itself: what the docs' argument tables
(argument_tables.py, the Sphinx directive) show, and what the tests compare with the classes. No Sphinx or
docutils here: the unit tests import it in every Airflow release's venv, which has neither.

For each argument of `inspect.signature(cls.__init__)` along the MRO (self and **kwargs left out): its
annotation and default, whether the class templates it (`cls.template_fields`), where it lands in the Job (the
`lands` metadata of `airflow_volcano.manifest.request.JobRequest`'s field of that name) and its text, from the
`:param name:` lines of the class docstrings along the MRO (the nearest class's wins). Parameters of classes
outside this package (Airflow's DecoratedOperator) are listed only when one of ours documents them. A
subclass's `refused_arguments` are arguments it does not take (it refuses them): they are left out of its
table and named under it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any

PACKAGE = "airflow_volcano"
PARAM = re.compile(r"^:param (\w+):(.*)$")


@dataclass(frozen=True)
class Argument:
    name: str
    annotation: str
    default: str
    templated: bool
    lands: str
    doc: str
    declared_in: str


def import_object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def param_docs(cls: type) -> dict[str, str]:
    """`:param name: text` of this package's class docstrings along the MRO (continuation lines joined),
    the nearest class's first. Airflow's own classes (BaseOperator, ...) are not read."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith(PACKAGE):
            continue
        lines = inspect.cleandoc(vars(klass).get("__doc__") or "").splitlines()
        current: str | None = None
        found: dict[str, list[str]] = {}
        for line in lines:
            match = PARAM.match(line)
            if match:
                current = match.group(1)
                found[current] = [match.group(2).strip()]
            elif current is not None and line.startswith((" ", "\t")) and line.strip():
                found[current].append(line.strip())
            else:
                current = None
        for name, parts in found.items():
            docs.setdefault(name, " ".join(parts))
    return docs


def landings() -> dict[str, str]:
    """argument -> where it lands in the Job, from JobRequest's field metadata."""
    from airflow_volcano.manifest.request import JobRequest

    where = {"job": "Job spec", "pod": "pod spec", "container": "container"}
    return {item.name: ", ".join(f"{where.get(lands.where, lands.where)} ``{lands.key}``"
                                 for lands in item.metadata.get("lands") or ())
            for item in dataclasses.fields(JobRequest)}


def _annotation(parameter: inspect.Parameter) -> str:
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def computed_defaults(init: Any) -> dict[str, str]:
    """parameter -> the source of its default, for defaults computed by a call when the module is imported
    (`deferrable`'s reads `[operators] default_deferrable`): their value would be the docs builder's."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return {}
    function = tree.body[0]
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return {}
    args = function.args
    pairs = [*zip(args.args[len(args.args) - len(args.defaults):], args.defaults, strict=True),
             *((arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default)]
    return {arg.arg: ast.unparse(default) for arg, default in pairs if isinstance(default, ast.Call)}


def _default(parameter: inspect.Parameter, computed: dict[str, str]) -> str:
    if parameter.default is inspect.Parameter.empty:
        return "required"
    if parameter.name in computed:
        return computed[parameter.name]
    value = parameter.default
    return repr(value.value if hasattr(value, "value") and type(value).__module__.startswith(PACKAGE) else value)


def arguments(cls: type) -> list[Argument]:
    """Every argument `cls` takes, the class's own first, then its bases' (each declared once: the
    nearest class's signature wins); `refused_arguments` (refused by the class) left out."""
    docs, lands = param_docs(cls), landings()
    templated = set(getattr(cls, "template_fields", ()))
    refused = set(getattr(cls, "refused_arguments", ()))
    found: dict[str, Argument] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        ours = klass.__module__.startswith(PACKAGE)
        computed = computed_defaults(init) if ours else {}
        for parameter in inspect.signature(init).parameters.values():
            if parameter.name == "self" or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue
            if parameter.name in found or parameter.name in refused or (not ours and parameter.name not in docs):
                continue
            found[parameter.name] = Argument(
                name=parameter.name, annotation=_annotation(parameter), default=_default(parameter, computed),
                templated=parameter.name in templated, lands=lands.get(parameter.name, ""),
                doc=docs.get(parameter.name, ""), declared_in=klass.__name__)
    return list(found.values())


def refused(cls: type) -> list[str]:
    """The arguments a base class takes that `cls` refuses (its `refused_arguments`)."""
    return sorted(getattr(cls, "refused_arguments", ()))


def anchor(cls: type, name: str) -> str:
    """The id of an argument's row: `volcanopytorchjoboperator-worker-replicas` (a link target for the docs)."""
    return f"{cls.__name__.lstrip('_').lower()}-{name.replace('_', '-')}"
