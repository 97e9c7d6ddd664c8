"""The import graph of ``airflow_spot``: no import cycles, and imports point only down the layers.

The graph is read from the source with :mod:`ast` (nothing is imported, so it is fast and
sees imports that a given run never executes):

* module-level and function-level imports (a function-level import still runs, later);
* ``import a.b.c``, ``from a.b import c`` (``c`` a submodule: an edge to ``a.b.c``; ``c`` a
  name: an edge to ``a.b``, the package's ``__init__.py``), ``from . import x`` and other
  relative imports;
* importing ``a.b.c`` first runs the packages ``a`` and ``a.b`` (their ``__init__.py``), so an
  importer outside ``a.b`` also gets an edge to ``a.b`` ("implicit" below). An importer inside
  ``a.b`` does not: Python has already put its parent packages in ``sys.modules`` when it runs,
  so a package ``__init__`` importing its own submodules, and those importing each other, is
  no cycle through the ``__init__``. An explicit ``from a.b import name`` inside ``a.b`` still
  is an edge to ``a.b`` (it reads a name from a package that may be half initialised);
* imports under ``if TYPE_CHECKING:`` never run, so they create no runtime cycle: they are left
  out of the cycle check. They are still dependencies of the design, so the layer check
  counts them (a violation that is TYPE_CHECKING-only is marked as such).
"""

from __future__ import annotations

import ast
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "airflow_spot"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Top to bottom. A module may import from its own layer or from a layer below it, never above.
# Entries are module paths relative to the package: a package ("operators") covers itself and
# everything under it, a module ("cli") only itself.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("shell", ("operators", "sensors", "plugins", "cli")),  # Airflow-facing shell
    ("watch", ("triggers", "hooks")),  # async watching, clients built lazily
    ("backends", ("backends.local", "backends.kubernetes")),  # where an attempt runs
    ("checkpoint", ("checkpoint",)),  # used inside training containers too
    ("simulate", ("simulate",)),
    ("core", ("policy", "ledger", "exceptions")),  # pure core
]

