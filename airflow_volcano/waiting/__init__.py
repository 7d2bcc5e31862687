"""Waiting for a Job: the one waiting policy (`wait_engine`, pure), the steps its two drivers take at the
cluster for each of its answers (`wait_steps`), the worker's driver (`wait_worker`; the triggerer's is
`airflow_volcano.triggers`), and what the policy reads: a stall's stacks (`stalls`), why a Job waits in
its queue (`queueing`), the progress a script reports (`progress`) and the wait's verdict, the trigger's
event (`events`)."""
