"""The Kubernetes backend's settings, names and messages, checked without an API server:
each refusal names its field when the DAG is parsed (or at launch, before anything reaches the
cluster). What the backend does on a cluster (the pods it creates and the real server admits,
their placement, notices, verdicts, leftovers, probes, the operator's loop) is tested on the
real control plane, ``real/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_spot.backends.base import TaskIdentity
from airflow_spot.backends.kubernetes.backend import KubePool, KubernetesBackend
from airflow_spot.backends.kubernetes.placement import Placement
from airflow_spot.exceptions import ConfigError

IDENT = TaskIdentity("nightly_train", "train", "manual__2026-01-01T00:00:00+00:00", try_number=2)
NOWHERE = "/nonexistent/kubeconfig"  # never read: each refusal comes before any API call


def test_bad_settings_name_the_field_and_good_ones_survive_serialisation() -> None:
    """An unknown preset, no image, an unknown delete policy are refused naming the field; a
    custom preset and pools come back equal from the backend's stored form."""
    with pytest.raises(ConfigError, match="preset: unknown preset 'mars'"):
        KubernetesBackend(image="img", preset="mars")
    with pytest.raises(ConfigError, match="backend.image"):
        KubernetesBackend(image="")
    with pytest.raises(ConfigError, match="backend.delete_pods"):
        KubernetesBackend(image="img", delete_pods="sometimes")
    custom = {"spot": Placement({"pool": "cheap"}), "on_demand": Placement({"pool": "steady"})}
    zone = "topology.kubernetes.io/zone"
    pools = (
        KubePool("zone-a", Placement({"karpenter.sh/capacity-type": "spot", zone: "a"}), 0.8),
        KubePool("zone-b", Placement({"karpenter.sh/capacity-type": "spot", zone: "b"}), 1.2),
    )
    for b in (
        KubernetesBackend(image="img", preset=custom),
        KubernetesBackend(image="img", pools=pools, pending_timeout_s=1.0),
    ):
        assert KubernetesBackend.from_dict(b.to_dict()) == b


def test_labels_and_names_stay_valid_and_distinct() -> None:
    """Run ids that differ only in characters a label cannot hold get different labels (the
    leftover cleanup selects by them); ids made only of '_' or '.' still give a valid name."""
    from airflow_spot.backends.kubernetes.pods import label_value, pod_name

    a, b = "manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00_00_00_00_00"
    assert label_value(a) != label_value(b) and label_value(b) == b
    for text in (a, "x" * 80, "___", ":x:"):
        v = label_value(text)
        assert len(v) <= 63 and v[0].isalnum() and v[-1].isalnum(), v
    name = pod_name(TaskIdentity("__", "..", "r"), 1)
    assert name[0].isalnum() and len(name) <= 63, name


