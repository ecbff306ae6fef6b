"""The documentation site builds strictly (a broken link, anchor or page, or a page missing
from the nav, fails) and its pages load nothing from another host: no web fonts, no CDN
scripts, no analytics (mkdocs.yml). `make docs` builds the same site into build/site."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An attribute that makes a browser fetch: scripts, stylesheets, icons, images, frames.
LOADS = re.compile(r"""<(script|link|img|iframe|source)\b[^>]*?\b(src|href)=["']([^"']+)["']""", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make setup installs it)")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(out)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_every_page_is_built(site):
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    built = {p.stem for p in site.glob("*.html")}
    assert pages and pages <= built, pages - built
    assert (site / "playground.png").is_file()  # docs assets travel with the pages


def test_pages_load_nothing_from_another_host(site):
    loads = []
    for page in sorted(site.rglob("*.html")):
        for tag, _, url in LOADS.findall(page.read_text()):
            if url.startswith(("http:", "https:", "//")):
                loads.append(f"{page.name}: <{tag}> {url}")
    assert not loads, "\n".join(loads)
    assert list(site.rglob("*.html"))


def test_lists_and_code_blocks_start_after_a_blank_line():
    # GitHub starts a list or a code block right after a paragraph line; MkDocs (Python-Markdown)
    # folds it into the paragraph. A blank line before each keeps both renderings the same.
    item = re.compile(r"^\s*([-*]|\d+\.) ")
    wrong = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        fence, prev = False, ""
        for number, line in enumerate(page.read_text().splitlines(), 1):
            opens = line.startswith("```") and not fence
            starts_list = not fence and item.match(line) and not item.match(prev) and not prev.startswith(" ")
            if (opens or starts_list) and prev.strip():
                wrong.append(f"docs/{page.name}:{number}: {line[:60]}")
            if line.startswith("```"):
                fence = not fence
            prev = line
    assert not wrong, "\n".join(wrong)


def test_no_page_narrates_sessions_or_issues():
    """Docs are for users: history is git's (`grep -ri "this session\\|issue [0-9]" docs`)."""
    narration = re.compile(r"this session|issue [0-9]", re.IGNORECASE)
    found = [
        f"{page.name}:{n}: {line.strip()[:80]}"
        for page in sorted((ROOT / "docs").glob("*.md"))
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if narration.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_example_block_is_made_by_the_script():
    """Each `<!-- doc-example NAME -->` block on a page is one that scripts/doc_examples.py makes
    (and checks, `make docs-examples`), on a page it writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_examples", ROOT / "scripts" / "doc_examples.py")
    assert spec is not None and spec.loader is not None
    examples = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = examples  # its dataclasses look their module up
    spec.loader.exec_module(examples)
    names = {e.name for e in examples.EXAMPLES}
    marked = {}
    for page in sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]):
        for match in examples.BLOCK.finditer(page.read_text()):
            marked.setdefault(str(page.relative_to(ROOT)), set()).add(match.group(2))
    assert set(marked) == set(examples.PAGES), marked
    assert set().union(*marked.values()) == names
