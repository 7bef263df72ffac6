"""mkdocs hooks of the neurojax documentation (loaded by `mkdocs.yml`, `hooks:`).

mkdocs only reads files inside `docs_dir` (`docs/`); two sources of the site live outside it:

- the example notebooks `notebooks/NN_*.ipynb`: `on_files` adds every one that exists to
  the build (mkdocs-jupyter then renders them, without executing them) and `on_config` lists
  them, in file-name order, under the nav section "Examples". A notebook that does not exist
  yet is simply not listed, so the build never depends on work in progress; a page that the
  nav names explicitly and that is missing still fails `mkdocs build --strict`;
- `benchmarks/RESULTS.md`: `on_page_markdown` puts it into `benchmarks.md` in place of the
  line `<!-- RESULTS.md -->`, one heading level down, with its links rewritten for the
  page's location, so the table is never copied by hand.

`notebook_nav()` and `results_markdown()` take no mkdocs objects, so `tests/test_docs.py`
checks them without mkdocs installed.
"""

import json
import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
EXAMPLES_SECTION = "Examples"
RESULTS_MARKER = "<!-- RESULTS.md -->"
REPO_URL = "https://github.com/neurojax/neurojax"
_NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"


def notebooks(root: Path = ROOT) -> list[Path]:
    """The numbered notebooks of `root/notebooks`, in file-name order."""
    return sorted((root / "notebooks").glob(_NOTEBOOK_GLOB))


def notebook_title(path: Path) -> str:
    """The first Markdown heading of a notebook, else a title made from its file name."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        cells = []
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        for line in text.splitlines():
            m = re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
            if m:
                return m.group(1)
    stem = path.stem.split("_", 1)[-1]
    return stem.replace("_", " ").capitalize()


def notebook_nav(root: Path = ROOT) -> list[dict[str, str]]:
    """Nav entries `{title: "notebooks/NN_name.ipynb"}` of the notebooks that exist."""
    return [{notebook_title(p): f"notebooks/{p.name}"} for p in notebooks(root)]


def results_markdown(root: Path = ROOT) -> str:
    """`benchmarks/RESULTS.md` ready to sit inside `docs/benchmarks.md`.

    Headings go one level down (the page has its own title); links relative to
    `benchmarks/` are rewritten relative to `docs/`: `../docs/images/x.png` becomes
    `images/x.png`, and links to other files of the repository point to the repository.
    """
    text = (root / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    text = "\n".join(out) + "\n"

    def relink(m: re.Match) -> str:
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):
            return m.group(0)
        if target.startswith("../docs/"):
            return f"]({target[len('../docs/') :]})"
        path = posixpath.normpath(posixpath.join("benchmarks", target))
        return f"]({REPO_URL}/blob/main/{path})"

    return re.sub(r"\]\(([^)\s]+)\)", relink, text)


# ---------------------------------------------------------------------------- mkdocs events


def on_config(config: Any, **kwargs: Any) -> Any:
    """Fill the nav section "Examples" with the notebooks that exist (drop it if none)."""
    entries = notebook_nav()
    nav = []
    for item in config.nav or []:
        if isinstance(item, dict) and EXAMPLES_SECTION in item:
            section = list(item[EXAMPLES_SECTION] or [])
            listed = {v for e in section if isinstance(e, dict) for v in e.values()}
            listed |= {e for e in section if isinstance(e, str)}
            section += [e for e in entries if next(iter(e.values())) not in listed]
            if not section:
                continue
            item = {EXAMPLES_SECTION: section}
        nav.append(item)
    config.nav = nav
    return config


def _on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    for path in notebooks():
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(ROOT),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Put `benchmarks/RESULTS.md` into the benchmarks page."""
    if RESULTS_MARKER in markdown:
        markdown = markdown.replace(RESULTS_MARKER, results_markdown())
    return markdown


def on_serve(server: Any, config: Any, builder: Any, **kwargs: Any) -> Any:
    """`mkdocs serve` also rebuilds when a notebook or RESULTS.md changes."""
    for path in (NOTEBOOKS, RESULTS):
        if path.exists():
            server.watch(str(path))
    return server


try:  # mkdocs present (a docs build): run before mkdocs-jupyter wraps the notebook files
    from mkdocs.plugins import event_priority

    on_files = event_priority(100)(_on_files)
except ImportError:  # imported by the tests without mkdocs
    on_files = _on_files
