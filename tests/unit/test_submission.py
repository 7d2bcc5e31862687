"""Submitting a task's Job against a scripted hook: reattach to an earlier try's Job of the same request,
never to a reported one, never to another request's (and then say what to do, and let the task's
failure settle it), and reattach across an upgrade of the provider."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_volcano.constants import CHECKED_LABEL, ORPHANED_AT_ANNOTATION, REQUEST_HASH_ANNOTATION, IfJobExists
from airflow_volcano.exceptions import JobSpecError, VolcanoApiError, VolcanoJobError
from airflow_volcano.job_ref import JobRef
from airflow_volcano.ownership.submission import submit_or_reattach

from .test_arguments import built


class Hook:
    """The Jobs of the namespace; what was created and deleted."""

    def __init__(self, *jobs: dict, queues: dict[str, dict] | None = None) -> None:
        self.jobs = {job["metadata"]["name"]: job for job in jobs}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.made: list[tuple[str, str, list[str]]] = []  # (kind, name, owners' uids), in order
        self.theirs: set[str] = set()  # ConfigMaps of someone else's
        self.annotated: list[tuple[str, dict]] = []
        self.adopted: list[tuple[str, str]] = []  # (Job, the try that took it over)
        self.queues = {"default": {"metadata": {"name": "default"}, "status": {"state": "Open"}}} \
            if queues is None else queues

    def get_queue(self, name: str) -> dict | None:
        return self.queues.get(name)

    credentials_accepted = False

    def note_credentials_accepted(self) -> None:
        self.credentials_accepted = True

    def list_jobs(self, namespace: str, label_selector: str) -> list[dict]:
        """As the apiserver selects: `key=value` and `!key` (no such label)."""
        parts = label_selector.split(",")
        wanted = dict(part.split("=") for part in parts if "=" in part)
        absent = {part[1:] for part in parts if part.startswith("!")}
        return [job for job in self.jobs.values() if wanted.items() <= job["metadata"]["labels"].items()
                and not absent & set(job["metadata"]["labels"])]

    def get_job(self, name: str, namespace: str) -> dict | None:
        return self.jobs.get(name)

    def delete_job(self, name: str, namespace: str, **kwargs: Any) -> bool:
        self.deleted.append(name)
        return self.jobs.pop(name, None) is not None

    def drive(self, program: Any) -> Any:
        """The calls a program (hooks.calls) makes, against these Jobs."""
        answer = None
        while True:
            try:
                step = program.send(answer)
            except StopIteration as finished:
                return finished.value
            name = step.what.rsplit("/", 1)[-1]
            if step.what.startswith("get Job"):
                answer = self.jobs.get(name)
            elif step.what.startswith("adopt Job"):
                job = self.jobs[name]
                assert step.args[-1]["metadata"]["resourceVersion"] == job["metadata"].get("resourceVersion")
                job["metadata"]["labels"].update(step.args[-1]["metadata"]["labels"])
                self.adopted.append((name, job["metadata"]["labels"]["airflow-volcano.io/try-number"]))
                answer = job
            elif step.what.startswith("delete Job"):
                answer = self.delete_job(name, "")
            else:
                raise AssertionError(f"unexpected call: {step.what}")

    def wait_job_deleted(self, name: str, namespace: str, uid: str | None = None) -> None:
        pass

    def delete_script_configmap(self, name: str, namespace: str, job_uid: str | None) -> bool:
        return True

    def create_configmap(self, namespace: str, body: dict, **kwargs: Any) -> dict:
        if body["metadata"]["name"] in self.theirs:
            raise VolcanoApiError("create ConfigMap", 409, "AlreadyExists")
        self.made.append(("ConfigMap", body["metadata"]["name"], owners(body)))
        return body

    def annotate_job(self, name: str, namespace: str, annotations: dict) -> bool:
        self.annotated.append((name, annotations))
        return True

    def ensure_configmap(self, namespace: str, body: dict) -> bool:
        self.made.append(("ConfigMap if missing", body["metadata"]["name"], owners(body)))
        return True

    def create_job(self, namespace: str, body: dict) -> dict:
        created = copy.deepcopy(body)
        created["metadata"].update(uid=f"uid-{len(self.created)}", namespace=namespace,
                                   creationTimestamp="2026-11-25T10:00:00Z")
        self.made.append(("Job", created["metadata"]["name"], []))
        self.created.append(created["metadata"]["name"])
        self.jobs[created["metadata"]["name"]] = created
        return created


def owners(body: dict) -> list[str]:
    return [owner["uid"] for owner in body["metadata"].get("ownerReferences") or []]


def earlier_try(manifests: Any, **changes: Any) -> dict:
    """The Job an earlier try submitted from these manifests, Running since."""
    job = copy.deepcopy(manifests.job)
    job["metadata"].update(name="retrain-train-0ld", namespace="ml", uid="old-uid",
                           creationTimestamp="2026-11-25T09:00:00Z")
    job["metadata"].setdefault("annotations", {})[REQUEST_HASH_ANNOTATION] = manifests.request_hash
    job["status"] = {"state": {"phase": "Running"}}
    for key, value in changes.items():
        job["metadata"][key] = value
    return job


def test_a_retry_reattaches_to_the_running_job_of_its_own_request():
    manifests = built(args=["--lr", "0.1"])
    hook = Hook(earlier_try(manifests))
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert (ref.name, ref.uid, hook.created) == ("retrain-train-0ld", "old-uid", [])


def test_a_retry_takes_the_job_over_so_that_a_kill_of_the_earlier_try_leaves_it():
    """Issue 41: the try-number label says which try owns the Job; a reattaching try sets it to its own,
    as the Job was read (its resourceVersion), and an earlier try's kill then leaves the Job."""
    manifests = built(args=["--lr", "0.1"])
    old = earlier_try(manifests, resourceVersion="41")
    old["metadata"]["labels"] = {**old["metadata"]["labels"], "airflow-volcano.io/try-number": "1"}
    manifests.job["metadata"]["labels"]["airflow-volcano.io/try-number"] = "2"
    hook = Hook(old)
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.adopted == [("retrain-train-0ld", "2")] and ref.owner_try == 2 and hook.created == []


