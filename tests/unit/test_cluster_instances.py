"""scripts/volcano_cluster.py's second, simulated-only cluster (VOLCANO_CLUSTER_SIMULATED=1), on which
scripts/test-suite runs the control plane's disruptive tests beside the real node's: it must share no
port, no state directory and no host resource with the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READ = """
import json, volcano_cluster as c
print(json.dumps({"state": str(c.STATE), "ports": c.PORTS, "components": [x.name for x in c.COMPONENTS]}))
"""


def environment(**env: str) -> dict[str, str]:
    """This process's environment without any VOLCANO_CLUSTER_ setting of its own, plus `env`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("VOLCANO_CLUSTER_")}, **env}


def cluster_settings(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", READ], env=environment(**env), cwd=REPO / "scripts",
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_simulated_cluster_shares_no_port_nor_state_with_the_first_and_has_no_real_node():
    first, simulated = cluster_settings(), cluster_settings(VOLCANO_CLUSTER_SIMULATED="1")
    assert first["state"] == "/tmp/airflow-volcano-cluster"
    assert simulated["state"] == "/tmp/airflow-volcano-cluster-simulated"
    assert not set(first["ports"].values()) & set(simulated["ports"].values())
    assert {"containerd", "coredns", "kubelet"} <= set(first["components"])
    assert simulated["components"] == [
        "etcd", "kube-apiserver", "kube-controller-manager", "vc-webhook-manager", "kwok", "vc-controller-manager",
        "vc-scheduler"]


def test_the_simulated_cluster_refuses_to_place_pods_on_a_real_node():
    result = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "real-node"], capture_output=True,
                            text=True, env=environment(VOLCANO_CLUSTER_SIMULATED="1"))
    assert result.returncode == 1 and "has no real node" in result.stderr, result
