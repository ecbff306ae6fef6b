"""The dependency rule of docs/architecture.md, checked on the code's real imports (parsed
with ast, never executed), and the repository's self-containment: no tracked file refers
to a document outside it."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "openjev"

# Which parts of the package each part may import (docs/architecture.md, the layer table).
# A part is a subpackage (core, engines, ...) or a top-level module (config, errors, cli, ...).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "config": {"errors", "core"},  # the core's names a setting is checked against (readouts)
    "core": {"errors"},
    "calibrations": {"core", "errors"},
    "engines": {"core", "config", "errors"},
    "api": {"core", "engines", "config", "errors", "calibrations", "openjev"},
    "evals": {"api", "core", "config", "engines", "errors"},
}
# Inside api/, which group may import which (docs/architecture.md, the groups of api/): the
# contract knows nothing of the server around it; operations and identity serve the
# server; only the server assembles them all.
API_ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "operations": {"contract"},
    "identity": {"contract", "operations"},
    "server": {"contract", "operations", "identity"},
}
# Third-party packages that only these parts may import.
CONFINED = {
    "pydantic": {"api"},
    "fastapi": {"api"},
    "fastapi_offline": {"api"},
    "starlette": {"api"},
    "torch": {"engines"},
    "transformers": {"engines"},
}


def part_of(module: str) -> str:
    """`openjev.core.plan` -> `core`, `openjev.config` -> `config`, `openjev` -> `openjev`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, nested ones included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from openjev import calibrations` imports a module: count it as that module.
            found += [
                (node.lineno, f"{target}.{alias.name}" if is_module(f"{target}.{alias.name}") else target)
                for alias in node.names
            ]
    return found


def is_module(name: str) -> bool:
    """Whether `name` is a module or package of openjev."""
    if name.split(".")[0] != "openjev":
        return False
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def all_imports() -> list[tuple[str, int, str, str]]:
    """(importing part, line, imported module, file) for every module of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = part_of(module_name(path))
        rel = str(path.relative_to(ROOT))
        out += [(part, line, target, rel) for line, target in imports_of(path)]
    return out


def test_the_rule_reads_real_imports():
    # Guards the guard: a parser that found nothing would pass every rule below.
    edges = {(part, part_of(t)) for part, _, t, _ in all_imports() if t.split(".")[0] == "openjev"}
    assert ("engines", "core") in edges and ("api", "engines") in edges and ("cli", "api") in edges
    assert any(t == "torch" or t.startswith("torch.") for part, _, t, _ in all_imports() if part == "engines")


def test_each_layer_imports_only_the_layers_below_it():
    wrong = [
        f"{file}:{line}: {part} imports {target}"
        for part, line, target, file in all_imports()
        if target.split(".")[0] == "openjev"
        and part in ALLOWED
        and part_of(target) != part
        and part_of(target) not in ALLOWED[part]
    ]
    assert not wrong, "imports against the dependency rule (docs/architecture.md):\n" + "\n".join(wrong)


def group_of(module: str) -> str | None:
    """`openjev.api.server.app` -> `server`; None outside api/ or for api/__init__."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "api" else None


def test_api_has_only_its_groups():
    loose = sorted(p.name for p in (PACKAGE / "api").glob("*.py") if p.name != "__init__.py")
    groups = sorted(p.name for p in (PACKAGE / "api").iterdir() if (p / "__init__.py").is_file())
    assert not loose, f"modules of api/ outside its groups: {loose}"
    assert groups == sorted(API_ALLOWED)


def test_each_group_of_the_api_imports_only_the_groups_it_may():
    wrong = []
    for path in sorted((PACKAGE / "api").rglob("*.py")):
        group = group_of(module_name(path))
        if group is None:
            continue
        for line, target in imports_of(path):
            other = group_of(target)
            if other is not None and other != group and other not in API_ALLOWED[group]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {group} imports {target}")
    assert not wrong, "imports across api/'s groups against the rule (docs/architecture.md):\n" + "\n".join(wrong)


def import_graph() -> dict[str, set[str]]:
    """Module -> the openjev modules it imports (a package counts as its __init__)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        graph[name] = {t for _, t in imports_of(path) if is_module(t) and t != name}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            nxt = todo.pop()
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                stack.append((nxt, sorted(graph.get(nxt, ()))))
                path.append(nxt)
                on_path.add(nxt)
    return None


def test_the_cycle_finder_finds_a_cycle():
    # Guards the guard: a finder that never finds one would pass the test below.
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert len(import_graph()) > 50 and sum(map(len, import_graph().values())) > 100


def test_the_import_graph_has_no_cycle():
    # Imports inside functions count too: a circle hidden in a function is still a circle.
    cycle = cycle_in(import_graph())
    assert cycle is None, "an import circle: " + " -> ".join(cycle or [])


def test_the_core_uses_the_standard_library_only():
    wrong = [
        f"{file}:{line}: {target}"
        for part, line, target, file in all_imports()
        if part == "core" and target.split(".")[0] not in sys.stdlib_module_names | {"openjev"}
    ]
    assert not wrong, "the core is stdlib-only:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_frameworks_stay_in_their_layer(package):
    wrong = [
        f"{file}:{line}: {target}"
        for part, line, target, file in all_imports()
        if target.split(".")[0] == package and part not in CONFINED[package]
    ]
    assert not wrong, f"{package} is only for {sorted(CONFINED[package])}:\n" + "\n".join(wrong)


# Documents that live outside the repository (the project's starting notes): a clone does
# not have them, so nothing in it may point at them. Built from parts so that this file
# does not match itself.
OUTSIDE = re.compile(
    "|".join(
        [
            re.escape("../" + "shared"),
            re.escape("shared" + "/docs"),
            re.escape("/work/" + "shared"),
            r"(?<![\w-])" + re.escape("jev-" + "contract.md"),
            r"(?<![\w-])" + re.escape("design" + ".md"),
        ]
    )
)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in listed.split("\0") if name]


def test_no_tracked_file_refers_outside_the_repository():
    files = tracked_files()
    assert any(f.name == "README.md" for f in files)
    wrong = []
    for path in files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (images), or deleted but not yet staged
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                wrong.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not wrong, "references to documents outside the repository:\n" + "\n".join(wrong)


MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def too_long(path: Path, root: Path = ROOT) -> list[str]:
    """The module itself if over MAX_MODULE_LINES, and its functions over MAX_FUNCTION_LINES
    (from `def` to their last line, decorators aside)."""
    text = path.read_text()
    rel = path.relative_to(root)
    count = len(text.splitlines())
    out = [f"{rel}: {count} lines"] if count > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{node.lineno}: {node.name} is {lines} lines")
    return out


def test_the_size_check_finds_a_long_function_and_a_long_module(tmp_path):
    # Guards the guard: a measure that never finds one would pass the test below.
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "f.py").write_text(f"def f():\n{body}\n")
    assert too_long(tmp_path / "f.py", tmp_path) == [f"f.py:1: f is {MAX_FUNCTION_LINES + 1} lines"]
    (tmp_path / "m.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert too_long(tmp_path / "m.py", tmp_path) == [f"m.py: {MAX_MODULE_LINES + 1} lines"]


def test_modules_and_functions_stay_small():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in too_long(path)]
    assert not found, "over the bounds (docs/architecture.md):\n" + "\n".join(found)


def test_no_settings_are_built_outside_config_to_read_a_default():
    # A default is read from its section (config/sections.py), never from a Settings() made for it.
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if part_of(module_name(path)) == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")).endswith(
                "Settings"
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "Settings built outside config/:\n" + "\n".join(wrong)


def test_the_engines_never_import_the_registry_back():
    """The registry (engines/__init__.py) imports each family only inside its entries'
    functions, so that importing it costs no ML framework; an engine module that imported a
    name from it would close a loop through those deferred imports. What a loader returns
    lives in engines/loaded.py."""
    registry_names = {
        node.name if isinstance(node, ast.ClassDef | ast.FunctionDef) else ""
        for node in ast.parse((PACKAGE / "engines" / "__init__.py").read_text()).body
    } - {""}
    assert "load_engine" in registry_names  # guards the guard
    back = []
    for path in sorted((PACKAGE / "engines").rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE / "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "openjev.engines":
                names = [a.name for a in node.names if not is_module(f"openjev.engines.{a.name}")]
                back += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names]
    assert not back, "engine modules importing from the registry:\n" + "\n".join(back)


ENGINE_FAMILIES = ("torch", "http", "llamacpp")


def test_engine_families_stand_apart():
    """engines/ by family: a family (torch/, http/, llamacpp/) imports no other family, and
    models/ (where a model comes from) and the shared modules import none; what two
    families share lives beside them (models/, prefix_cache.py, worker_inbox.py, loaded.py)."""
    engines = PACKAGE / "engines"
    assert all((engines / f / "__init__.py").exists() for f in ENGINE_FAMILIES)  # guards the guard
    crossing = []
    for path in sorted(engines.rglob("*.py")):
        rel = path.relative_to(engines).parts
        if rel == ("__init__.py",):
            continue  # the registry: imports every family, lazily
        own = rel[0] if len(rel) > 1 else None
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                parts = target.split(".")
                if parts[:2] != ["openjev", "engines"] or len(parts) < 3:
                    continue
                family = parts[2]
                if family in ENGINE_FAMILIES and family != own:
                    crossing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}")
    assert not crossing, "engine modules importing another family:\n" + "\n".join(sorted(set(crossing)))


def declares(cls: type, port: type) -> bool:
    """Whether `cls` declares `port` (subclasses it) in a module whose imports the graph reads."""
    graph = import_graph()
    return port in cls.__mro__ and port.__module__ in graph.get(cls.__module__, set())


async def test_what_the_service_calls_at_run_time_is_declared_where_the_graph_sees_it():
    """The app wires admission into the service at run time; what the service then calls
    through its engine port (admission's gate, around the loaded engine) and the admission
    itself must be declared implementations of the core's ports, so that every call the
    core makes upward at run time is an arrow of the import graph (implementation -> port),
    not a climb that only the wiring knows."""
    from openjev.core.ports import Admission, Engine
    from openjev.core.service import DecisionService
    from tests.api.conftest import running_app

    async with running_app() as (client, engine):
        app = client._transport.app  # the app behind running_app's in-process client
        service: DecisionService = app.state.runtime.service
        gate = service._engine  # the object the core calls for every plan
        admission = app.state.ops.admission
        assert gate is admission.gated and gate.inner is engine  # guards the guard: the gate is wired
        assert declares(type(gate), Engine), f"{type(gate).__qualname__} does not declare core.ports.Engine"
        assert declares(type(admission), Admission), f"{type(admission).__qualname__} does not declare Admission"


# Modules that may hold a ContextVar, each with why: none may carry the caller, which is one
# value made at the door and passed as an argument (core/caller.py, api/identity/caller.py).
CONTEXT_VARS_ALLOWED: dict[str, str] = {}


def context_vars(path: Path) -> list[int]:
    """Lines of `path` that import `contextvars` or name a `ContextVar`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name == "contextvars" for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "contextvars":
            found.append(node.lineno)
        elif isinstance(node, ast.Name | ast.Attribute) and "ContextVar" in (
            getattr(node, "id", None),
            getattr(node, "attr", None),
        ):
            found.append(node.lineno)
    return sorted(set(found))


def test_the_context_var_finder_finds_one(tmp_path):
    # Guards the guard: a finder that never finds one would pass the test below.
    (tmp_path / "a.py").write_text("from contextvars import ContextVar\nwho: ContextVar[str] = ContextVar('who')\n")
    (tmp_path / "b.py").write_text("import contextvars\nwho = contextvars.ContextVar('who')\n")
    (tmp_path / "c.py").write_text("def f(caller):\n    return caller\n")
    assert context_vars(tmp_path / "a.py") == [1, 2]
    assert context_vars(tmp_path / "b.py") == [1, 2]
    assert context_vars(tmp_path / "c.py") == []


def test_no_context_variable_carries_the_caller():
    """The caller is explicit: made once at the door, passed as an argument to the service
    and to everything that charges, isolates or orders work by caller; no module keeps it
    (or anything else) in a ContextVar, but those allowed above with their reason."""
    found = [
        f"{rel}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (rel := str(path.relative_to(ROOT))) not in CONTEXT_VARS_ALLOWED
        for line in context_vars(path)
    ]
    assert not found, "a ContextVar (pass the caller as an argument, core/caller.py):\n" + "\n".join(found)
    stale = [rel for rel in CONTEXT_VARS_ALLOWED if not (ROOT / rel).is_file() or not context_vars(ROOT / rel)]
    assert not stale, f"allowed but holding no ContextVar: {stale}"


def calls_without_caller(path: Path, methods: tuple[str, ...] = ("decide", "run_admitted")) -> list[int]:
    """Lines of `path` that call `.decide(...)` or `.run_admitted(...)` without `caller=`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
            if not any(k.arg == "caller" for k in node.keywords):
                found.append(node.lineno)
    return found


def test_the_api_names_the_caller_of_every_decision(tmp_path):
    """The service's caller defaults to the anonymous one (a process with no keys: tests,
    tools); at the edge every decision names its caller, so none is served uncharged."""
    (tmp_path / "a.py").write_text("service.decide(request)\nservice.decide(request, caller=c)\n")
    assert calls_without_caller(tmp_path / "a.py") == [1]  # guards the guard
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((PACKAGE / "api").rglob("*.py"))
        for line in calls_without_caller(path)
    ]
    assert not found, "a decision without its caller (pass caller=):\n" + "\n".join(found)


def name_lists(path: Path, names: set[str]) -> list[int]:
    """Lines of `path` that write a tuple, list or set of three or more of `names`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            values = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(values & names) >= 3:
                found.append(node.lineno)
    return found


def test_the_readout_names_are_written_once():
    """`READOUT_NAMES` (core/readouts/spec.py) is the one list of readout names: the settings'
    check, the headers, the docs' enum and `openjev eval` read it; a second copy would let
    them drift."""
    from openjev.core.readouts import READOUT_NAMES

    names = set(READOUT_NAMES)
    where = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py")) if (lines := name_lists(p, names))}
    assert "src/openjev/core/readouts/spec.py" in where  # guards the guard: the list itself is found
    assert list(where) == ["src/openjev/core/readouts/spec.py"], f"readout names written again: {where}"


def test_every_readout_name_has_its_builder():
    """The readout recipe (docs/architecture.md): a name in `READOUT_NAMES` and its family's
    `build` in `BUILDERS` (core/readouts/catalog.py), one entry each."""
    from openjev.core.readouts import READOUT_NAMES
    from openjev.core.readouts.catalog import BUILDERS

    assert sorted(BUILDERS) == sorted(READOUT_NAMES)


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_each_engine_family_imports_alone(family):
    """The engine recipe (docs/architecture.md): a family's every module imports in a fresh
    interpreter, and brings no other family with it (what families share lives beside them)."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"import openjev.engines.{family} as fam\n"
        f"for m in pkgutil.iter_modules(fam.__path__): importlib.import_module('openjev.engines.{family}.' + m.name)\n"
        "print(' '.join(sorted({n.split('.')[2] for n in sys.modules if n.startswith('openjev.engines.') and n.count('.') >= 2})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(out.stdout.split())
    assert family in loaded  # guards the guard: the family itself was imported
    assert not loaded & (set(ENGINE_FAMILIES) - {family}), f"{family} brings {sorted(loaded & set(ENGINE_FAMILIES))}"
