"""``airflow_spot.testing`` works from a wheel installed without the dev extra: every module of
it imports, and the real test cluster, which a wheel cannot build, says what it needs.

The fresh venv gets the wheel (installed by pip) and, on its path, exactly the files of the
distributions the wheel's own requirements bring (their closure, read from the metadata of
this environment's installs, extras and markers as pip evaluates them): the same pins as
``requirements.lock``, without a network or minutes of installing, and without pytest, moto
or kmock, which the test checks are not importable there.
"""

from __future__ import annotations

import email
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEV_ONLY = ("pytest", "_pytest", "moto", "kmock", "ruff", "mypy", "matplotlib")

IMPORT_ALL = """
import importlib, importlib.util, json, os, pkgutil, tempfile
import airflow_spot.testing as t
names = [t.__name__] + [m.name for m in pkgutil.walk_packages(t.__path__, t.__name__ + ".")]
for name in names:
    importlib.import_module(name)
from airflow_spot.testing.cluster.plane import ControlPlaneError, ensure_binaries
os.environ["AIRFLOW_SPOT_K8S_CACHE"] = tempfile.mkdtemp()  # an empty cache: nothing built
try:
    ensure_binaries()
    error = None
except ControlPlaneError as e:
    error = str(e)
dev = [m for m in DEV_ONLY if importlib.util.find_spec(m) is not None]
print(json.dumps({"file": t.__file__, "names": names, "dev": dev, "error": error}))
"""


def _wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of the tree (the build writes nothing into the checkout)."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", ".demo", "build", "*.egg-info", "__pycache__", "docs", "tests"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("airflow_provider_spot-*.whl")
    return wheel


def _closure(requires: list[str]) -> dict[str, md.Distribution]:
    """The installed distributions that ``requires`` brings, transitively, as pip resolves
    them: markers evaluated, the extras a requirement names followed, no others."""
    found: dict[str, md.Distribution] = {}
    extras: dict[str, set[str]] = {}
    todo = [(req, "") for req in requires]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in found and req.extras <= extras[name]:
            continue
        found[name] = dist = md.distribution(req.name)
        extras.setdefault(name, set()).update(req.extras)
        for sub in dist.requires or []:
            todo += [(sub, e) for e in ("", *req.extras)]
    return found


def _link_files(dists: dict[str, md.Distribution], into: Path) -> int:
    """Link every file each distribution installed (its RECORD) into ``into``, as laid out in
    site-packages (scripts outside it left out); how many."""
    n = 0
    for name, dist in dists.items():
        assert dist.files is not None, f"{name} has no RECORD: its files are unknown"
        for rel in dist.files:
            if rel.parts[0] == ".." or "__pycache__" in rel.parts:
                continue
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                dest.symlink_to(dist.locate_file(rel))
                n += 1
    return n


def test_the_wheel_imports_every_testing_module_without_the_dev_extra(tmp_path: Path) -> None:
    """Installed from its wheel into a fresh venv that holds only what the wheel requires,
    ``airflow_spot.testing`` and each of its modules import (none needs a dev package), and
    the test cluster, with no binaries and no checkout to build them, fails saying what it
    needs and where from."""
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
        + ["--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    needs = email.message_from_bytes(meta).get_all("Requires-Dist") or []
    dists = _closure([r for r in needs if "extra ==" not in r])  # no extra: no dev
    assert not {canonicalize_name(m) for m in DEV_ONLY} & set(dists), sorted(dists)
    deps = tmp_path / "deps"
    assert _link_files(dists, deps) > 1000
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    (site / "deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AIRFLOW_SPOT"))}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow_home")
    out = subprocess.run(
        [str(python), "-c", f"DEV_ONLY = {DEV_ONLY!r}\n{IMPORT_ALL}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), got["file"]  # the wheel's, not the checkout's
    assert got["dev"] == []
    package = ROOT / "airflow_spot" / "testing"
    modules = {
        ".".join(
            ("airflow_spot", *p.relative_to(ROOT / "airflow_spot").with_suffix("").parts)
        ).removesuffix(".__init__")
        for p in package.rglob("*.py")
    }
    assert set(got["names"]) == modules
    assert "only a checkout builds them" in got["error"]
    assert "tools/k8s/build.sh" in got["error"] and "AIRFLOW_SPOT_K8S_CACHE" in got["error"]