def test_a_job_an_earlier_tries_kill_is_deleting_is_not_taken_over_a_new_one_is_submitted():
    manifests = built(args=["--lr", "0.1"])
    manifests.job["metadata"]["labels"]["airflow-volcano.io/try-number"] = "2"
    hook = Hook(earlier_try(manifests, deletionTimestamp="2026-11-25T10:00:00Z"))
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.adopted == [] and hook.created == [ref.name] and ref.name != "retrain-train-0ld"


def test_a_job_already_reported_is_history_and_a_new_one_is_submitted():
    manifests = built(args=["--lr", "0.1"])
    old = earlier_try(manifests)
    old["metadata"]["labels"] = {**old["metadata"]["labels"], CHECKED_LABEL: "true"}
    hook = Hook(old)
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.created == [ref.name] and ref.name != "retrain-train-0ld"


def test_another_requests_job_is_refused_saying_what_to_do_and_handed_over_to_be_settled():
    """The DAG changed between two tries: not reattached, and not left unwatched either: the task's
    failure settles it (kept for a later try, deleted if none is left), so it is handed over first."""
    hook = Hook(earlier_try(built(args=["--lr", "0.1"])))
    found: list[JobRef] = []
    with pytest.raises(VolcanoJobError, match="from other arguments, script or debug mode than this try's. Set "
                                              "if_job_exists='replace' to replace it"):
        submit_or_reattach(hook, built(args=["--lr", "0.2"]), "ml", if_job_exists=IfJobExists.REATTACH,
                           on_found=found.append)
    assert [ref.uid for ref in found] == ["old-uid"] and hook.created == [] and hook.deleted == []


def test_a_job_of_an_earlier_release_is_reattached_as_its_request_cannot_be_compared():
    """Its hash covered the built Job, the provider's own shell included: refusing it on an upgrade
    would leave it training with nobody waiting."""
    manifests = built(args=["--lr", "0.1"])
    hook = Hook(earlier_try(manifests, annotations={REQUEST_HASH_ANNOTATION: "0123456789abcdef"}))
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert ref.uid == "old-uid" and hook.created == []