# Every module the table above does not cover, placed by hand. A new module that neither the
# table nor this dict covers fails test_every_module_has_a_layer: place it here.
PLACED: dict[str, tuple[str, str]] = {
    "": ("core", "the package root: version and provider metadata, imports nothing of ours"),
    "jobstate": ("core", "the job's stored state as plain dataclasses over ledger and policy"),
    "durations": ("core", "parses durations (parse_hours), needs only exceptions"),
    "timeline": ("core", "draws a ledger summary with matplotlib, imports nothing of ours"),
    "bundled": ("core", "names the bundled trace files, standard library only"),
    "production": ("core", "deployment settings; the Celery config built on first use"),
    "backends": ("backends", "the backends package __init__: re-exports backends.base"),
    "backends.base": ("backends", "the Backend protocol and attempt status every backend shares"),
    "backends.capacity": ("backends", "spot availability decided for the turn and the watcher"),
    "backends.signals": ("backends", "one piece of evidence of spot's state, from one source"),
    "backends.registry": ("backends", "a backend from its settings (the watcher rebuilds it)"),
    "demo": ("shell", "`make demo`: runs the example DAG with dag.test(), a user of everything"),
    "demo_gang": ("shell", "`make demo-gang`: a 4-rank gang through the operator, a user"),
    "testing": ("shell", "test doubles, ours and users': re-exports the common fakes"),
    "testing.fakes": ("shell", "test doubles for task state and Airflow context, markets"),
    "testing.memory": ("shell", "an in-memory checkpoint store, over checkpoint/ only"),
    "testing.faults": ("shell", "a fault-injecting HTTP proxy for tests and chaos runs"),
    "testing.disks": ("shell", "a local checkpoint store whose writes fail as a full disk"),
    "testing.clock": ("shell", "a wall clock put off by libfaketime, for skewed deployments"),
    "testing.cluster": ("shell", "a real control plane for tests: re-exports its parts"),
    "testing.cluster.plane": ("shell", "starts etcd, apiserver, controllers, kwok (processes)"),
    "testing.cluster.autoscaler": ("shell", "the autoscaler status ConfigMap, as it is written"),
    "testing.cluster.pki": ("shell", "certificates for that control plane, cryptography only"),
    "testing.cluster.kubelet": ("shell", "runs bound pods as processes; the cloud's reclaims"),
    "testing.cluster.looks": (
        "shell",
        "a test's looks at an attempt on that cluster, as the operator looks",
    ),
    "testing.cluster.karpenter": ("shell", "runs Karpenter's kwok provider against that plane"),
    "testing.cluster.pytest_plugin": ("shell", "pytest fixtures over the control plane"),
    "settings": ("core", "the provider's settings: Airflow's configuration read on call"),
    "decorators": ("checkpoint", "the TaskFlow package, empty: the training process enters it"),
    "decorators.spot_training": ("shell", "@task.spot_training: a subclass of the operator"),
    "decorators.source": ("shell", "a decorated function's checks and payload, for the shell"),
    "decorators.entry": ("checkpoint", "runs the function in the training process: no Airflow"),
    "decorators.result": ("checkpoint", "the function's return value, kept in the store"),
    "examples": ("shell", "the examples package, empty"),
    "examples.dags.spot_training_demo": ("shell", "an example DAG: builds the operator"),
    "examples.dags.spot_training_taskflow": ("shell", "an example DAG: @task.spot_training"),
    "examples.dags.spot_training_evaluate": ("shell", "an example DAG on the model Asset"),
    "examples.train_logreg": (
        "checkpoint",
        "the example training script runs inside the container: checkpoint/ and below only",
    ),
    "examples.train_ddp": (
        "checkpoint",
        "the gang's example training script (each rank's container): checkpoint/ and JAX",
    ),
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    type_checking: bool  # only under `if TYPE_CHECKING:`
    in_function: bool  # inside a def (runs when called)
    implicit: bool  # a parent package of what was named, which runs first

    def describe(self) -> str:
        notes = [
            n
            for n, on in (
                ("TYPE_CHECKING", self.type_checking),
                ("in a function", self.in_function),
                ("implicit: package __init__ runs first", self.implicit),
            )
            if on
        ]
        return f"{self.src}:{self.line} -> {self.dst}" + (f" ({', '.join(notes)})" if notes else "")


@dataclass
class Graph:
    modules: dict[str, Path]  # dotted name -> file
    packages: set[str]  # dotted names whose file is an __init__.py
    edges: list[Edge]
    unresolved: list[str]  # imports of this package's names that name no module


def discover(root: Path, package: str) -> tuple[dict[str, Path], set[str]]:
    """Every module under ``root`` (the package's folder), by dotted name. Folders without an
    ``__init__.py`` are namespace packages: their modules count, the folder itself is no module."""
    modules: dict[str, Path] = {}
    packages: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        modules[".".join(parts)] = path
    return modules, packages


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module):
    """(node, under TYPE_CHECKING, inside a function) for every import statement in the file.
    Only statements are walked (an import is a statement; expressions hold none)."""
    stack: list[tuple[ast.stmt, bool, bool]] = [(s, False, False) for s in tree.body]
    while stack:
        node, tc, fn = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, tc, fn
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((s, True, fn) for s in node.body)
            stack.extend((s, tc, fn) for s in node.orelse)  # the else branch runs
            continue
        in_fn = fn or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for name in ("body", "orelse", "finalbody"):
            stack.extend((s, tc, in_fn) for s in getattr(node, name, ()))
        for part in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
            stack.extend((s, tc, in_fn) for s in part.body)  # except / except* / case


def build_graph(root: Path, package: str = PACKAGE) -> Graph:
    modules, packages = discover(root, package)
    edges: list[Edge] = []
    unresolved: list[str] = []

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    for mod, path in modules.items():
        tree = ast.parse(path.read_bytes(), filename=str(path))
        own_pkg = mod if mod in packages else mod.rpartition(".")[0]
        parts = mod.split(".")
        mine = {".".join(parts[:i]) for i in range(1, len(parts))}  # mod's parent packages
        for node, tc, fn in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if ours(a.name)]
            else:
                if node.level:
                    base_parts = own_pkg.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if not ours(base):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    # `from pkg import sub`: the submodule (pkg runs first, an implicit edge
                    # below); `from pkg import name` or `*`: the package's own module
                    targets.append(sub if sub in modules else base)
            for target in dict.fromkeys(targets):
                if target not in modules:
                    unresolved.append(f"{mod}:{node.lineno} imports {target}, which is no module")
                    continue
                if target != mod:
                    edges.append(Edge(mod, target, node.lineno, tc, fn, False))
                tparts = target.split(".")
                for i in range(1, len(tparts)):
                    parent = ".".join(tparts[:i])
                    if parent != mod and parent not in mine and parent in modules:
                        edges.append(Edge(mod, parent, node.lineno, tc, fn, True))
    return Graph(modules, packages, edges, unresolved)


