"""The pure core imports nothing heavy."""

from __future__ import annotations

import pytest

from airflow_spot.testing import modules_loaded

FORBIDDEN = ("airflow", "kubernetes", "kubernetes_asyncio", "boto3", "botocore", "numpy")


@pytest.mark.parametrize(
    "module", ["airflow_spot.policy", "airflow_spot.ledger", "airflow_spot.exceptions"]
)
def test_core_imports_no_airflow_kubernetes_boto3(module: str) -> None:
    """Importing a core module loads none of Airflow, Kubernetes, boto3 or numpy."""
    bad = sorted(m for m in modules_loaded(f"import {module}") if m.split(".")[0] in FORBIDDEN)
    assert bad == [], f"{module} pulled in {bad}"


def test_core_never_reads_the_clock() -> None:
    """No module of the pure core calls time.time, datetime.now or similar: time is an argument."""
    from pathlib import Path

    import airflow_spot

    root = Path(airflow_spot.__file__).parent
    sources = list((root / "policy").glob("*.py")) + [root / "ledger.py"]
    for src in sources:
        text = src.read_text()
        for needle in ("time.time(", "datetime.now(", "utcnow(", "monotonic(", "perf_counter("):
            assert needle not in text, f"{src.name} reads the clock via {needle}"


def test_core_reads_no_environment_and_no_caller_sets_its_globals() -> None:
    """The pure core reads no environment variable, and nothing outside it steers it through a
    module global (the plan cache folder is passed in: ``get_policy(name, plan_cache=...)``)."""
    import ast
    from pathlib import Path

    import airflow_spot

    root = Path(airflow_spot.__file__).parent
    for src in [*(root / "policy").rglob("*.py"), root / "ledger.py"]:
        for needle in ("os.environ", "getenv(", "environ.get("):
            assert needle not in src.read_text(), f"{src.name} reads the environment via {needle}"
    for src in root.rglob("*.py"):
        tree = ast.parse(src.read_text())
        aliases = {  # names bound to a module of the pure core in this file
            (a.asname or a.name)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names
            if f"{getattr(node, 'module', '') or ''}.{a.name}".lstrip(".").startswith(
                "airflow_spot.policy"
            )
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                        assert t.value.id not in aliases, (
                            f"{src}:{node.lineno} sets {t.value.id}.{t.attr}"
                        )


def test_a_plan_cache_reaches_the_policy_only_from_its_caller(tmp_path) -> None:
    from airflow_spot.policy import get_policy

    assert get_policy("deadline_aware").plan_cache is None
    assert get_policy("deadline_aware", plan_cache=str(tmp_path)).plan_cache == str(tmp_path)


def test_policy_import_and_construction_leave_the_planner_unloaded() -> None:
    """Parsing a DAG imports the policies and builds one to validate its name; the
    availability model and the solver load only at the first decision."""
    new = modules_loaded("from airflow_spot.policy import get_policy; get_policy('deadline_aware')")
    assert new & {"airflow_spot.policy.plan", "airflow_spot.policy.hazard", "numpy"} == set()
