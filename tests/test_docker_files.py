"""The shipped training image and RBAC manifest say what they must (no Docker engine here to build)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_rbac_grants_only_what_the_backend_uses() -> None:
    """Pods (with patch for the notice annotation, delete for cleanup), pods/log, events, nodes
    read; a gang's Jobs (batch) and headless Services in the namespace; nothing else."""
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
    assert (("jobs",), ("create", "get", "list", "watch", "patch", "delete")) in rules
    assert (("services",), ("create", "get", "delete")) in rules
    groups = {
        r["resources"][0]: r["apiGroups"] for d in docs if d["kind"] == "Role" for r in d["rules"]
    }
    assert groups["jobs"] == ["batch"] and groups["services"] == [""]
    cluster_wide = {
        r for d in docs if d["kind"] == "ClusterRole" for x in d["rules"] for r in x["resources"]
    }
    assert not cluster_wide & {"jobs", "services"}  # only in the training namespace
    verbs = {v for _, vs in rules for v in vs}
    assert verbs <= {"create", "get", "list", "watch", "patch", "delete"}
    node_rules = [vs for res, vs in rules if "nodes" in res]
    assert all(set(vs) <= {"get", "list", "watch"} for vs in node_rules)


def test_image_runs_as_non_root_and_ships_the_checkpoint_helper() -> None:
    """The Dockerfile copies the checkpoint helper and drops root."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY airflow_spot/checkpoint" in text
    assert "USER 1000:1000" in text


def test_the_supervisor_units_restart_every_component_with_the_worker_settings() -> None:
    """deploy/systemd (the README's supervisor example, issue 34 finding 9): one unit per
    component, each restarted whenever it exits and never given up on (a PostgreSQL restart
    stops the scheduler, dag-processor and triggerer), each running a real ``airflow``
    subcommand; the environment file carries the worker settings that make an orchestration
    outage of a few minutes cost no try, and the Celery config the provider ships."""
    import configparser
    import subprocess
    import sys

    units = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
    names = {u.name for u in units}
    assert {f"airflow-{c}.service" for c in ("scheduler", "dag-processor", "triggerer")} <= names
    assert {"airflow-api-server.service", "airflow-celery-worker@.service"} <= names
    for unit in units:
        cfg = configparser.ConfigParser(strict=False, interpolation=None)
        cfg.optionxform = str  # type: ignore[assignment,method-assign]
        cfg.read(unit)
        service = cfg["Service"]
        assert service["Restart"] == "always", unit.name
        assert cfg["Unit"]["StartLimitIntervalSec"] == "0", unit.name
        assert service["EnvironmentFile"] == "/etc/airflow/airflow.env", unit.name
        argv = service["ExecStart"].split()
        assert argv[0].endswith("/bin/airflow"), unit.name
        sub = [a for a in argv[1:3] if not a.startswith("-")]
        helped = subprocess.run(
            [sys.executable, "-m", "airflow", *sub, "--help"], capture_output=True, text=True
        )
        assert helped.returncode == 0, (unit.name, helped.stderr[-500:])
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert flag in helped.stdout, (unit.name, flag)
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "systemd" / "airflow.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    from airflow_spot.production import WORKER_SETTINGS

    for key, value in WORKER_SETTINGS.items():
        assert env.get(key) == str(value), key
