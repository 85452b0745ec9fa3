"""The layout's limits: no module import cycles, chatfleet imports inside functions only where
they break a cycle (at most 10), no source module over 600 lines, and a `chatfleet --help`
that lists every command without importing one, and no matplotlib but for drawing."""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import subprocess
import sys
from pathlib import Path

import grimp
import typer.main
from typer import _click as click
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.cli.app import COMMANDS, LazyGroup

SRC = Path(__file__).resolve().parents[1] / "src" / "chatfleet"
MAX_FUNCTION_IMPORTS = 10
MAX_LINES = 600


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def function_level_imports() -> list[str]:
    """`path:line module` of every chatfleet import inside a function body."""
    found: set[tuple[str, int, str]] = set()
    for path in sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                elif isinstance(node, ast.ImportFrom):  # relative: always inside chatfleet
                    names = ["chatfleet"]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] == "chatfleet":
                        found.add((str(path.relative_to(SRC)), node.lineno, name))
    return [f"{p}:{line} {name}" for p, line, name in sorted(found)]


def test_chatfleet_imports_inside_functions_are_at_most_ten() -> None:
    found = function_level_imports()
    assert len(found) <= MAX_FUNCTION_IMPORTS, "\n".join(found)


def test_the_counter_sees_imports_in_nested_functions_and_methods(tmp_path: Path) -> None:
    src = ("import chatfleet\n"
           "def f():\n    from chatfleet.core import specs\n"
           "    def g():\n        import chatfleet.io\n"
           "class C:\n    async def m(self):\n        from chatfleet import io\n"
           "        import json\n")
    tree = ast.parse(src)
    inner = [n for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
             for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert {n.lineno for n in inner} == {3, 5, 8, 9}  # the walk the count relies on


def module_cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
    return out


def test_no_module_import_cycles() -> None:
    """Type-checking imports count: a cycle that only the types close is still one."""
    assert module_cycles(grimp.build_graph("chatfleet")) == []


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e")):
        graph.add_import(importer=a, imported=b)
    assert module_cycles(graph) == [{"p.a", "p.b", "p.c"}]


def test_no_source_module_over_600_lines() -> None:
    large = {str(p.relative_to(SRC)): n for p in sources()
             if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert large == {}


def test_help_lists_every_command_without_importing_one() -> None:
    probe = ("import json, sys\n"
             "from typer.testing import CliRunner\n"
             "from chatfleet.cli import app\n"
             "res = CliRunner().invoke(app, ['--help'])\n"
             "assert res.exit_code == 0, res.output\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('chatfleet.'))))\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    # chatfleet._native: `import chatfleet` checks the compiled core (chatfleet/_native.py)
    assert json.loads(res.stdout) == ["chatfleet._native", "chatfleet.cli", "chatfleet.cli.app"]


def help_page(root: click.Command) -> str:
    """What `chatfleet --help` prints through this root group."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert root.main(["--help"], prog_name="chatfleet", standalone_mode=False) == 0
    return out.getvalue()


def test_the_lazy_help_page_is_the_loaded_one() -> None:
    """Each command's summary is the first paragraph of its own help: the page a loaded root
    prints is the page the lazy root prints."""
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)
    lazy = help_page(root)
    for spec in COMMANDS:
        cmd = root.commands[spec.name]  # loads it
        assert inspect.cleandoc(cmd.help or "").split("\n\n")[0] == spec.summary, spec.name
    assert help_page(root) == lazy
    assert all(f" {spec.name} " in lazy for spec in COMMANDS)


def test_a_command_runs_and_a_typo_is_answered_through_the_lazy_root() -> None:
    res = CliRunner().invoke(app, ["plan", "--gpu", "l4", "--json"])
    assert res.exit_code == 0, res.output
    assert "kv_pool_tokens" in res.output
    typo = CliRunner().invoke(app, ["plna"])
    assert typo.exit_code == 2
    assert "Did you mean 'plan'?" in typo.output


def test_only_drawing_imports_matplotlib() -> None:
    # the options every command shares read sweeps through chatfleet.report.load; the report
    # package's own module imports nothing, so a plan or a twin run does not load matplotlib
    # (0.3 s) before its work starts
    code = ("import sys, chatfleet.cli.plan, chatfleet.cli.twin, chatfleet.report.load; "
            "print('matplotlib' in sys.modules); import chatfleet.report.build; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["False", "True"]
