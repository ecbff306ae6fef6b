"""The package's layout in numbers: folders (modules, lines), the largest modules and the
longest functions (a nested function counts in its parent too).

    .venv/bin/python scripts/layout.py [REPO_ROOT] [--top N]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=Path(__file__).resolve().parents[1], type=Path)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    package = args.root / "src" / "openjev"
    modules = sorted(package.rglob("*.py"))
    lines = {m: len(m.read_text().splitlines()) for m in modules}
    folders: dict[str, list[int]] = {}
    for m in modules:
        counts = folders.setdefault(str(m.parent.relative_to(package.parent)) + "/", [0, 0])
        counts[0] += 1
        counts[1] += lines[m]
    print("folders (modules, lines):")
    for folder, (count, total) in sorted(folders.items()):
        print(f"  {folder:34} {count:3} {total:6}")
    print(f"{args.top} largest modules (lines):")
    for m in sorted(modules, key=lambda m: -lines[m])[: args.top]:
        print(f"  {lines[m]:5}  {m.relative_to(package.parent)}")
    print(f"{args.top} longest functions (lines):")
    for length, where in sorted(functions(modules, package.parent), reverse=True)[: args.top]:
        print(f"  {length:5}  {where}")


def functions(modules: list[Path], base: Path) -> list[tuple[int, str]]:
    """(length in lines, "path:line Class.name") of every function and method."""
    found = []
    for m in modules:
        stack: list[tuple[ast.AST, str]] = [(ast.parse(m.read_text()), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = prefix + child.name
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    found.append((length, f"{m.relative_to(base)}:{child.lineno} {name}"))
                    stack.append((child, name + "."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, prefix + child.name + "."))
    return found


if __name__ == "__main__":
    main()
