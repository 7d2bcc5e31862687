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


SCHEDULER = """
import json, volcano_cluster as c
print(json.dumps({v: {mode: c.scheduler_configuration(mode, v).split("actions:")[1].splitlines()[0].strip()
                      for mode in (True, False)} for v in ("v1.10.0", "v1.14.1", "v1.15.1")}))
"""


# What `up` writes for the scheduler of each cluster (the default versions: Volcano v1.15).
WRITTEN = """
import sys, pathlib, volcano_cluster as c
c.STATE = pathlib.Path(sys.argv[1])
c.STATE.mkdir()
print(c.scheduler_conf().read_text())
"""


def test_the_first_cluster_runs_volcanos_built_in_actions_and_a_preempting_one_only_when_asked(tmp_path):
    """The actions of each configuration: the built-in ones (Volcano's DefaultSchedulerConf), and with the
    release's preempting action after allocate (gang-aware from v1.15)."""
    out = subprocess.run([sys.executable, "-c", SCHEDULER], env=environment(), cwd=REPO / "scripts",
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {
        "v1.10.0": {"true": '"enqueue, allocate, preempt, backfill"', "false": '"enqueue, allocate, backfill"'},
        "v1.14.1": {"true": '"enqueue, allocate, preempt, backfill"', "false": '"enqueue, allocate, backfill"'},
        "v1.15.1": {"true": '"enqueue, allocate, gangpreempt, backfill"', "false": '"enqueue, allocate, backfill"'},
    }
    for env, preempts in (({}, False), ({"VOLCANO_CLUSTER_SIMULATED": "1"}, True)):
        written = subprocess.run([sys.executable, "-c", WRITTEN, str(tmp_path / str(preempts))],
                                 env=environment(**env), cwd=REPO / "scripts", capture_output=True, text=True,
                                 check=True)
        actions = "enqueue, allocate, gangpreempt, backfill" if preempts else "enqueue, allocate, backfill"
        assert f'actions: "{actions}"' in written.stdout.splitlines(), (env, written.stdout)