def _sccs(nodes: list[str], adj: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(adj.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj.get(w, ()))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def find_cycles(graph: Graph) -> list[list[Edge]]:
    """Import cycles at runtime (TYPE_CHECKING imports left out), each as a path of edges.
    For every edge inside a strongly connected component, the shortest cycle through it, so
    every edge that takes part in a cycle shows in at least one; duplicates (rotations) once."""
    # imports under `if TYPE_CHECKING:` never run: they create no runtime cycle, so they are
    # left out here (the layer check still counts them)
    runtime = [e for e in graph.edges if not e.type_checking]
    first: dict[tuple[str, str], Edge] = {}  # one edge per (src, dst), the earliest line
    for e in sorted(runtime, key=lambda e: (e.implicit, e.line)):
        first.setdefault((e.src, e.dst), e)
    adj: dict[str, list[str]] = {}
    for s, d in sorted(first):
        adj.setdefault(s, []).append(d)
    cycles: list[list[Edge]] = []
    seen: set[tuple[str, ...]] = set()
    for comp in _sccs(sorted(graph.modules), adj):
        members = set(comp)
        for u in comp:
            for v in adj.get(u, ()):
                if v not in members:
                    continue
                # shortest path v -> u inside the component, then u -> v closes it
                prev: dict[str, str | None] = {v: None}
                queue = deque([v])
                while queue and u not in prev:
                    x = queue.popleft()
                    for y in adj.get(x, ()):
                        if y in members and y not in prev:
                            prev[y] = x
                            queue.append(y)
                path = [u]
                while path[-1] != v:
                    path.append(prev[path[-1]])  # type: ignore[arg-type]
                nodes = [*reversed(path)]  # v ... u
                k = nodes.index(min(nodes))
                key = tuple(nodes[k:] + nodes[:k])
                if key in seen:
                    continue
                seen.add(key)
                ring = list(key) + [key[0]]
                cycles.append([first[(a, b)] for a, b in zip(ring, ring[1:], strict=False)])
    return sorted(cycles, key=lambda c: (len(c), [e.src for e in c]))


def layer_of(
    module: str,
    package: str = PACKAGE,
    layers: list[tuple[str, tuple[str, ...]]] = LAYERS,
    placed: dict[str, tuple[str, str]] = PLACED,
) -> str | None:
    rel = module.removeprefix(package).removeprefix(".")
    if rel in placed:
        return placed[rel][0]
    best: tuple[int, str] | None = None  # the longest matching table entry
    for name, prefixes in layers:
        for p in prefixes:
            if (rel == p or rel.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), name)
    return best[1] if best else None


def layer_violations(
    graph: Graph,
    package: str = PACKAGE,
    layers: list[tuple[str, tuple[str, ...]]] = LAYERS,
    placed: dict[str, tuple[str, str]] = PLACED,
) -> list[str]:
    rank = {name: i for i, (name, _) in enumerate(layers)}  # 0 is the top
    found: dict[tuple[str, str], list[Edge]] = {}
    for e in graph.edges:
        ls, ld = layer_of(e.src, package, layers, placed), layer_of(e.dst, package, layers, placed)
        if ls is None or ld is None:
            continue  # reported by test_every_module_has_a_layer
        if rank[ld] < rank[ls]:
            found.setdefault((e.src, e.dst), []).append(e)
    out = []
    for (s, d), es in sorted(found.items()):
        ls, ld = layer_of(s, package, layers, placed), layer_of(d, package, layers, placed)
        tc_only = " [TYPE_CHECKING only]" if all(e.type_checking for e in es) else ""
        lines = "; ".join(e.describe() for e in sorted(es, key=lambda e: e.line))
        out.append(f"{s} ({ls}) imports {d} ({ld}){tc_only}: {lines}")
    return out


def format_cycle(cycle: list[Edge]) -> str:
    hops = [
        f"{e.src}:{e.line}"
        + (" (in a function)" if e.in_function else "")
        + (" (implicit: package __init__)" if e.implicit else "")
        for e in cycle
    ]
    return " -> ".join(hops + [cycle[0].src])


@pytest.fixture(scope="module")
def graph() -> Graph:
    began = time.perf_counter()
    g = build_graph(ROOT)
    # about 0.5 s on a busy 2-core machine (parsing is most of it); the margin keeps CI steady
    assert time.perf_counter() - began < 2.0, "reading the import graph must stay fast"
    assert len(g.modules) > 50 and g.edges, "the graph found no modules or no imports"
    return g


