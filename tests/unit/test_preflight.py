"""The preflight asks for exactly the permissions deploy/rbac.yaml grants (one list, held to the file)."""

from __future__ import annotations

from pathlib import Path

import yaml

from airflow_volcano.preflight import REQUIRED_PERMISSIONS, access_review

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"


def test_the_preflight_asks_for_what_deploy_rbac_grants():
    (role,) = [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc["kind"] == "Role"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    asked = {(group, resource, verb) for group, resource, verbs in REQUIRED_PERMISSIONS for verb in verbs}
    assert asked == granted


def test_a_subresource_is_asked_as_the_api_names_it():
    attributes = access_review("ml", "", "pods/log", "get")["spec"]["resourceAttributes"]
    assert attributes == {"namespace": "ml", "group": "", "resource": "pods", "subresource": "log", "verb": "get"}
