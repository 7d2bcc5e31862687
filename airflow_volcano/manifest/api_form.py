"""Kubernetes' Python client models (`kubernetes.client.V1EnvVar`, `V1ResourceRequirements`, ...), as
KubernetesPodOperator takes them, turned into the API's own form: the dicts with camelCase keys this
provider's arguments take and its manifests hold.

Recognised by their shape (the generated models' `openapi_types` and `attribute_map`), so that nothing
imports the client at DAG parse; unset fields (None) are left out, as the client's own serializer does.
"""

from __future__ import annotations

from typing import Any


def is_client_model(value: Any) -> bool:
    """Whether `value` is one of the Kubernetes client's generated models (an instance, not the class)."""
    return (not isinstance(value, type) and isinstance(getattr(value, "openapi_types", None), dict)
            and isinstance(getattr(value, "attribute_map", None), dict))


def api_form(value: Any) -> Any:
    """`value` with every client model in it (at any depth of lists, tuples and dicts) in the API's form;
    anything else unchanged (the same object when it holds no model)."""
    if is_client_model(value):
        return {value.attribute_map[attribute]: api_form(item) for attribute in value.openapi_types
                if (item := getattr(value, attribute)) is not None}
    if isinstance(value, list | tuple) and any(map(_holds_model, value)):
        return [api_form(item) for item in value]
    if isinstance(value, dict) and any(map(_holds_model, value.values())):
        return {key: api_form(item) for key, item in value.items()}
    return value


def _holds_model(value: Any) -> bool:
    if is_client_model(value):
        return True
    if isinstance(value, list | tuple):
        return any(map(_holds_model, value))
    if isinstance(value, dict):
        return any(map(_holds_model, value.values()))
    return False
