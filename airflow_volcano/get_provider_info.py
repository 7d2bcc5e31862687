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
        "operators": [{"integration-name": integration, "python-modules": [
            "airflow_volcano.operators.job", "airflow_volcano.operators.master_worker",
            "airflow_volcano.operators.pytorch", "airflow_volcano.operators.deepspeed"]}],
        "sensors": [{"integration-name": integration, "python-modules": ["airflow_volcano.sensors.job"]}],
        "hooks": [{"integration-name": integration, "python-modules": ["airflow_volcano.hooks.volcano"]}],
        "triggers": [{"integration-name": integration, "python-modules": ["airflow_volcano.triggers.job"]}],
        "extra-links": ["airflow_volcano.links.VolcanoJobLink", "airflow_volcano.links.MasterLogLink",
                        "airflow_volcano.links.TensorBoardLink"],
        "config": {
            "volcano": {
                "description": "Links from a task in the Airflow UI to its Volcano Job, the folders scripts are "
                               "read from, and the cluster's Volcano release. A connection's extras may set the "
                               "same options (the connection wins; its allowed_file_dirs add to these).",
                "options": {
                    "job_url_template": {
                        "description": "URL of a Job in a dashboard, filled with {namespace}, {name}, {uid}, "
                                       "{pod} (the master pod) and {container}. Empty: no link.",
                        "version_added": "0.2.0", "type": "string",
                        "example": "https://volcano.example.com/job/{namespace}/{name}", "default": "",
                    },
                    "pod_log_url_template": {
                        "description": "URL of the master pod's log, filled with the same fields. Empty: no link.",
                        "version_added": "0.2.0", "type": "string",
                        "example": "https://k8s.example.com/#/log/{namespace}/{pod}/pod?container={container}",
                        "default": "",
                    },
                    "tensorboard_url_template": {
                        "description": "URL of the TensorBoard a Job runs (tensorboard=), filled with the same "
                                       "fields plus {tensorboard_pod} and {tensorboard_port}. Empty: no link (the "
                                       "task log still says how to port-forward to it).",
                        "version_added": "0.2.0", "type": "string",
                        "example": "https://k8s.example.com/api/v1/namespaces/{namespace}/pods/"
                                   "{tensorboard_pod}:{tensorboard_port}/proxy/",
                        "default": "",
                    },
                    "allowed_file_dirs": {
                        "description": "More absolute folders (comma-separated) every task's training_script and "
                                       "job_template may be read from, besides the DAG file's folder, its "
                                       "template_searchpath and the task's own allowed_file_dirs (an include/ folder, "
                                       "a volume of scripts). A DAG run's params still cannot leave them.",
                        "version_added": "0.2.0", "type": "string", "example": "/opt/airflow/include",
                        "default": "",
                    },
                    "deployment_id": {
                        "description": "This Airflow deployment's id, the label airflow-volcano.io/deployment of "
                                       "every Volcano Job it submits: reattach, the orphan sweep and cleanup take "
                                       "only their own deployment's Jobs. Empty: a random id the provider keeps in "
                                       "this deployment's metadata database (the Variable "
                                       "airflow_volcano_deployment_id), distinct for two Airflows. Set it when the "
                                       "database moves, to the id that Variable holds.",
                        "version_added": "0.2.0", "type": "string", "example": "prod-eu", "default": "",
                    },
                    "volcano_version": {
                        "description": "The cluster's Volcano release (e.g. 1.10), for a cluster whose Job CRD "
                                       "schema does not tell it (docs/versions.md). Empty: learned from the schema.",
                        "version_added": "0.2.0", "type": "string", "example": "1.10", "default": "",
                    },
                },
            }
        },
        "task-decorators": [
            {"name": "volcano_pytorch", "class-name": "airflow_volcano.decorators.volcano_pytorch.volcano_pytorch_task"}
        ],
        # The `kubernetes` connection type is the cncf-kubernetes provider's: reused, not redefined.
        # The "Volcano Job" view (airflow_volcano.panel) is registered through the `airflow.plugins` entry
        # point (pyproject.toml), which every Airflow component loads: a provider's "plugins" are loaded only
        # with [core] lazy_load_providers off.
    }
