"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

The site is built from the Markdown files of this repository as they are, so that each reads
as well on its own (on a code host, in an editor) as in the site:

- ``index.md`` is ``README.md``; ``changelog.md`` is ``CHANGELOG.md``; ``figures/*.png`` are the
  committed figures; ``examples/notebook.py`` is the example notebook, executed at build time
  (mkdocs-jupyter).
- ``reference/settings.md`` and ``reference/cli.md`` are generated at build time from the
  settings themselves (``scripts/settings_reference.py``) and from ``fnsysid --help``.
- A link that points out of ``docs/`` into the repository is rewritten to the page or figure
  the site serves for it; a link to a source file that the site does not serve becomes the
  file's path in code type.

Only MkDocs' public hook events and ``File.generated`` are used.
"""

from __future__ import annotations

import posixpath
import re
import runpy
import subprocess
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]

#: site path -> the repository file it is made from (None: generated)
_REPO_PATH: dict[str, str] = {}
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _cli_page() -> str:
    lines = ["# Command line", "",
             "The output of each command's `--help`, captured when the site was built.", ""]
    for title, args in (("fnsysid", [str(ROOT / "run.py"), "--help"]),
                        ("fnsysid-plot", ["-m", "fnsysid.app.plot_cli", "--help"])):
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout
        lines += [f"## `{title} --help`", "", "```text", out.rstrip(), "```", ""]
    return "\n".join(lines)


@event_priority(100)        # before the plugins (mkdocs-jupyter picks up the notebook)
def on_files(files: Files, config) -> Files:
    """Add the pages and figures that live outside ``docs/`` or are generated."""
    reference = runpy.run_path(str(ROOT / "scripts" / "settings_reference.py"))["markdown"]

    def add(src_uri: str, repo: str | None = None, content: str | None = None) -> None:
        _REPO_PATH[src_uri] = repo or ""
        if content is None:
            files.append(File.generated(config, src_uri, abs_src_path=str(ROOT / repo)))
        else:
            files.append(File.generated(config, src_uri, content=content))

    add("index.md", "README.md")
    if (ROOT / "CHANGELOG.md").exists():
        add("changelog.md", "CHANGELOG.md")
    for png in sorted((ROOT / "figures").glob("*.png")):
        add(f"figures/{png.name}", f"figures/{png.name}")
    add("reference/settings.md", content=reference())
    add("reference/cli.md", content=_cli_page())
    return files


def _site_path(repo_target: str) -> str | None:
    """The site path that serves a repository file, or None."""
    if repo_target.startswith("docs/"):
        return repo_target[len("docs/"):]
    for site, repo in _REPO_PATH.items():
        if repo and repo == repo_target:
            return site
    return None


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Rewrite the links of a page that leave ``docs/``."""
    src = page.file.src_uri
    repo_path = _REPO_PATH.get(src) or f"docs/{src}"
    here = posixpath.dirname(src)

    def fix(match: re.Match) -> str:
        bang, text, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
        site = _site_path(repo_target.rstrip("/"))
        if site is None:
            if (ROOT / repo_target).exists():
                return f"{text} (`{repo_target}`)" if text and text != repo_target \
                    else f"`{repo_target}`"
            return match.group(0)                  # left for MkDocs to report as broken
        rel = posixpath.relpath(site, here or ".")
        return f"{bang}[{text}]({rel}{'#' + anchor if anchor else ''})"

    return LINK.sub(fix, markdown)
