"""mkdocs hooks of the docs site (mkdocs.yml ``hooks:``).

A page under docs/ may link a file of the repository outside docs/ (``../examples/agent.yaml``,
``../bench/README.md``): on GitHub that relative link works; on the site the file is not a page, so
the link is rewritten to the file in the repository (``repo_url``/blob/main/...). Links inside docs/
are left to mkdocs, which validates them and their anchors (``validation`` in mkdocs.yml).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

LINK = re.compile(r"(\]\()(\.\./[^)\s]+)(\))")


def outside_link(src_uri: str, target: str, repo_url: str) -> str | None:
    """The repository URL of ``target`` linked from the page ``src_uri`` (relative to docs/), or None
    when the target stays inside docs/."""
    path, _, anchor = target.partition("#")
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(src_uri), path))
    if joined.startswith("docs/") or joined.startswith("../"):
        return None
    kind, slash = ("tree", "/") if path.endswith("/") else ("blob", "")
    return f"{repo_url.rstrip('/')}/{kind}/main/{joined}{slash}" + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    repo_url = config["repo_url"]

    def sub(m: re.Match[str]) -> str:
        url = outside_link(page.file.src_uri, m.group(2), repo_url)
        return m.group(0) if url is None else f"{m.group(1)}{url}{m.group(3)}"

    return LINK.sub(sub, markdown)
