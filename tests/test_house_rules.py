"""The house's rules for the product's code (issue #48): no file over 450 lines, no function over
60. A file that nears the limit is split where it divides by responsibility, not squeezed under
it. The tests themselves are not held to this."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("replay", "openrlhf_replay", "evaluation", "infra", "benchmarks")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_file_is_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_FILE_LINES}
    assert not long, f"over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_the_limit():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from `def` to its last line, decorators aside
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"
