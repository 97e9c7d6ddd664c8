"""The shipped training image and RBAC manifest say what they must (no Docker engine here to build)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_rbac_grants_only_what_the_backend_uses() -> None:
    """Pods (with patch for the notice annotation, delete for cleanup), pods/log, events, nodes read; nothing else."""
    docs = list(yaml.safe_load_all((ROOT / "docker" / "rbac.yaml").read_text()))
    rules = [
        (tuple(r["resources"]), tuple(r["verbs"]))
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for r in d["rules"]
    ]
    assert (("pods",), ("create", "get", "list", "watch", "patch", "delete")) in rules
    assert (("pods/log",), ("get",)) in rules
    assert (("nodes",), ("get", "list", "watch")) in rules
    verbs = {v for _, vs in rules for v in vs}
    assert verbs <= {"create", "get", "list", "watch", "patch", "delete"}
    node_rules = [vs for res, vs in rules if "nodes" in res]
    assert all(set(vs) <= {"get", "list", "watch"} for vs in node_rules)


def test_image_runs_as_non_root_and_ships_the_checkpoint_helper() -> None:
    """The Dockerfile copies the checkpoint helper and drops root."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY airflow_spot/checkpoint" in text
    assert "USER 1000:1000" in text
