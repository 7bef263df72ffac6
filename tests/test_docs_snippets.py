"""Every code block of README.md and docs/**/*.md runs as pasted, and the outputs shown match.

The runner reads each page's fenced code blocks in order:

- a `python` block runs; the blocks of one page run in order in one namespace, in a fresh
  working folder, as a reader pastes them into one session (JAX's default dtype promotion,
  not the strict one of the other tests);
- a block preceded by `<!-- output -->` (a `text` block) is what the Python blocks before it
  print: it is compared with their printed output since the previous output block, word by
  word, numbers to within `OUTPUT_RTOL`;
- a block preceded by `<!-- no-run: REASON -->` is not run (shell commands, a GPU, a peer
  simulator); every block in another language than `python` and `text` needs one;
- other `text` blocks (a diagram, a command synopsis) are not code.

One test per page, so that pytest-xdist spreads the pages over its workers.
"""

import contextlib
import dataclasses
import io
import math
import re
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Relative tolerance of a number in a shown output: shown outputs round (a rate to 0.1 Hz, a
# loss to 4 digits), and float32 sums differ in their last bits between CPUs.
OUTPUT_RTOL = 2e-3

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>no-run|output)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "no-run", "output" or None
    reason: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the marker comment before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        body = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and stripped.strip(fence[0]) == "":
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        marker = reason = None
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and (mm := _MARKER.match(lines[k])):
            marker, reason = mm.group("kind"), mm.group("reason")
        out.append(Block(page, i + 1, lang, "\n".join(body) + "\n", marker, reason))
        i = j + 1
    return out


def _runs(block: Block) -> bool:
    return block.lang == "python" and block.marker != "no-run"


def _tokens(text: str) -> list[str | float]:
    """Words and numbers of an output, whitespace ignored."""
    out: list[str | float] = []
    for word in text.split():
        pos = 0
        for m in _NUMBER.finditer(word):
            if m.start() > pos:
                out.append(word[pos : m.start()])
            out.append(float(m.group()))
            pos = m.end()
        if pos < len(word):
            out.append(word[pos:])
    return out


def outputs_match(shown: str, printed: str, rtol: float = OUTPUT_RTOL) -> bool:
    """Whether `printed` is `shown` up to whitespace and numbers within `rtol`."""
    a, b = _tokens(shown), _tokens(printed)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, float) != isinstance(y, float):
            return False
        if isinstance(x, float):
            if not math.isclose(x, y, rel_tol=rtol, abs_tol=1e-6):
                return False
        elif x != y:
            return False
    return True


# ------------------------------------------------------------------------------ the parser


def test_blocks_reads_fences_markers_and_indented_blocks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- output -->\n```text\n1\n```\n"
        "<!-- no-run: needs a GPU -->\n\n```bash\nmake test\n```\n"
        "1. a list item\n\n    ```python\n    y = 2\n      z = 3\n    ```\n"
        "````markdown\n```python\nnot a block\n```\n````\n"
    )
    got = [(b.line, b.lang, b.code, b.marker, b.reason) for b in blocks(page)]
    assert got == [
        (3, "python", "x = 1\n", None, None),
        (8, "text", "1\n", "output", None),
        (13, "bash", "make test\n", "no-run", "needs a GPU"),
        (18, "python", "y = 2\n  z = 3\n", None, None),
        (22, "markdown", "```python\nnot a block\n```\n", None, None),
    ]


def test_outputs_match_words_exactly_and_numbers_within_tolerance():
    assert outputs_match("E (10000, 3200) 20.7 Hz", "E (10000, 3200)  20.7 Hz\n")
    assert outputs_match("loss: 4.0 grad: [-346.7513]", "loss: 4.0 grad: [-346.75]")
    assert not outputs_match("E 21.0 Hz", "E 20.7 Hz")  # 1.4 %: a stale figure
    assert not outputs_match("E 20.7 Hz", "I 20.7 Hz")
    assert not outputs_match("(2000, 8)", "(2000, 8, 1)")
    assert not outputs_match("rate 3", "rate x")


# ------------------------------------------------------------------------------ the pages


def test_every_block_runs_or_says_why():
    problems = []
    for page in PAGES:
        page_blocks = blocks(page)
        for b in page_blocks:
            if b.marker == "no-run" and not (b.reason or "").strip():
                problems.append(f"{b.where()}: `<!-- no-run: REASON -->` needs its reason")
            if b.marker == "output" and b.lang != "text":
                problems.append(f"{b.where()}: an output block is a `text` block")
            if b.marker is None and b.lang not in ("python", "text"):
                problems.append(
                    f"{b.where()}: a `{b.lang or 'unlabelled'}` block neither runs nor says"
                    " why (`<!-- no-run: REASON -->`); label Python blocks `python`"
                )
        for i, b in enumerate(page_blocks):
            if b.marker == "output" and not any(_runs(x) for x in page_blocks[:i]):
                problems.append(f"{b.where()}: an output block with no Python block before it")
    assert problems == [], "\n".join(problems)


def _pages_with_code() -> list[Path]:
    return [p for p in PAGES if any(_runs(b) for b in blocks(p))]


# Neo's dependency `quantities` warns about its own API when Neo builds a block (as in
# tests/test_formats.py); a reader sees the warning, the page is not at fault.
@pytest.mark.filterwarnings("ignore:The 'copy' argument in Quantity is deprecated")
@pytest.mark.parametrize("page", _pages_with_code(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_pasted(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    printed = io.StringIO()
    # A reader's session: JAX's default promotion (the other tests run with "strict").
    with jax.numpy_dtype_promotion("standard"):
        for b in blocks(page):
            if b.marker == "output":
                shown, got = b.code, printed.getvalue()
                printed = io.StringIO()
                assert outputs_match(shown, got), (
                    f"{b.where()}: the output shown is not what the code prints\n"
                    f"shown:\n{shown}\nprinted:\n{got}"
                )
            elif _runs(b):
                code = compile(b.code, b.where(), "exec")
                with contextlib.redirect_stdout(printed):
                    try:
                        exec(code, namespace)
                    except Exception as err:
                        raise AssertionError(f"{b.where()}: the block fails as pasted") from err
