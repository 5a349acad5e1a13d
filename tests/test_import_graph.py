"""No file-level import circle among the product's modules (a circle hid behind a TYPE_CHECKING
import between evaluation/comparison.py and its CSV writer until issue #37), and no import that
climbs from a lower layer to a higher one (trainer/ imported cli/ until issue #48)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("replay", "openrlhf_replay", "evaluation", "infra", "benchmarks")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of other product modules, at any depth of its code (TYPE_CHECKING
    blocks and imports inside functions included)."""
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_product_has_no_import_circle():
    assert circles(import_graph()) == []


# What each lower part must not import: the pure core nothing of the rest; the method (trainer/) and
# what it reads prompt files with (datasets/) not what drives them (the launcher, the rehearsal, the
# CPU platform); evaluation/ and infra/ stand beside the integration and below it.
DRIVERS = ("openrlhf_replay.cli", "openrlhf_replay.rehearsal", "openrlhf_replay.cpu", "benchmarks")
FORBIDDEN = {
    "replay": ("openrlhf_replay", "evaluation", "infra", "benchmarks"),
    "openrlhf_replay.trainer": DRIVERS,
    "openrlhf_replay.datasets": DRIVERS + ("openrlhf_replay.trainer",),
    "evaluation": ("openrlhf_replay", "benchmarks"),
    "infra": ("replay", "openrlhf_replay", "evaluation", "benchmarks"),
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_climbs_from_a_lower_layer():
    graph = import_graph()
    climbs = sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                    for lower, higher in FORBIDDEN.items()
                    if _within(source, lower) and any(_within(target, h) for h in higher))
    assert climbs == []


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
