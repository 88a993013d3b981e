"""Dependencies point one way (README, "Layout"): each package imports only the packages of
the project below it. Checked twice: every module of a package imported in a fresh process
(what actually loads, transitive imports included), and every import statement in its
source, those inside functions too (a lazy import loads only when its function runs)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "search", "store", "workers", "api", "deploy", "migrations")
# What each package may import of the others (a dotted name: that module, and its package
# only as the way to reach it).
ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "search": {"kernels"},
    "store": {"kernels"},
    "workers": {"search", "kernels", "store"},
    "api": {"workers", "search", "kernels", "store"},
    "deploy": {"kernels", "api.client", "api.plan"},
    "migrations": {"store"},
}
# Modules that run only inside another program (Alembic's env reads Alembic's context) or as
# one (`python -m deploy`).
NOT_IMPORTABLE = {"migrations.env", "deploy.__main__"}
# The README promises that kernels imports without a GPU library.
ALSO_FORBIDDEN = {"kernels": {"cupy", "torch"}}

PROBE = """
import importlib, json, pkgutil, sys
pkg, skip = sys.argv[1], set(json.loads(sys.argv[2]))
mod = importlib.import_module(pkg)
names = [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".") if m.name not in skip]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def allowed(pkg: str, module: str) -> bool:
    """May `pkg` import `module` (a dotted name)?"""
    top = module.split(".")[0]
    if top not in PACKAGES or top == pkg:
        return True
    rules = ALLOWED[pkg]
    if top in rules:
        return True
    # A module allowed by dotted name: it, what it contains, and its parent packages.
    return any(module == r or module.startswith(r + ".") or r.startswith(module + ".")
               for r in rules)


def test_the_rules_match_what_the_readme_states() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert ("Dependencies point one way: `api` uses `workers`, and both use `search`, "
            "`kernels` and `store`; `search` and `store` use `kernels`; `deploy` uses "
            "`kernels`, `api.client` and `api.plan`; `migrations` uses `store`; `kernels` "
            "imports none of them") in text


@pytest.mark.parametrize("pkg", PACKAGES)
def test_importing_a_package_loads_none_it_must_not_use(pkg: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, pkg, json.dumps(sorted(NOT_IMPORTABLE))],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if pkg != "migrations":
        assert len(result["imported"]) >= 3, result["imported"]  # it did walk the package
    loaded = result["modules"]
    wrong = [m for m in loaded if not allowed(pkg, m)]
    assert not wrong, f"importing {pkg} loads {wrong}"
    extra = ALSO_FORBIDDEN.get(pkg, set())
    assert not [m for m in loaded if m.split(".")[0] in extra]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement in a file, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            # `from api import client` imports the module api.client.
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if node.module in PACKAGES]
    return out


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_statement_reaches_a_package_it_must_not_use(pkg: str) -> None:
    files = sorted((ROOT / pkg).rglob("*.py"))
    assert files
    wrong = [f"{f.relative_to(ROOT)}:{line} imports {module}"
             for f in files for line, module in _imports(f) if not allowed(pkg, module)]
    assert not wrong


def test_the_checks_catch_a_lazy_import() -> None:
    """What kernels/runtime.py once did (an API client imported inside a function) is
    caught; deploy may import api.client, and nothing else of api."""
    tree = "def f():\n    from api.client import Client\n    return Client\n"
    node = ast.parse(tree)
    names = [n.module for n in ast.walk(node) if isinstance(n, ast.ImportFrom)]
    assert names == ["api.client"]
    assert not allowed("kernels", "api.client")
    assert allowed("deploy", "api.client") and allowed("deploy", "api")
    assert not allowed("deploy", "api.app") and not allowed("deploy", "workers.tasks")
    assert allowed("api", "workers.embedded") and not allowed("workers", "api.schemas")


# Query construction belongs to store/ (store/repository.py and store/hotpath.py): outside it
# a module may hold a session or a connection, not build statements. The one exception is
# the health check's `SELECT 1` round trip.
QUERY_BUILDERS = {"select", "insert", "update", "delete", "func", "text", "and_", "or_"}
QUERY_EXCEPTIONS = {("api/routes/health.py", "text")}


def test_queries_are_built_only_in_the_store() -> None:
    wrong = []
    for pkg in PACKAGES:
        if pkg in ("store", "migrations"):
            continue
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(f.relative_to(ROOT))
            for node in ast.walk(ast.parse(f.read_text(), rel)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                        "sqlalchemy"):
                    wrong += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names
                              if a.name in QUERY_BUILDERS
                              and (rel, a.name) not in QUERY_EXCEPTIONS]
    assert not wrong
