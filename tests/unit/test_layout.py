"""The package layout's rules, checked from the source: core/ imports without torch, kernels/ does
not import the runtime, no two files import each other (directly or around a loop), files stay small."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import radixrt

PACKAGE_DIR = pathlib.Path(radixrt.__file__).parent
# "about 300": a file past this is two concepts, unless it says why in a LONG_FILE note
MAX_LINES = 320
MAX_FUNCTION_LINES = 60  # a function longer than this does more than one job (kernels excepted)


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}


def type_checking_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (type names only: never run)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def imported_modules(path: pathlib.Path, type_checking: bool = True) -> set[str]:
    """Every radixrt module a file imports, anywhere in it (function-level imports count too;
    those under `if TYPE_CHECKING:` unless type_checking is False)."""
    found: set[str] = set()
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else type_checking_imports(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("radixrt"):
                found.add(name)
    return found


GRAPH = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
# what runs: a type-only import back into a module that imports this one is not a cycle
RUN_GRAPH = {name: imported_modules(path, False) - {name} for name, path in MODULES.items()}


def test_the_subpackages_exist():
    for sub in ("core", "model", "constrained", "constrained.json_schema", "serving", "request",
                "engine"):  # fmt: skip
        assert f"radixrt.runtime.{sub}" in MODULES, sub


def test_runtime_top_level_keeps_at_most_six_modules():
    """The rest lives in subsystems a newcomer can find: request/, engine/, core/, model/..."""
    top = [p.name for p in (PACKAGE_DIR / "runtime").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 6, sorted(top)


def test_core_imports_without_torch():
    """Every module of radixrt.runtime.core imports in a process where torch cannot be imported."""
    core = sorted(n for n in MODULES if n.startswith("radixrt.runtime.core"))
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {core!r}:\n"
        "    __import__(m)\n"
        "assert not any(k == 'torch' or k.startswith('torch.') for k in sys.modules), 'torch got imported'\n"
        "print('ok', len(sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-2000:]
    assert len(core) >= 10


def reachable(name: str) -> dict[str, str]:
    """Every radixrt module `name` imports by any path (function-level imports too), each with the
    module that imports it."""
    seen: dict[str, str] = {}
    stack = [name]
    while stack:
        n = stack.pop()
        for dep in GRAPH.get(n, ()):
            if dep not in seen and dep != name:
                seen[dep] = n
                stack.append(dep)
    return seen


def imports_torch(name: str) -> bool:
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "torch" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            return True
    return False


def test_core_reaches_no_torch_by_any_path():
    """Function-level imports too (the subprocess test only runs module-level ones): no module that
    core imports, directly or through others, imports torch."""
    for name in MODULES:
        if name.startswith("radixrt.runtime.core"):
            for dep, importer in {name: name, **reachable(name)}.items():
                assert not imports_torch(dep), f"{name} reaches torch through {importer} -> {dep}"


def test_imports_reach_torch_finds_a_lazy_path():
    assert imports_torch("radixrt.runtime.model.model_runner")
    assert "radixrt.runtime.model.model_runner" in reachable(
        "radixrt.runtime.engine.scheduler_factory"
    )


@pytest.mark.parametrize(
    "importer, forbidden",
    [
        ("radixrt.runtime.model", "radixrt.runtime.serving"),  # the runner knows no server
        ("radixrt.runtime.model", "radixrt.runtime.constrained"),  # masks come as data
        ("radixrt.runtime.serving", "radixrt.frontend"),  # the server needs no DSL
        ("radixrt.runtime.core", "radixrt.runtime.model"),
        ("radixrt.runtime.core", "radixrt.runtime.constrained"),  # grammars are handed in
        ("radixrt.runtime.core", "radixrt.kernels"),
    ],
)
def test_arrows_run_one_way(importer, forbidden):
    bad = [
        (name, dep)
        for name in MODULES
        if name.startswith(importer)
        for dep in GRAPH[name]
        if dep == forbidden or dep.startswith(forbidden + ".")
    ]
    assert not bad, bad


@pytest.mark.parametrize(
    "forbidden", ["radixrt.runtime.model", "radixrt.runtime.constrained", "radixrt.kernels"]
)
def test_core_reaches_neither_model_nor_constrained_by_any_path(forbidden):
    """Grammars and the runner are handed in (engine/scheduler_factory.py): no import chain from
    core, through request/ or messages.py say, leads to them."""
    bad = {
        (name, dep, importer)
        for name in MODULES
        if name.startswith("radixrt.runtime.core")
        for dep, importer in reachable(name).items()
        if dep == forbidden or dep.startswith(forbidden + ".")
    }
    assert not bad, sorted(bad)


def test_kernels_do_not_import_the_runtime():
    for name in MODULES:
        if name.startswith("radixrt.kernels"):
            bad = {d for d in GRAPH[name] if d.startswith("radixrt.runtime")}
            assert not bad, (name, bad)


def test_frontend_does_not_import_torch():
    for name, path in MODULES.items():
        if name.startswith("radixrt.frontend"):
            assert "import torch" not in path.read_text(), name


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports between modules (a package importing its own submodule is not one)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if n.startswith(d + "."):  # a module importing its package's __init__: not a file cycle
                continue
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycles_between_files():
    assert find_cycle(RUN_GRAPH) is None, find_cycle(RUN_GRAPH)


def test_type_checking_imports_are_left_out_of_the_run_graph():
    """core/req.py names BeamGroup, whose module imports req.py, only for type checking."""
    req, beams = "radixrt.runtime.core.req", "radixrt.runtime.core.beam_group"
    assert beams in GRAPH[req] and beams not in RUN_GRAPH[req]
    assert req in RUN_GRAPH[beams]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_files_stay_small():
    too_long = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any("LONG_FILE:" in line for line in lines[:30]):
            too_long.append((name, len(lines)))
    assert not too_long, too_long


def test_functions_stay_short():
    too_long = []
    for name, path in MODULES.items():
        if name.startswith("radixrt.kernels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append((name, node.name, n))
    assert not too_long, too_long
