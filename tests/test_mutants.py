"""scripts/mutants.py finds a mutant's place by its tokens: a reformat or a
reworded comment in the code it targets moves no mutant (no edit of
mutants.py), while other code is not taken for it."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "scripts" / "mutants.py").is_file():
    pytest.skip("no scripts/ beside the tests", allow_module_level=True)
sys.path.insert(0, str(ROOT / "scripts"))
import mutants  # noqa: E402

sys.path.pop(0)


def reworded(text, span, python):
    """`text` with its `span` reformatted: every run of blanks in it a line
    break, a comment and an indent, as a formatter and a rewording might leave it."""
    note = "  # reworded\n    " if python else " // reworded\n    "
    start, end = span
    return text[:start] + re.sub(r"[ \t]+", note, text[start:end]) + text[end:]


@pytest.mark.parametrize("name", [m.name for m in mutants.MUTANTS if m.file.endswith(("tile_bodies.h", "launch.cpp"))])
def test_a_reformatted_and_reworded_place_is_found_once(name):
    m = next(m for m in mutants.MUTANTS if m.name == name)
    python = m.file.endswith(".py")
    text = (ROOT / m.file).read_text()
    (span,) = mutants.place(text, m.old, python)
    assert len(mutants.place(reworded(text, span, python), m.old, python)) == 1, name


def test_a_place_is_code_not_a_substring():
    text = "int first = 1; // first\nint firstly = 2;\n"
    assert mutants.place(text, "first = 1;") == [(4, 14)]
    assert mutants.place(text, "irst = 1;") == []  # not inside a name
    assert mutants.place("a = b  # c\n", "a=b", python=True) == [(0, 5)]
