"""The package's layering, derived from the source: every import of every module (at module level
or inside a function) is an edge; the rules of docs/reference/architecture.md are checked on
that graph."""

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "psa_edge"
# Subpackage or top-level module -> the units it may import (transitively closed below).
LAYERS = {
    "__init__": set(), "errors": set(), "contract": {"errors", "__init__"},
    "io": {"errors", "contract"},
    "tokenizer": {"errors", "io"}, "display": {"io"}, "theory": set(),
    "model": {"errors", "io", "contract", "tokenizer"}, "tasks": {"errors", "__init__"},
    "backends": {"errors", "io", "contract", "model"},
    "runtime": {"errors", "io", "contract", "backends", "tokenizer", "__init__"},
    "train": {"errors", "io", "model", "tasks", "tokenizer", "__init__"},
    "checks": {"errors", "io", "contract", "model", "tasks", "backends", "runtime",
               "tokenizer"},
    "hf": {"errors", "io", "contract", "model", "tokenizer"},
    "export": {"errors", "io", "contract", "model", "tasks", "checks", "tokenizer", "hf"},
    "certify": {"theory", "model"},
    # The measurement lab beside bench's CLI: not in the device bundle, nothing below uses it.
    "lab": {"errors", "io", "contract", "backends", "runtime", "tokenizer"},
}
TOP = {"cli", "demo"}  # may import anything
# model.config: the CLI checks preset and variant names with it before it imports torch.
TORCH_FREE = {"errors", "contract", "io", "tokenizer", "display", "theory", "tasks", "runtime",
              "backends.base", "backends.onnxruntime", "model.config", "hf.gguf"}
# Torch-free at import: torch only inside the functions that build the eager reference.
TORCH_LAZY = {"checks", "cli", "demo"}
DEVICE_FORBIDDEN = {"export", "model", "train", "checks", "backends.eager"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every module this file imports, at any depth of its code (psa_edge modules resolved to
    the module itself, `from pkg import module` included; others by their top name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name if a.name.startswith("psa_edge") else a.name.split(".")[0]
                      for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if not node.module.startswith("psa_edge"):
                found.add(node.module.split(".")[0])
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found


def unit(module: str) -> str:
    """The layer unit of a psa_edge module: its subpackage, or the top-level module's name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {i for i in imports(p, set(mods)) if i.startswith("psa_edge")} - {m}
            for m, p in mods.items()}


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[str]:
    return sorted(node for node in graph if node in closure(graph, node))


def test_no_import_cycle_among_modules():
    assert cycles(graph()) == []


def test_no_import_cycle_among_subpackages_and_each_layer_imports_only_below():
    units: dict[str, set[str]] = {}
    for module, deps in graph().items():
        units.setdefault(unit(module), set()).update(unit(d) for d in deps)
    for name, deps in units.items():
        deps.discard(name)
        if name in TOP:
            continue
        assert name in LAYERS, f"psa_edge.{name} has no place in the layering"
        assert deps <= LAYERS[name], f"psa_edge.{name} imports {sorted(deps - LAYERS[name])}"
    assert cycles(units) == []


def test_device_runtime_never_reaches_export_model_train_or_torch():
    g, mods = graph(), modules()
    for module in (m for m in g if unit(m) == "runtime"):
        reached = closure(g, module) | {module}
        bad = {m for m in reached if unit(m) in DEVICE_FORBIDDEN or
               m.removeprefix("psa_edge.") in DEVICE_FORBIDDEN}
        assert not bad, f"{module} reaches {sorted(bad)}"
        torch_users = {m for m in reached if m != "psa_edge.backends.executorch"
                       and "torch" in imports(mods[m], set(mods))}
        assert not torch_users, f"{module} reaches torch through {sorted(torch_users)}"


def test_torch_only_where_allowed():
    mods = modules()
    for module, path in mods.items():
        name = module.removeprefix("psa_edge.")
        if name in TORCH_FREE or unit(module) in TORCH_FREE:
            assert "torch" not in imports(path, set(mods)), f"{module} imports torch"
        if unit(module) in TORCH_LAZY:
            top = [n for n in ast.parse(path.read_text()).body
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
            names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(n.split(".")[0] == "torch" for n in names), f"{module} imports torch"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_every_module_states_its_contract(path):
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no docstring"


def test_nothing_points_outside_the_repository():
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        path = REPO / name
        if path.suffix in (".png", ".pt") or not path.is_file():
            continue
        assert ".." + "/shared" not in path.read_text(errors="ignore"), name


def test_every_python_line_fits_in_100_characters():
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    long = [f"{name}:{number}" for name in tracked
            for number, line in enumerate((REPO / name).read_text().splitlines(), 1)
            if len(line) > 100]
    assert not long, long