def test_a_template_that_cannot_be_a_pod_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Refused when the DAG is parsed (a file, when it is read at launch); a template file
    is kept as its path, so the backend is stored as JSON."""
    for bad, match in (
        ({"spec": {"containers": {"name": "train"}}}, r"spec.containers must be a list"),
        ({"kind": "Deployment"}, "must be a Pod"),
        (42, "got int"),
    ):
        with pytest.raises(ConfigError, match=f"backend.pod_template: .*{match}"):
            KubernetesBackend(image="img", pod_template=bad)
    missing = KubernetesBackend(image="img", config_file=NOWHERE, pod_template=tmp_path / "no.yaml")
    assert missing.pod_template == str(tmp_path / "no.yaml")
    assert KubernetesBackend.from_dict(missing.to_dict()) == missing
    with pytest.raises(ConfigError, match="backend.pod_template: cannot read"):
        missing.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")


def test_resources_and_placements_the_api_would_refuse_name_the_field() -> None:
    """A request above its limit, a GPU request unlike its limit, a mistyped toleration and
    odd resources are refused with the field named, not as a 422 on every launch (that the
    real server refuses them, or silently changes a mistyped toleration, is checked in
    real/test_real_claims.py)."""
    with pytest.raises(ConfigError, match="backend.resources: .*above its limit"):
        KubernetesBackend(
            image="img", resources={"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}
        )
    with pytest.raises(ConfigError, match="backend.resources: memory: '64Gb' is not a quantity"):
        KubernetesBackend(image="img", resources={"limits": {"memory": "64Gb"}})
    # merged with `gpus` (or a template's limits) at launch, before anything is sent
    b = KubernetesBackend(
        image="img", config_file=NOWHERE, gpus=2, resources={"requests": {"nvidia.com/gpu": "1"}}
    )
    with pytest.raises(ConfigError, match="backend.resources: .*must equal its limit"):
        b.launch(IDENT, 1, "spot", ["x"], checkpoint_uri="/c")
    with pytest.raises(
        ConfigError, match=r"placement.tolerations: unknown field\(s\) \['opertor'\]"
    ):
        Placement({"pool": "a"}, ({"key": "gpu", "opertor": "Exists"},))
    with pytest.raises(ConfigError, match="placement.tolerations: operator"):
        Placement({}, ({"key": "gpu", "operator": "In"},))
    with pytest.raises(ConfigError, match="backend.resources"):
        KubernetesBackend(image="img", resources={"memory": "64Gi"})
    with pytest.raises(ConfigError, match="backend.gpus"):
        KubernetesBackend(image="img", gpus=1.5)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"namespace": "Bad_NS"}, "backend.namespace"),
        ({"namespace": ""}, "backend.namespace"),
        ({"preset": {"spot": {"node_selector": {}}, "on_demand": {}}}, "backend.preset"),
        ({"pending_timeout_s": "10m"}, "backend.pending_timeout_s"),
        ({"spot_cooldown_s": float("nan")}, "backend.spot_cooldown_s"),
        ({"grace_period_s": -1}, "backend.grace_period_s"),
        ({"env": {"A": 1}}, "backend.env"),
        ({"env_from_secrets": "mysecret"}, "backend.env_from_secrets"),
        ({"service_account": "Bad SA"}, "backend.service_account"),
        ({"in_cluster": "yes"}, "backend.in_cluster"),
        ({"pools": [{"name": "a"}]}, "backend.pools"),
        ({"pools": ("zone-a",)}, "backend.pools"),
    ],
)
def test_every_backend_field_is_checked_when_the_dag_is_parsed(kwargs: dict, field: str) -> None:
    """Each was accepted before and failed at launch, at to_dict(), or never."""
    with pytest.raises(ConfigError, match=f"^{re.escape(field)}: "):
        KubernetesBackend(image="img", **kwargs)


def test_pool_prices_and_price_sources_are_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"backend.pools: pool 'a': placement must be a Placement"
    ):
        KubePool("a", {"node_selector": {}})
    with pytest.raises(ConfigError, match=r"backend.pools: pool 'a': spot_price"):
        KubePool("a", Placement(), spot_price=-1)
    with pytest.raises(ConfigError, match=r"backend.pools\[a\].price_from: give"):
        KubePool("a", Placement(), price_from={"aws_conn_id": "aws", "instance": "p3.2xlarge"})
    ok = KubePool(
        "a", Placement(), price_from={"instance_type": "p3.2xlarge", "zone": "us-east-1a"}
    )
    b = KubernetesBackend(image="img", pools=[ok], env_from_secrets=["hf-token"])
    assert b.pools == (ok,) and b.env_from_secrets == ("hf-token",)  # lists become tuples


def test_a_refused_create_says_what_the_server_said() -> None:
    """A missing ServiceAccount is a 403 that reads like RBAC unless the message is kept."""
    from types import SimpleNamespace

    from airflow_spot.backends.kubernetes.api import api_message

    body = '{"kind":"Status","message":"pods \\"p\\" is forbidden: error looking up service account ml/x: serviceaccount \\"x\\" not found","code":403}'
    assert 'serviceaccount "x" not found' in api_message(SimpleNamespace(body=body))
    assert api_message(SimpleNamespace(body="not json")) == ""
    assert api_message(SimpleNamespace(body=None)) == ""
