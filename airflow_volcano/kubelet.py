"""What the kubelet does to the strings of a container, and how a DAG author's strings stay literal.

The kubelet expands `$(VAR)` in a container's command, args and env values with the container's
environment (`$$` stands for one `$`). A user's string would then change on the way: an argument
`$(HF_TOKEN)` becomes the secret's value in the process's argv (and in any log that prints it), and
a password `pa$$word` loses a `$`. So every string given to the operator as `command`, `args`,
`env` or `torchrun_options` is written with each `$` doubled, and reaches the process exactly as
given. `ExpandVars` marks a value in which the kubelet's expansion is wanted.
"""

from __future__ import annotations

from typing import Any


class ExpandVars:
    """A command, argument or env value in which the kubelet expands `$(VAR)` from the container's
    environment, as Kubernetes does by default (`$$` for a literal `$`); every other string given
    to the operator reaches the process exactly. Jinja-templated like the string it wraps.

        args=["--output", ExpandVars("/checkpoints/$(POD_NAME)")]

    :param value: the string, with `$(VAR)` references.
    """

    template_fields = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"ExpandVars({self.value!r})"

    def __str__(self) -> str:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpandVars) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def container_string(value: Any) -> str:
    """The string to write into a container's command, args or env so that the process gets `value`:
    as given for ExpandVars, else with every `$` doubled (the kubelet turns `$$` back into `$`)."""
    if isinstance(value, ExpandVars):
        return str(value.value)
    return str(value).replace("$", "$$")


def process_string(value: str) -> str:
    """What the process receives for a container string, `$(VAR)` references left as they are (their
    values are the pod's): the kubelet's `$$` -> `$`."""
    out, index = [], 0
    while index < len(value):
        if value.startswith("$$", index):
            out.append("$")
            index += 2
        else:
            out.append(value[index])
            index += 1
    return "".join(out)
