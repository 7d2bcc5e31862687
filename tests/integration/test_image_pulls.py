"""Image pulls on the real node from a real registry on loopback (tests/integration/registry.py): the
kubelet and containerd pull `localhost:<port>/...` and report what the registry answered. An image the
registry does not have fails the task at once with the kubelet's "not found"; a registry that answers
503 for a while is waited out (the task log says the kubelet retries) and the training then runs.
"""

from __future__ import annotations

import datetime
import re
import secrets
import time
from collections.abc import Iterator

import pytest

from .real_node import real_operator, script
from .registry import Registry


@pytest.fixture
def registry(containerd, real_node) -> Iterator[Registry]:
    """The registry serving the training image; on teardown stopped, and the images containerd pulled
    from it removed (the training image itself stays)."""
    with Registry(containerd, real_node["image"]) as running:
        yield running
    assert running.pulled_images() == [], "the images pulled from the test registry were not removed"


def test_an_image_the_registry_does_not_have_fails_the_task_at_once_with_the_kubelets_reason(
        cluster, operator_kubeconfig, run_task, real_node, registry):
    """The registry answers 404 MANIFEST_UNKNOWN: the kubelet says the image is not found, which no
    retry can fix, so the task fails within seconds (not after image_pull_timeout or startup_timeout)
    naming the image and the kubelet's reason, and the Job is deleted."""
    repository = f"missing-{secrets.token_hex(3)}/train"
    image = registry.missing(repository)
    started = time.monotonic()
    # execution_timeout only keeps the test bounded if the error were waited out (a regression).
    run = run_task(lambda: real_operator(real_node | {"image": image}, cluster.namespace, "noimage",
                                         worker_replicas=1, startup_timeout=600, image_pull_timeout=600,
                                         execution_timeout=datetime.timedelta(seconds=120)))
    took = time.monotonic() - started

    assert run.state == "failed", run.log
    line = next((line for line in run.log.splitlines() if f"Volcano Job {cluster.namespace}/noimage cannot start: "
                 in line), None)
    assert line is not None, run.log
    assert re.search(r"pod noimage-(master|worker)-0 \(task (master|worker)\) Pending, container \w+, "
                     r"reason (ErrImagePull|ImagePullBackOff): ", line), line
    assert image in line and "not found" in line, line
    assert "did not start within startup_timeout" not in run.log, "a final pull error must not wait it out"
    assert "still failing after image_pull_timeout" not in run.log
    assert took < 60, f"the task took {took:.0f}s: it waited instead of failing at once"
    # The kubelet really asked the registry, which answered 404.
    path = f"/v2/{repository}/manifests/dev"
    assert {request.status for request in registry.seen(path=path)} == {404}, registry.requests
    cluster.wait_for("the Job that cannot start to be deleted", lambda: cluster.job("noimage") is None)


ALL_REDUCE = """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: all_reduce {total.item():.0f}", flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_a_registry_that_answers_503_for_a_while_is_waited_out_and_the_job_runs(
        cluster, operator_kubeconfig, run_task, real_node, registry, tmp_path, deferrable):
    """The registry answers 503 Service Unavailable for its first 20 s, as one restarting or overloaded
    does: the kubelet's pull fails and it retries with back-off. The task says so and waits (up to
    image_pull_timeout); once the registry serves the manifest the pods start and the gang trains."""
    repository = f"flaky-{secrets.token_hex(3)}/train"
    image = registry.flaky(repository, seconds=20)
    run = run_task(lambda: real_operator(real_node | {"image": image}, cluster.namespace, "pull503",
                                         worker_replicas=1, startup_timeout=300, image_pull_timeout=180,
                                         training_script=script(tmp_path, ALL_REDUCE), deferrable=deferrable))

    assert run.state == "success", run.log
    retries = [line for line in run.log.splitlines() if f"Volcano Job {cluster.namespace}/pull503: pod pull503-" in line
               and "the kubelet retries" in line]
    assert retries, run.log
    assert re.search(r"reason (ErrImagePull|ImagePullBackOff): .*" + re.escape(image) + r".*503 Service Unavailable.*; "
                     r"the kubelet retries \(a registry error may pass\), and the task waits up to "
                     r"image_pull_timeout \(180s\)", retries[0]), retries[0]
    assert "cannot start" not in run.log and "still failing after image_pull_timeout" not in run.log
    if deferrable:
        assert "Deferring: the triggerer waits for Volcano Job" in run.log
    assert "[pull503-master-0] rank 0 of 2: all_reduce 2" in run.log
    # The registry answered 503, then served the manifest, as the pods' pulls show.
    path = f"/v2/{repository}/manifests/dev"
    statuses = [request.status for request in registry.seen(path=path)]
    assert 503 in statuses and 200 in statuses, registry.requests
    assert statuses.index(200) > statuses.index(503) and set(statuses[statuses.index(200):]) == {200}, statuses