def test_every_module_has_a_layer(graph: Graph):
    missing = [m for m in graph.modules if layer_of(m) is None]
    assert not missing, (
        "modules with no layer: add each to PLACED (or the LAYERS table) in "
        f"{Path(__file__).name} with a one-line reason: {missing}"
    )
    stale = [
        k for k in PLACED if (f"{PACKAGE}.{k}" if k else PACKAGE) not in graph.modules
    ]  # a placement for a module that is gone hides nothing, but misleads
    assert not stale, f"PLACED names modules that do not exist: {stale}"
    names = {n for n, _ in LAYERS}
    assert all(layer in names for layer, _ in PLACED.values())


def test_every_import_resolves(graph: Graph):
    """An import of one of our names that is no module would be missed by both checks below
    (and fails at runtime)."""
    assert not graph.unresolved, "\n".join(graph.unresolved)


def test_no_import_cycles(graph: Graph):
    cycles = find_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(map(format_cycle, cycles))


def test_imports_point_down_the_layers(graph: Graph):
    found = layer_violations(graph)
    assert not found, f"{len(found)} import(s) up the layers:\n" + "\n".join(found)


# -- the checker itself can fail ---------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_cycle_and_an_upward_import(tmp_path: Path):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            # a function-level cycle: a -> b (in a function) -> a (relative)
            "shell/__init__.py": "from pkg.shell.a import A\n",
            "shell/a.py": "def f():\n    import pkg.shell.b\nA = 1\n",
            "shell/b.py": "from . import a\n",
            # a cycle through a package __init__: c imports a name from pkg.util, whose
            # __init__ imports c
            "shell/c.py": "from pkg.util import helper\n",
            "util/__init__.py": "from pkg.shell import c\nhelper = 1\n",
            # upward: core imports shell; a TYPE_CHECKING-only cycle, which is no runtime cycle
            "core/__init__.py": "",
            "core/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.core import y\n",
            "core/y.py": "from pkg.core import x\nfrom ..shell.a import A\n",
            # a package __init__ importing its own submodules, which import each other: fine
            "core/z/__init__.py": "from pkg.core.z import p\n",
            "core/z/p.py": "from pkg.core.z.q import Q\n",
            "core/z/q.py": "Q = 1\n",
        },
    )
    g = build_graph(tmp_path / "pkg", "pkg")
    assert not g.unresolved
    cycles = {tuple(e.src for e in c) for c in find_cycles(g)}
    assert cycles == {
        ("pkg.shell.a", "pkg.shell.b"),
        ("pkg.shell.c", "pkg.util"),
    }, cycles
    layers = [("shell", ("shell", "util")), ("core", ("core",))]
    placed = {"": ("core", "root")}
    found = layer_violations(g, "pkg", layers, placed)
    assert [v.split(":")[0] for v in found] == [
        "pkg.core.y (core) imports pkg.shell (shell)",  # implicit: shell/__init__.py runs first
        "pkg.core.y (core) imports pkg.shell.a (shell)",
    ], found
    assert "implicit" in found[0]
    assert layer_of("pkg.new", "pkg", layers, placed) is None  # unplaced: a failure upstream


def test_checker_sees_every_import_form(tmp_path: Path):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "m.py": (
                "import pkg.a\n"
                "import pkg.b as bee\n"
                "from pkg import c\n"
                "from pkg.d import name\n"
                "from . import e\n"
                "from .f import g\n"
                "async def h():\n    from pkg import nope\n"
                "try:\n    import pkg.i\nexcept ImportError:\n    import pkg.j\n"
                "class K:\n    with open(__file__):\n        import pkg.k\n"
                "match 1:\n    case 1:\n        import pkg.l\n"
                "import os, json\n"
            ),
            **{f"{n}.py": "" for n in "abcdeijkl"},
            "f/__init__.py": "",
            "f/g.py": "",
        },
    )
    g = build_graph(tmp_path / "pkg", "pkg")
    got = {(e.dst, e.in_function, e.implicit) for e in g.edges if e.src == "pkg.m"}
    assert got == {
        ("pkg.a", False, False),
        ("pkg.b", False, False),
        ("pkg.c", False, False),
        ("pkg.d", False, False),
        ("pkg.e", False, False),
        ("pkg.f.g", False, False),
        ("pkg.f", False, True),  # pkg/f/__init__.py runs before pkg.f.g
        ("pkg.i", False, False),
        ("pkg.j", False, False),
        ("pkg.k", False, False),
        ("pkg.l", False, False),
        ("pkg", True, False),  # `from pkg import nope`: nope is a name of pkg/__init__.py
    }, got
