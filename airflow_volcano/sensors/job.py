"""VolcanoJobSensor: wait for any Volcano Job, including one submitted outside Airflow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_volcano.compat import AirflowFailException, conf
from airflow_volcano.constants import DEFAULT_CONN_ID, OnFinishAction, OnKillAction
from airflow_volcano.exceptions import VolcanoJobError

if TYPE_CHECKING:
    from airflow.sdk import Context


class VolcanoJobSensor(BaseSensorOperator):
    """Succeeds when the Job reaches Completed; fails, with the operator's reason text, on Failed,
    Terminated or Aborted. A Job that does not exist yet is waited for (it may be submitted later).
    Never deletes the Job: it is not this task's. With `get_logs`, the main pod's log is
    copied into the task log when the Job ends. Works in poke and reschedule mode, and deferrable.

    :param job_name: the Volcano Job to wait for; one that does not exist yet is waited for.
    :param namespace: default: the connection's namespace, else `default`.
    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param main_task: the task whose pod 0 is the Job's main pod (default `master`, a PyTorch Job's).
    :param get_logs: copy the main pod's log into the task log when the Job ends.
    :param deferrable: wait in the triggerer (default `[operators] default_deferrable`); there, a Job whose pods
        cannot start (an image that cannot be pulled, say) fails the task, saying so.
    """

    template_fields: Sequence[str] = ("job_name", "namespace")
    ui_color = "#f8c291"

    def __init__(
        self,
        *,
        job_name: str,
        namespace: str | None = None,
        kubernetes_conn_id: str = DEFAULT_CONN_ID,
        main_task: str = "master",
        get_logs: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.deferrable = deferrable
        self.job_name = job_name
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.main_task = main_task
        self.get_logs = get_logs

    def execute(self, context: Context) -> Any:
        """Deferrable: one poke here; if the Job exists but is not done, wait in the triggerer."""
        if not self.deferrable:
            return super().execute(context)
        from airflow_volcano.hooks.volcano import VolcanoHook
        from airflow_volcano.ownership import watched_only
        from airflow_volcano.status import job_state
        from airflow_volcano.triggers.job import VolcanoJobTrigger
        from airflow_volcano.waiting.wait_engine import WaitLimits

        result = self.poke(context)
        if isinstance(result, PokeReturnValue):
            return result.xcom_value
        hook = VolcanoHook(kubernetes_conn_id=self.kubernetes_conn_id)
        job = hook.get_job(self.job_name, self._namespace(hook))
        if job is None:  # not submitted yet: wait for it the ordinary way
            return super().execute(context)
        ref = watched_only(job, self.main_task)
        deadline = None
        if self.timeout is not None and context.get("ti") is not None and context["ti"].start_date is not None:
            deadline = context["ti"].start_date.timestamp() + float(self.timeout)
        self.log.info("Deferring: the triggerer waits for Volcano Job %s/%s (%s)", ref.namespace, ref.name,
                      job_state(job).phase)
        self.defer(
            trigger=VolcanoJobTrigger(ref.to_dict(), self.kubernetes_conn_id,
                                      limits=WaitLimits(startup_timeout=None).to_dict(), deadline=deadline,
                                      get_logs=False, on_kill_action=OnKillAction.KEEP_JOB),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        from airflow_volcano.waiting.events import Verdict, WaitOutcome

        ended, _ref = WaitOutcome.from_event(event)
        if ended.verdict in (Verdict.DEADLINE, Verdict.JOB_TIMEOUT):
            raise AirflowFailException(f"Sensor timed out waiting for Volcano Job {self.job_name}: {ended.message}")
        if ended.verdict in (Verdict.WAIT_FAILED, Verdict.DELETED):
            raise AirflowFailException(f"Waiting for Volcano Job {self.job_name} failed: {ended.message}")
        if ended.verdict is Verdict.CANNOT_START:  # e.g. its pods cannot pull their image: it cannot complete
            raise VolcanoJobError(str(ended.message))
        result = self.poke(context)
        if isinstance(result, PokeReturnValue):
            return result.xcom_value
        # Not finished after all (the event came early): wait again, never succeed on an unfinished Job.
        return self.execute(context)

    def _namespace(self, hook: Any) -> str:
        return self.namespace or hook.get_namespace() or "default"

    def poke(self, context: Context) -> PokeReturnValue | bool:
        from airflow_volcano.hooks.volcano import VolcanoHook
        from airflow_volcano.observability.pod_logs import main_log_copy, read_remaining_log
        from airflow_volcano.ownership import watched_only
        from airflow_volcano.ownership.finalize import finalize
        from airflow_volcano.status import job_state
        from airflow_volcano.waiting.events import Verdict, WaitOutcome

        hook = VolcanoHook(kubernetes_conn_id=self.kubernetes_conn_id)
        namespace = self._namespace(hook)
        job = hook.get_job(self.job_name, namespace)
        if job is None:
            self.log.info("Volcano Job %s/%s does not exist (yet)", namespace, self.job_name)
            return False
        state = job_state(job)
        self.log.info("Volcano Job %s/%s is %s", namespace, self.job_name, state.phase)
        if not state.finished:
            return False
        ref = watched_only(job, self.main_task)
        main_log = main_log_copy(ref, self.log)
        if self.get_logs:
            read_remaining_log(hook, namespace, main_log)
        outcome = WaitOutcome(Verdict.FINISHED, phase=state.phase, job=job, log_cursor=main_log.cursor)
        try:
            summary = finalize(hook, ref, outcome, on_finish_action=OnFinishAction.KEEP_JOB)
        except VolcanoJobError as error:
            # The Job's end is final: retrying the sensor cannot change it.
            raise AirflowFailException(str(error)) from error
        return PokeReturnValue(is_done=True, xcom_value=summary)
