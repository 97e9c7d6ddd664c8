"""A waiting spot gang's capacity check, read at each look (the API side of
:class:`~.gating.GangCapacity`).

While a spot gang waits behind its gate, its capacity check answers "N seen", "fewer than N"
or nothing yet: Karpenter's NodeClaims for its placeholders (:mod:`.capacity_signals`, with the
NodeClaims still on their way that may yet bring a node), or with
``capacity_check="atomic-scale-up"`` (or ``"provisioning-request"``) the ProvisioningRequest that
gates it instead (:mod:`.provisioning`), whose "N seen" the Job records as the grant (the gates lift
on it). The verdict (:func:`.gang_verdict.judge_gang`) shows the answer and ends the gang early
on a "fewer than N" that stands (:func:`.gating.short_of_n`). Imported when first used (its
reads import the Kubernetes client).
"""

from __future__ import annotations

from typing import Any

from airflow_spot.backends.kubernetes.capacity_calls import count_claims, read_request
from airflow_spot.backends.kubernetes.capacity_signals import claim_signal
from airflow_spot.backends.kubernetes.gating import (
    GRANTED_ANNOTATION,
    GangCapacity,
    placeholder_name,
)
from airflow_spot.backends.kubernetes.provisioning import request_name, request_signal


def waiting_capacity(gang: Any, job: Any, launched_at: float, now: float) -> GangCapacity | None:
    """What the capacity check of ``gang`` (a :class:`~.gang.Gang`) says of its Job ``job``
    (as read) while the gang waits; None once its capacity is granted."""
    annotations = job.metadata.annotations or {}
    if GRANTED_ANNOTATION in annotations:
        return None
    name, ns, b = job.metadata.name, gang.b.namespace, gang.b
    if not gang.by_request:
        held = [placeholder_name(name, k) for k in range(gang.n)]
        count = count_claims(b.cluster, ns, held, gang.n, launched_at, now)
        return GangCapacity(claim_signal(count, ""), count.trying)
    seen = request_signal(read_request(b.cluster, ns, request_name(name)), gang.n)
    if (
        seen is not None
        and seen.up
        and gang.api.annotate_job(name, {GRANTED_ANNOTATION: repr(seen.at)})
    ):
        job.metadata.annotations = {**annotations, GRANTED_ANNOTATION: repr(seen.at)}
    return GangCapacity(seen)
