"""Provider registration, read by Airflow through the `apache_airflow_provider` entry point."""

from __future__ import annotations

from typing import Any

from airflow_volcano import __version__


def get_provider_info() -> dict[str, Any]:
    integration = "Volcano"
    return {
        "package-name": "airflow-volcano",
        "name": "Volcano",
        "description": "Distributed PyTorch training on Volcano-scheduled Kubernetes as one task.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": integration, "external-doc-url": "https://volcano.sh/", "tags": ["software"]}
        ],
        "operators": [{"integration-name": integration, "python-modules": ["airflow_volcano.operators.pytorch"]}],
        "sensors": [{"integration-name": integration, "python-modules": ["airflow_volcano.sensors.job"]}],
        "hooks": [{"integration-name": integration, "python-modules": ["airflow_volcano.hooks.volcano"]}],
        "triggers": [{"integration-name": integration, "python-modules": ["airflow_volcano.triggers.job"]}],
        # The `kubernetes` connection type is the cncf-kubernetes provider's: reused, not redefined.
    }
