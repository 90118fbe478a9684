"""The package's shape, read from its source (AST): the parts import each other one way only,
lazy imports inside functions included, and ``models/`` is a leaf that does no file I/O."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "paddle_sam"

# the parts from the bottom up: each may import only parts listed before it
LAYERS = [
    {"_version", "_runtime"},
    {"models"},
    {"convert"},
    {"predict"},
    {"export", "align"},
    {"deploy"},
    {"loading"},
    {"train", "serve", "label"},
    {"cli"},
    {"__main__"},
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}
# the drop-in API on top: the package root and the modules that mirror upstream's import paths
# (segment_anything.modeling, segment_anything.utils, sam3's visualization_utils). They may
# import anything, and no part but another mirror imports them.
MIRRORS = {"modeling", "utils", "visualization_utils"}
TOP = {"__init__"} | MIRRORS
RANK.update(dict.fromkeys(TOP, len(LAYERS)))

# calls that read or write files; a model layer gets tensors, never paths
FILE_IO_CALLS = {
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "load",  # paddle.load, np.load, json.load, pickle.load
    "save",  # paddle.save, np.save
    "loadtxt",
    "savetxt",
    "fromfile",
    "tofile",
    "imread",
    "imwrite",
}


# Each source file parsed once, while the tests are collected. CPython 3.11 counts the AST
# constructor's recursion depth in shared state, so a parse that overlaps one in another thread
# (a thread an earlier test left running) can fail with "AST constructor recursion depth
# mismatch"; at collection time no test has started a thread yet.
TREES = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _part(dotted: list[str]) -> str:
    """``paddle_sam.serve.app`` -> ``serve``; the package's own ``__init__`` -> ``__init__``."""
    return dotted[1] if len(dotted) > 1 else "__init__"


def _imports(path: Path):
    """(line, imported paddle_sam module as a list of names) of every import in a file."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(TREES[path]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "paddle_sam":
                    yield node.lineno, alias.name.split(".")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                base = base + (node.module.split(".") if node.module else [])
            elif (node.module or "").split(".")[0] == "paddle_sam":
                base = node.module.split(".")
            else:
                continue
            if len(base) == 1:  # from paddle_sam import x: x may be a part
                for alias in node.names:
                    sub = PACKAGE / alias.name
                    is_part = sub.is_dir() or sub.with_suffix(".py").is_file()
                    yield node.lineno, base + ([alias.name] if is_part else [])
            else:
                yield node.lineno, base


def _edges() -> dict[tuple[str, str], str]:
    """``{(importer part, imported part): "file:line"}`` between different parts."""
    edges: dict[tuple[str, str], str] = {}
    for path in TREES:
        src = _part(_module_name(path))
        for line, target in _imports(path):
            dst = _part(target)
            if dst != src:
                edges.setdefault((src, dst), f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def test_every_part_has_a_layer():
    parts = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    missing = sorted(parts - set(RANK))
    assert not missing, f"parts without a layer in LAYERS: {missing}"


def test_parts_import_downwards_only():
    upward = [
        f"{where}: {src} imports {dst}"
        for (src, dst), where in _edges().items()
        if src not in TOP and RANK[dst] >= RANK[src]
    ]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_drop_in_modules_are_imported_by_no_other_part():
    """The upstream-path mirrors are for users: neither the layers below nor the package root
    import them (``import paddle_sam`` stays lean); only another mirror may."""
    offending = [
        f"{where}: {src} imports {dst}"
        for (src, dst), where in _edges().items()
        if dst in MIRRORS and src not in MIRRORS
    ]
    assert not offending, "imports of the drop-in modules:\n" + "\n".join(offending)


def test_no_import_cycle_between_parts():
    edges = _edges()
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            n = todo.pop()
            for m in graph.get(n, ()):
                if m == b:
                    return True
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return False

    nodes = sorted(set(graph) | {d for v in graph.values() for d in v})
    cycles = [
        (a, b) for a, b in itertools.combinations(nodes, 2) if reaches(a, b) and reaches(b, a)
    ]
    assert not cycles, f"parts in an import cycle: {cycles}"


def test_utils_package_imports_nothing_eagerly():
    """``import paddle_sam.utils`` must work without any of its modules (onnx among them)."""
    tree = TREES[PACKAGE / "utils" / "__init__.py"]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


@pytest.mark.parametrize("path", sorted((PACKAGE / "models").rglob("*.py")), ids=lambda p: p.name)
def test_models_are_a_leaf_without_file_io(path):
    """Models import only models and the process-wide CPU settings (``_runtime``: thread
    counts, no files), and read or write no files."""
    problems = []
    for line, target in _imports(path):
        if _part(target) not in {"models", "_runtime"}:
            problems.append(f"line {line}: imports {'.'.join(target)}")
    for node in ast.walk(TREES[path]):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in FILE_IO_CALLS:
                problems.append(f"line {node.lineno}: calls {name}()")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for mod in mods:
                if (mod or "").split(".")[0] in {"gzip", "pickle", "shutil", "tempfile", "zipfile"}:
                    problems.append(f"line {node.lineno}: imports {mod}")
    assert not problems, f"{path.relative_to(PACKAGE.parent)}:\n" + "\n".join(problems)


def _module_file(dotted: list[str]) -> Path | None:
    """The file of a ``paddle_sam`` module path (a package's ``__init__.py``), or None when the
    path names something else (a function or class imported from a module)."""
    base = PACKAGE.parent.joinpath(*dotted)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _file_edges() -> dict[Path, dict[Path, int]]:
    """``{importer: {imported file: line}}`` between the package's files, lazy imports
    included; ``from pkg import name`` counts as an import of ``pkg/name.py`` where that file
    exists, else of ``pkg``."""
    edges: dict[Path, dict[Path, int]] = {}
    for path in TREES:
        here = _module_name(path)
        package = here if path.name == "__init__.py" else here[:-1]
        for node in ast.walk(TREES[path]):
            targets: list[list[str]] = []
            if isinstance(node, ast.Import):
                targets = [a.name.split(".") for a in node.names if a.name.startswith("paddle_sam")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    base = base + (node.module.split(".") if node.module else [])
                elif (node.module or "").split(".")[0] == "paddle_sam":
                    base = node.module.split(".")
                else:
                    continue
                for alias in node.names:
                    sub = base + [alias.name]
                    targets.append(sub if _module_file(sub) is not None else base)
            for dotted in targets:
                target = _module_file(dotted)
                if target is not None and target != path:
                    edges.setdefault(path, {}).setdefault(target, node.lineno)
    return edges


def test_no_two_files_import_each_other():
    """No import circle between files, direct or through others (Tarjan's strongly connected
    components of the file graph): each file can be read knowing only what it imports."""
    edges = _file_edges()
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    circles: list[list[Path]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in sorted(TREES):
        if v not in index:
            visit(v)
    lines = []
    for component in circles:
        members = set(component)
        for a in sorted(component):
            for b, line in sorted(edges.get(a, {}).items()):
                if b in members:
                    rel = a.relative_to(PACKAGE.parent)
                    lines.append(f"{rel}:{line} imports {b.relative_to(PACKAGE.parent)}")
        lines.append("")
    assert not circles, "files in an import circle:\n" + "\n".join(lines)