def test_replace_deletes_the_earlier_job_and_submits_anew():
    manifests = built(args=["--lr", "0.1"])
    hook = Hook(earlier_try(built(args=["--lr", "0.9"])))
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REPLACE)
    assert hook.deleted == ["retrain-train-0ld"] and hook.created == [ref.name]
    assert hook.jobs[ref.name]["metadata"]["annotations"][REQUEST_HASH_ANNOTATION] == manifests.request_hash


class Store:
    """A task instance's task state store holding one value."""

    def __init__(self, value: dict) -> None:
        self.value = value

    def get(self, key: str) -> dict:
        return self.value


def test_the_state_store_names_the_job_before_the_labels_do():
    manifests = built(args=["--lr", "0.1"])
    old = earlier_try(manifests)
    old["metadata"]["labels"] = {}  # labels that no longer name it (edited by hand, say)
    hook = Hook(old)
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH,
                             state_store=Store({"name": "retrain-train-0ld", "namespace": "ml", "uid": "old-uid"}))
    assert ref.uid == "old-uid" and hook.created == []
    # The connection created that Job: a 401 on this try's first read is an expired token, retried.
    assert hook.credentials_accepted


def test_a_try_that_died_before_recording_its_job_is_found_by_its_labels_though_the_store_names_an_older_one():
    """Found by the chaos soak: try 2 reported its Job (checked), try 3 created its own and died before
    recording it (a Clear refused the store's write). Try 4 skipped the store's reported Job and
    submitted a second Job beside try 3's, as the labels were read only when the store was empty."""
    manifests = built(args=["--lr", "0.1"])
    reported = earlier_try(manifests)
    reported["metadata"]["labels"] = {**reported["metadata"]["labels"], CHECKED_LABEL: "true"}
    unrecorded = earlier_try(manifests, name="retrain-train-n3w", uid="new-uid")
    hook = Hook(reported, unrecorded)
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH,
                             state_store=Store({"name": "retrain-train-0ld", "namespace": "ml", "uid": "old-uid"}))
    assert (ref.uid, hook.created, hook.deleted) == ("new-uid", [], [])


def test_a_job_its_queue_would_never_take_is_refused_before_anything_is_submitted():
    manifests = built(args=["--lr", "0.1"], volcano_queue="research", container_resources={"cpu": "2"},
                      worker_replicas=2)
    open_queue = {"metadata": {"name": "research"}, "spec": {"capability": {"cpu": "4"}}, "status": {"state": "Open"}}
    refusals = {
        "there is no Volcano queue of that name in this cluster": {},
        "the Volcano queue is Closed; it admits no new Job until it is Open again": {
            "research": {**open_queue, "status": {"state": "Closed"}}},
        "the Job could never start there: it needs 6 cpu and the queue's capability is 4 cpu": {
            "research": open_queue},
    }
    for message, queues in refusals.items():
        hook = Hook(queues=queues)
        with pytest.raises(JobSpecError, match=f"^volcano_queue 'research': {message}$"):
            submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
        assert hook.created == [], "nothing submitted"
    roomy = {"research": {**open_queue, "spec": {"capability": {"cpu": "6"}}}}
    hook = Hook(queues=roomy)
    assert submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH).name in hook.created


def test_a_queue_that_cannot_be_read_is_not_checked():
    class Refusing(Hook):
        def get_queue(self, name: str) -> dict | None:
            raise VolcanoApiError(f"get Queue {name}", 403, "Forbidden")

    hook = Refusing()
    manifests = built(args=["--lr", "0.1"], volcano_queue="research")
    assert submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH).name in hook.created


def test_the_job_is_created_before_its_script_which_it_owns_from_the_start():
    """Found by the chaos soak: a try killed between creating the script's ConfigMap and the Job left the
    ConfigMap, owned by nothing. The Job comes first now: a try dying in between leaves a Job (the next
    try reattaches and makes the script; or the orphan sweep deletes it), never a ConfigMap alone."""
    manifests = built()
    hook = Hook()
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.made == [("Job", ref.name, []), ("ConfigMap", f"{ref.name}-script", [ref.uid])]


