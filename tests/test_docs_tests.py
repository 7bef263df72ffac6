"""The pages that describe the repository's own tests and records say what is there.

- `tests/README.md` names every test file, and only files that exist;
- `FAST_TESTS` of `tests/conftest.py` (the fast loop, `make test-fast`) has an entry for every
  test file or a reason in `NO_FAST_TESTS`, and every test it names exists;
- `benchmarks/RESULTS.md` links every record of `benchmarks/results/` and only records that
  exist;
- the README counts the notebooks that exist.
"""

import ast
import re
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

_NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"


def _test_files() -> set[str]:
    return {p.name for p in TESTS.glob("test_*.py")}


def _test_names(path: Path) -> set[str]:
    """Names of the test functions and methods defined in a test file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test"
        ):
            names.add(node.name)
    return names


def test_readme_of_the_tests_names_every_test_file():
    text = (TESTS / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(test_\w+\.py)`", text))
    assert sorted(_test_files() - named) == [], "test files missing from tests/README.md"
    assert sorted(named - _test_files()) == [], "tests/README.md names files that do not exist"


def test_fast_tests_name_every_test_file_and_existing_tests():
    files = _test_files()
    covered = set(conftest.FAST_TESTS) | set(conftest.NO_FAST_TESTS)
    assert sorted(files - covered) == [], (
        "test files with no entry in FAST_TESTS (tests/conftest.py): give each a fast smoke"
        " test, or a reason in NO_FAST_TESTS"
    )
    assert sorted(covered - files) == [], "FAST_TESTS or NO_FAST_TESTS name missing files"
    assert not set(conftest.FAST_TESTS) & set(conftest.NO_FAST_TESTS)
    missing = []
    for name, chosen in conftest.FAST_TESTS.items():
        assert chosen, f"{name}: an empty entry (use NO_FAST_TESTS with a reason)"
        defined = _test_names(TESTS / name)
        missing += [f"{name}::{t}" for t in chosen if t.split("[")[0] not in defined]
    assert missing == [], f"FAST_TESTS names tests that do not exist: {missing}"
    assert all(reason.strip() for reason in conftest.NO_FAST_TESTS.values())


def test_fast_marker_is_applied_from_the_mapping(pytester):
    pytester.makeconftest(
        "import pytest\n"
        "FAST_TESTS = {'test_a.py': ('test_one', 'test_two[2]')}\n"
        + "\n".join(
            line
            for line in Path(conftest.__file__).read_text(encoding="utf-8").splitlines()
            if line.startswith("SLOW_TIMEOUT_S")
        )
        + "\n"
        + _hook_source()
    )
    pytester.makeini(
        "[pytest]\nmarkers =\n    fast: f\n    slow: s\n    cross_platform: c\n"
        "addopts = -p no:cacheprovider\n"
    )
    pytester.makepyfile(
        test_a=(
            "import pytest\n"
            "def test_one(): pass\n"
            "@pytest.mark.parametrize('x', [1, 2])\n"
            "def test_two(x): pass\n"
            "def test_three(): pass\n"
            "@pytest.mark.slow\n"
            "def test_slow(request):\n"
            "    assert request.node.get_closest_marker('timeout').args == (3600,)\n"
        )
    )
    result = pytester.runpytest("-m", "fast", "-q", "-p", "no:randomly")
    result.assert_outcomes(passed=2, deselected=3)
    assert pytester.runpytest("-m", "slow", "-q", "-p", "timeout").ret == 0


def _hook_source() -> str:
    """`pytest_collection_modifyitems` of tests/conftest.py, as written there."""
    source = Path(conftest.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    (hook,) = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "pytest_collection_modifyitems"
    ]
    return ast.get_source_segment(source, hook) + "\n"


def test_results_page_links_every_record():
    text = RESULTS.read_text(encoding="utf-8")
    linked = {
        (RESULTS.parent / target).resolve()
        for target in re.findall(r"\]\(([^)\s#]+\.md)\)", text)
        if not re.match(r"[a-z]+:", target)
    }
    records = {p.resolve() for p in (RESULTS.parent / "results").rglob("*.md")}
    assert records, "benchmarks/results/ holds no record"
    rel = lambda paths: sorted(str(p.relative_to(ROOT)) for p in paths)  # noqa: E731
    assert rel(records - linked) == [], "records of benchmarks/results/ not linked from RESULTS.md"
    assert rel(linked - records - {RESULTS.resolve()}) == [], "RESULTS.md links missing files"


def test_current_table_has_a_command_and_a_record_in_every_row():
    text = RESULTS.read_text(encoding="utf-8")
    header = "| figure | neurojax | peer | peer / neurojax | machine | date | command | record |"
    assert header in text
    rows = text[text.index(header) :].split("\n\n", 1)[0].splitlines()[2:]
    assert len(rows) >= 15
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 8, row
        assert re.fullmatch(r"2026-\d\d-\d\d", cells[5]), row
        assert cells[6].startswith("`") or cells[6].startswith("the same"), row
        assert cells[7].startswith("[") and "results/" in cells[7], row


def test_readme_counts_the_notebooks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"\[notebooks/\]\(notebooks/\): (\w+) numbered notebooks", text)
    assert m, "the README's notebooks line changed: update this test"
    count = len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    assert m.group(1) == _NUMBERS.split()[count], (m.group(1), count)
