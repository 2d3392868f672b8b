"""The documentation site (docs/, Sphinx with MyST; ``./waymark docs`` serves it) builds with
warnings as errors: a link to a page that does not exist, a link to a heading a page does not
have (``page.md#some-heading``: myst_heading_anchors), a page no table of contents holds, or a
generated reference (commands, REST API, Python API) that no longer renders fails the build,
and this test shows Sphinx's warnings. The builder is proved to catch each of those on a small
tree of pages built with the site's own configuration.

Also: no page over 30 KB (a page people read, not a dump), and the manuals carry no history
of the work (benchmarks/RESULTS.md does).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .processes import ROOT

DOCS = ROOT / "docs"
PAGE_LIMIT = 30 * 1024
# Nothing listens there: the build must not need a database.
NO_DATABASE = "postgres://nobody@127.0.0.1:9/none"
# A session's ordinal ("the 13th session"), a commit named in prose: the work's history.
HISTORY = re.compile(
    r"\b(?:\d+(?:st|nd|rd|th)|[a-z]+(?:st|nd|rd|th)) session\b|\bcommit [0-9a-f]{7}"
)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """The site's build, as ``./waymark docs`` runs it, with the site's own conf.py."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "waymark_config.settings",
        "DATABASE_URL": NO_DATABASE,
    }
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-c", str(DOCS), str(source), str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = sphinx_build(DOCS, tmp_path / "html")
    assert done.returncode == 0, f"Sphinx's warnings:\n{done.stderr}{done.stdout}"
    built = tmp_path / "html"
    for page in pages():
        html = built / page.relative_to(DOCS).with_suffix(".html")
        assert html.exists(), f"{page} was not built"
    # The generated references rendered something.
    commands = (built / "reference" / "commands.html").read_text()
    assert "usage: ./waymark manage runengine" in commands
    assert "usage: ./waymark manage rotate_webhook_secrets" in commands
    operations = (built / "reference" / "api-operations.html").read_text()
    assert "GET /api/v1/runs" in operations
    assert 'id="schema-runstartin"' in operations  # the bodies' fields, linked from operations
    assert "publish_code_workflow" in (built / "reference" / "python-api.html").read_text()


FIXTURE = {
    "index.md": "# Home\n\n```{toctree}\nguide\n```\n\nSee [the guide](guide.md#steps).\n",
    "guide.md": "# Guide\n\n## Steps\n\nBack [home](index.md).\n",
}


def write_tree(root: Path, pages: dict[str, str]) -> Path:
    root.mkdir()
    for name, text in pages.items():
        (root / name).write_text(text)
    return root


def test_the_build_fails_on_a_broken_link_a_missing_anchor_and_a_page_outside_the_toc(
    tmp_path: Path,
) -> None:
    sound = write_tree(tmp_path / "sound", FIXTURE)
    done = sphinx_build(sound, tmp_path / "sound-html")
    assert done.returncode == 0, done.stderr  # the tree itself is fine

    broken = write_tree(
        tmp_path / "broken",
        {
            **FIXTURE,
            "index.md": FIXTURE["index.md"]
            + "\n[gone](missing.md) and [no such heading](guide.md#no-such-heading)\n",
            "orphan.md": "# Nobody links here\n",
        },
    )
    done = sphinx_build(broken, tmp_path / "broken-html")
    assert done.returncode != 0
    warnings = done.stderr
    assert "missing.md" in warnings, warnings
    assert "no-such-heading" in warnings, warnings
    assert "orphan.md: WARNING: document isn't included in any toctree" in warnings, warnings


def test_no_page_is_over_30_kb() -> None:
    large = {str(p.relative_to(ROOT)): p.stat().st_size for p in pages()}
    assert {name: size for name, size in large.items() if size > PAGE_LIMIT} == {}


def test_the_manuals_carry_no_history_of_the_work() -> None:
    found = {
        str(page.relative_to(ROOT)): HISTORY.findall(page.read_text())
        for page in [*pages(), ROOT / "README.md"]
    }
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_readme_names_real_pages() -> None:
    named = set(re.findall(r"docs/[\w/.-]+\.md", (ROOT / "README.md").read_text()))
    assert named, "the README points at no page"
    assert {path for path in named if not (ROOT / path).is_file()} == set()
