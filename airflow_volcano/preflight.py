"""Check a deployment before its first DAG does: `python -m airflow_volcano.preflight`.

Run it where the tasks run (a worker, the triggerer), with the Airflow connection they use: it loads
the connection, asks its apiserver for its version, whether Volcano's resources are served, whether
the connection's identity may do what the provider does in the namespace (deploy/rbac.yaml, asked as
SelfSubjectAccessReviews: nothing is created), and whether the queue is there and open. Each line says
what was found and, when something is missing, what to do; the exit code is 1 if anything required is.

    python -m airflow_volcano.preflight [--conn-id kubernetes_default] [--namespace ml] [--queue default]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_volcano.constants import (
    JOB_GROUP,
    JOB_PLURAL,
    JOB_VERSION,
    PODGROUP_GROUP,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
)
from airflow_volcano.exceptions import KubernetesConnectionError, VolcanoApiError

# What deploy/rbac.yaml grants, as (API group, resource, verbs); tests/unit/test_preflight.py holds the
# two to each other.
REQUIRED_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (JOB_GROUP, JOB_PLURAL, ("create", "get", "list", "watch", "delete", "patch")),
    (PODGROUP_GROUP, PODGROUP_PLURAL, ("get", "list")),
    ("", "pods", ("get", "list", "watch", "delete", "patch")),
    ("", "pods/log", ("get",)),
    ("", "events", ("list",)),
    ("", "configmaps", ("create", "get", "update", "delete")),
)
# Volcano's resources the provider uses: (API group, version, resource).
VOLCANO_RESOURCES = ((JOB_GROUP, JOB_VERSION, JOB_PLURAL), (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL),
                     (QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL))


@dataclass(frozen=True)
class Finding:
    """One check's result: `level` is ok, warn (works, with less) or fail (a task would fail)."""

    level: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.level.upper():<4}  {self.what}: {self.detail}"


def _resource(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def access_review(namespace: str, group: str, resource: str, verb: str) -> dict:
    """A SelfSubjectAccessReview's body: may this identity `verb` `resource` in `namespace`?"""
    name, _, subresource = resource.partition("/")
    attributes = {"namespace": namespace, "group": group, "resource": name, "verb": verb}
    if subresource:
        attributes["subresource"] = subresource
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}}


def check(hook: Any, namespace: str, queue: str) -> list[Finding]:
    """Every check, in order; stops after the first the others depend on (no answer, no Volcano)."""
    from airflow_volcano.hooks import calls

    findings: list[Finding] = []
    server = hook.server_address()
    try:
        version = json.loads(hook.run(calls.read_version()) or b"{}")
    except VolcanoApiError as error:
        return [Finding("fail", "apiserver", str(error))]
    server = hook.server_address() or server
    findings.append(Finding("ok", "apiserver", f"{server} answers (Kubernetes {version.get('gitVersion', '?')}), "
                                               f"connection {hook.conn_id!r}"))
    served: dict[tuple[str, str], set[str]] = {}
    for group, api_version, _ in VOLCANO_RESOURCES:  # one discovery read per API version
        if (group, api_version) not in served:
            listed = json.loads(hook.run(calls.read_discovery(group, api_version)) or b"{}")
            served[group, api_version] = {resource.get("name") for resource in listed.get("resources") or []}
    missing = [f"{plural}.{group}/{api_version}" for group, api_version, plural in VOLCANO_RESOURCES
               if plural not in served[group, api_version]]
    if missing:
        findings.append(Finding("fail", "Volcano", f"the apiserver does not serve {', '.join(missing)}: Volcano is "
                                                   "not installed in this cluster (or is being upgraded)"))
        return findings
    features = hook.volcano_features()
    findings.append(Finding("ok", "Volcano", f"its resources are served ({features.describe()})"))
    refused = []
    for group, resource, verbs in REQUIRED_PERMISSIONS:
        for verb in verbs:
            review = hook.run(calls.review_access(access_review(namespace, group, resource, verb)))
            if not (review.get("status") or {}).get("allowed"):
                refused.append(f"{verb} {_resource(group, resource)}")
    if refused:
        findings.append(Finding("fail", "permissions", f"the connection's identity may not, in namespace "
                                                       f"{namespace!r}: {', '.join(refused)}; deploy/rbac.yaml "
                                                       "grants every permission the provider needs"))
    else:
        findings.append(Finding("ok", "permissions", f"every permission deploy/rbac.yaml grants, in namespace "
                                                     f"{namespace!r}"))
    findings.append(_queue(hook, queue))
    return findings


def _queue(hook: Any, name: str) -> Finding:
    from airflow_volcano.hooks import calls

    try:
        found = hook.run(calls.get_queue(name))
    except VolcanoApiError as error:
        return Finding("warn", f"queue {name!r}", f"not checked ({error.brief()}): deploy/queue-reader.yaml lets "
                                                  "the provider read queues and say why a Job waits")
    if found is None:
        return Finding("fail", f"queue {name!r}", "no such Volcano queue: a Job submitted to it would never start "
                                                  "(`kubectl get queues` lists them)")
    state = (found.get("status") or {}).get("state") or "unknown"
    if state != "Open":
        return Finding("fail", f"queue {name!r}", f"its state is {state}: Volcano admits Jobs to Open queues only")
    return Finding("ok", f"queue {name!r}", "exists and is Open")


def main(argv: Sequence[str] | None = None, out: Callable[[str], Any] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_volcano.preflight", description=__doc__.split("\n")[0])
    parser.add_argument("--conn-id", default="kubernetes_default", help="the Airflow connection the tasks use")
    parser.add_argument("--namespace", help="the Jobs' namespace (default: the connection's, else `default`)")
    parser.add_argument("--queue", default="default", help="the Volcano queue the Jobs go to")
    parser.add_argument("--retries", type=int, default=2, help="retries of a call that gets no answer")
    args = parser.parse_args(argv)
    from airflow_volcano.hooks.volcano import VolcanoHook

    hook = VolcanoHook(args.conn_id, retries=args.retries)
    try:
        namespace = args.namespace or hook.get_namespace() or "default"
    except Exception as error:  # noqa: BLE001 - a connection that cannot be loaded: said, not raised
        out(Finding("fail", "connection", f"{args.conn_id!r} could not be loaded: {error}").line())
        return 1
    try:
        findings = check(hook, namespace, args.queue)
    except KubernetesConnectionError as error:
        findings = [Finding("fail", "connection", str(error))]
    except VolcanoApiError as error:
        findings = [Finding("fail", "apiserver", str(error))]
    for finding in findings:
        out(finding.line())
    return 1 if any(finding.level == "fail" for finding in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
