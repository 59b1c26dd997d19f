"""The README is for users and true: at most 15 KB, every command in it run here (its walk and,
in tests/test_clients.py, its client commands) or by CI itself (`make demo`, `make test`); and
`tools/`, which regenerates the results pages, stays small, imports only the package's public
API and its own `common`, and every tool at least starts (`--help`), so a refactor of the
package cannot break one silently."""

import ast
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO

README = REPO / "README.md"
TOOLS = sorted(p for p in (REPO / "tools").glob("*.py"))
# The package's public API (docs/reference/architecture.md): what tools and users import.
PUBLIC = {
    "psa_edge", "psa_edge.errors", "psa_edge.contract", "psa_edge.io", "psa_edge.tokenizer",
    "psa_edge.display", "psa_edge.theory", "psa_edge.model", "psa_edge.model.config",
    "psa_edge.model.checkpoint", "psa_edge.model.ops", "psa_edge.tasks", "psa_edge.tasks.text",
    "psa_edge.train.trainer", "psa_edge.export.pipeline", "psa_edge.export.quantize",
    "psa_edge.checks", "psa_edge.checks.verify", "psa_edge.runtime.bench",
    "psa_edge.runtime.generate", "psa_edge.runtime.session", "psa_edge.runtime.speculative",
    "psa_edge.lab.bench",
}


def shell_commands(text: str) -> list[str]:
    """The lines of every ```sh block, comments cut."""
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.split("#")[0].strip()]


def test_the_readme_is_short_and_every_command_in_it_runs_here_or_in_ci():
    text = README.read_text()
    assert len(text.encode()) <= 15_000
    walk = text.split("<!-- walk:begin -->")[1].split("<!-- walk:end -->")[0]
    clients = text.split("## In other clients")[1].split("```python")[0]
    others = [c for c in shell_commands(text)
              if c not in shell_commands(walk) + shell_commands(clients)]
    assert others == ["make demo", "make test"]  # CI runs both (.ci/run, test_cli's demo)
    assert len(shell_commands(clients)) == 3  # tests/test_clients.py runs them (`shipped`)


def test_the_readmes_walk_runs_as_written(tmp_path, monkeypatch):
    """Each command of the walk, in order, from a folder holding the shipped models; in this
    process (the CLI's own app), which saves a torch import per command: 38 s as 8 processes."""
    from typer.testing import CliRunner

    from psa_edge.cli import app

    (tmp_path / "models").symlink_to(REPO / "models")
    monkeypatch.chdir(tmp_path)
    walk = README.read_text().split("<!-- walk:begin -->")[1].split("<!-- walk:end -->")[0]
    commands = shell_commands(walk)
    assert len(commands) >= 6
    for command in commands:
        argv = shlex.split(command)
        if argv[:2] == ["mkdir", "-p"]:
            (tmp_path / argv[2]).mkdir(parents=True)
            continue
        assert argv[0] == ".venv/bin/psa-edge", command
        result = CliRunner().invoke(app, argv[1:])
        assert result.exit_code == 0, f"{command}\n{result.output[-800:]}{result.exception!r}"
    assert (tmp_path / "out" / "walk" / "bundle" / "README.md").exists()


def tool_imports(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_tools_import_only_the_public_api_and_common():
    tool_names = {p.stem for p in TOOLS}
    for path in TOOLS:
        for module in tool_imports(path):
            if module in tool_names:
                assert module == "common", f"{path.name} imports the tool {module}"
            elif module.startswith("psa_edge"):
                assert module in PUBLIC, f"{path.name} imports {module}, not public API"


def test_tools_are_at_most_30_percent_of_the_package():
    lines = lambda paths: sum(len(p.read_text().splitlines()) for p in paths)  # noqa: E731
    tools, package = lines(TOOLS), lines((REPO / "psa_edge").rglob("*.py"))
    assert tools <= 0.30 * package, f"tools {tools} lines, package {package}"


@pytest.mark.parametrize("tool", [p for p in TOOLS if p.stem != "common"], ids=lambda p: p.stem)
def test_every_tool_starts(tool):
    result = subprocess.run([sys.executable, str(tool), "--help"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr[-500:]


def test_every_relative_link_in_the_docs_resolves():
    """The README, docs/ and models/README.md link only to files that exist (the docs were
    moved into reference/, results/ and history/)."""
    pages = [README, REPO / "models" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = [f"{page.relative_to(REPO)}: {target}" for page in pages
              for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
              if not target.startswith(("http:", "https:", "mailto:"))
              and not (page.parent / target).exists()]
    assert not broken, broken