def test_a_retry_reattaching_to_a_running_job_makes_its_script_if_the_earlier_try_died_before():
    manifests = built()
    hook = Hook(earlier_try(manifests))
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.made == [("ConfigMap if missing", "retrain-train-0ld-script", ["old-uid"])] and ref.uid == "old-uid"
    finished = earlier_try(manifests)
    finished["status"] = {"state": {"phase": "Completed"}}
    hook = Hook(finished)
    submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.made == []  # its pods are done: nothing waits for a script


def test_someone_elses_configmap_of_the_scripts_name_refuses_the_submission_and_deletes_the_job_just_made():
    manifests = built()
    hook = Hook()
    hook.theirs.add(f"{manifests.job['metadata']['name']}-script")
    with pytest.raises(JobSpecError, match="already exists and was not created by this task"):
        submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.created == hook.deleted == [manifests.job["metadata"]["name"]] and hook.jobs == {}


def test_a_retry_reattaching_to_a_job_a_sweep_marked_orphaned_removes_the_mark():
    """Its task instance had ended and was cleared: watched again, the mark must not let a later sweep
    delete it without a grace the next time it ends."""
    manifests = built()
    old = earlier_try(manifests)
    old["metadata"]["annotations"][ORPHANED_AT_ANNOTATION] = "1000"
    hook = Hook(old)
    submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.annotated == [("retrain-train-0ld", {ORPHANED_AT_ANNOTATION: None})]


def deployed(manifests: Any, deployment: str) -> Any:
    """The manifests as the operator submits them: labelled with its Airflow deployment."""
    for manifest in (manifests.job, manifests.configmap):
        if manifest is not None:
            manifest["metadata"]["labels"]["airflow-volcano.io/deployment"] = deployment
    return manifests


def test_another_deployments_job_of_the_same_task_instance_is_never_reattached_to():
    """Issue 42: staging and prod share a namespace and run the same DAG for the same date: staging's retry
    found prod's Job by its labels and reattached to it. The deployment is part of the identity."""
    prods = earlier_try(deployed(built(args=["--lr", "0.1"]), "prod"))
    hook = Hook(prods)
    ref = submit_or_reattach(hook, deployed(built(args=["--lr", "0.1"]), "staging"), "ml",
                             if_job_exists=IfJobExists.REATTACH)
    assert hook.created == [ref.name] and ref.name != prods["metadata"]["name"] and hook.adopted == []
    assert hook.deleted == [] and "retrain-train-0ld" in hook.jobs, "prod's Job untouched"


def test_a_fixed_name_taken_by_another_deployments_job_is_an_error_naming_both():
    prods = earlier_try(deployed(built(args=["--lr", "0.1"]), "prod"))
    staging = deployed(built(args=["--lr", "0.1"], name="retrain-train-0ld"), "staging")
    hook = Hook(prods)
    with pytest.raises(JobSpecError, match=r"belongs to another Airflow deployment \(its airflow-volcano.io/"
                                           r"deployment is 'prod'; this one's is 'staging'\)"):
        submit_or_reattach(hook, staging, "ml", if_job_exists=IfJobExists.REATTACH)
    assert hook.created == [] and hook.deleted == []


def test_a_job_of_an_earlier_release_without_a_deployment_is_reattached_and_labelled_with_this_deployment():
    """Jobs submitted before deployments were told apart carry no deployment label: a retry still finds
    them by the rest of their identity and takes them over, labelling them with its deployment."""
    manifests = deployed(built(args=["--lr", "0.1"]), "prod")
    legacy = earlier_try(built(args=["--lr", "0.1"]), resourceVersion="7")
    legacy["metadata"]["labels"] = {**legacy["metadata"]["labels"], "airflow-volcano.io/try-number": "1"}
    manifests.job["metadata"]["labels"]["airflow-volcano.io/try-number"] = "2"
    hook = Hook(legacy)
    ref = submit_or_reattach(hook, manifests, "ml", if_job_exists=IfJobExists.REATTACH)
    assert ref.uid == "old-uid" and hook.created == []
    assert hook.jobs["retrain-train-0ld"]["metadata"]["labels"]["airflow-volcano.io/deployment"] == "prod"
