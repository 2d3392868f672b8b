"""Sphinx configuration of Waymark's documentation site (``./waymark docs`` builds and serves it;
tests/test_docs_site.py builds it with warnings as errors).

The pages are Markdown (MyST). The reference pages that the code already knows are generated
at build time by docs/_ext/waymark_reference.py: the management commands' ``--help``, the
REST API's operations from the OpenAPI schema, and the code workflows' Python API (autodoc).
Building needs Django set up (settings, URLs, the apps' modules), never a running database.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waymark_config.settings")

import django  # noqa: E402  (after the path and the settings module are set)

django.setup()

project = "Waymark"
author = "Waymark's contributors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "waymark_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"

# Every heading down to ####, so a link to page.md#some-heading is checked when it is built.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "furo"
html_title = "Waymark"
html_show_sourcelink = False
