"""Measured figures live in docs/design.md ("Measured choices") or profiles/<gpu>/, which the code cites: a
timing pasted into a comment goes stale with the next kernel change, so the code's comments keep the reasons."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A time or a rate: what a measurement gives.
FIGURE = re.compile(r"\b\d+(\.\d+)?\s?(us|ms|T[BG]/s|TFLOPS?(/s)?)(?![\w/])")
SOURCES = [p for folder in ("kernels", "dsactl") for p in sorted((ROOT / folder).rglob("*"))
           if p.suffix in (".py", ".cu", ".cuh") and "kernels" not in p.relative_to(ROOT).parts[1:]]


def _comments(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    if path.suffix in (".cu", ".cuh"):
        return [(n, line.split("//", 1)[1]) for n, line in enumerate(text.splitlines(), 1) if "//" in line]
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and (doc := ast.get_docstring(node)):
            found += [(node.body[0].lineno, line) for line in doc.splitlines()]
    return found


def test_the_sources_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"kernels/attention/hopper_mla.cu", "kernels/attention/dispatch.py", "dsactl/results.py"} <= names


def test_comments_cite_measurements_instead_of_holding_them():
    found = [f"{p.relative_to(ROOT)}:{n}: {text.strip()[:100]}" for p in SOURCES for n, text in _comments(p)
             if FIGURE.search(text)]
    assert not found, "\n".join(found)
