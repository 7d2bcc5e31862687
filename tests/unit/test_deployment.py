"""Which Airflow deployment a Job belongs to (deployment.py): distinct per Airflow with no configuration,
stable, settable."""

from __future__ import annotations

import pytest

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.ownership.deployment import deployment_id


class Variables:
    """An Airflow's Variables, as the Task SDK reads and writes them."""

    def __init__(self, stored: str | None = None, *, refuse_writes: bool = False) -> None:
        self.stored, self.refuse_writes, self.writes = stored, refuse_writes, 0

    def get(self) -> str | None:
        return self.stored

    def set(self, value: str) -> None:
        self.writes += 1
        if not self.refuse_writes:  # Variable.set logs and swallows the API server's refusal
            self.stored = value


def test_two_airflows_get_two_ids_each_kept_in_its_own_database_and_stable():
    staging, prod = Variables(), Variables()
    first = deployment_id(None, staging.get, staging.set, lambda seconds: None)
    assert first != deployment_id(None, prod.get, prod.set, lambda seconds: None), "two metadata databases, two ids"
    assert deployment_id("", staging.get, staging.set) == first and staging.writes == 1, "created once, then read"


def test_the_setting_wins_and_is_checked_as_a_label_value():
    variables = Variables("a1b2c3")
    assert deployment_id("prod-eu", variables.get, variables.set) == "prod-eu"
    with pytest.raises(JobSpecError, match=r"\[volcano\] deployment_id: 'prod eu!' is not a valid deployment id"):
        deployment_id("prod eu!", variables.get, variables.set)


def test_an_id_that_cannot_be_stored_fails_saying_what_to_set():
    refusing = Variables(refuse_writes=True)
    with pytest.raises(JobSpecError, match=r"set \[volcano\] deployment_id \(AIRFLOW__VOLCANO__DEPLOYMENT_ID\)"):
        deployment_id(None, refusing.get, refusing.set, lambda seconds: None)


def test_two_first_submissions_at_once_both_take_the_id_stored_last():
    shared = Variables()

    def meanwhile(seconds: float) -> None:
        shared.set("b0b0b0")  # the other first submission's upsert lands while this one settles

    assert deployment_id(None, shared.get, shared.set, meanwhile) == "b0b0b0", "not its own proposal"
