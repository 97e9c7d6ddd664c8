"""The real test cluster run from an installed package (no ``tools/k8s/build.sh`` beside it)
without its binaries: starting it fails, and its pytest fixtures skip, each saying what it
needs; in a checkout nothing changes (the build script is there to run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_spot.testing.cluster import karpenter, plane, pytest_plugin


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """As in a wheel: no build script where a checkout has one, and an empty binaries cache."""
    monkeypatch.setattr(plane, "_BUILD", tmp_path / "site-packages/tools/k8s/build.sh")
    monkeypatch.setattr(karpenter, "_BUILD", plane._BUILD)
    monkeypatch.delenv(plane.BIN_ENV, raising=False)
    monkeypatch.setenv(plane.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / plane.VERSION / "bin"


def test_the_checkout_has_the_build_script() -> None:
    """Run from this checkout, the plane can build what is missing."""
    assert plane.in_checkout()


def test_starting_the_plane_outside_a_checkout_says_what_it_needs(installed: Path) -> None:
    """The error names the folder looked in, the binaries missing, and how to build them."""
    with pytest.raises(plane.ControlPlaneError) as e:
        plane.ensure_binaries()
    msg = str(e.value)
    assert msg.startswith(f"Kubernetes binaries missing from {installed}: etcd, kube-apiserver")
    assert "only a checkout builds them: git clone https://github.com/" in msg
    assert "tools/k8s/build.sh" in msg and "$AIRFLOW_SPOT_K8S_CACHE" in msg
    with pytest.raises(plane.ControlPlaneError, match="karpenter-kwok.*only a checkout builds"):
        karpenter.ensure_karpenter()


def test_the_fixtures_skip_outside_a_checkout(installed: Path, tmp_path_factory) -> None:
    """``kube_control_plane`` and ``karpenter`` skip, with the same words, before starting."""
    with pytest.raises(pytest.skip.Exception, match="only a checkout builds them"):
        next(pytest_plugin.kube_control_plane(tmp_path_factory))
    with pytest.raises(pytest.skip.Exception, match="karpenter-kwok.*only a checkout builds"):
        next(pytest_plugin.karpenter(None))  # type: ignore[arg-type]
