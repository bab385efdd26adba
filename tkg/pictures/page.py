"""The neighbourhood page's HTML, assembled from the files in ``assets/`` (shipped with the package as data).

``assets/neighbourhood.html`` is the page with seven placeholders, all filled in one pass, so that text which
happens to contain a placeholder is never substituted a second time:

* ``__STYLE__`` and ``__SCRIPT__``: ``neighbourhood.css`` and ``neighbourhood.js``, inlined as they are;
* ``__CSP__``: a Content-Security-Policy that admits exactly that style and that script, by the SHA-256 of the
  text inlined, and nothing else (no other script, no inline handler, nothing fetched): the page works with no
  network, and even a string from memory that escaped the escaping could not run or load anything;
* ``__TITLE__``, ``__HEADING__``, ``__SUBTITLE__``: text, HTML-escaped here;
* ``__DATA__``: the page's data as JSON that cannot end its ``<script type="application/json">`` element.

The files are read once, through :mod:`importlib.resources`, so they are found wherever the package is installed.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from tkg.errors import ConfigurationError

__all__ = ["page_html"]

_TOKEN = re.compile(r"__(?:CSP|STYLE|SCRIPT|TITLE|HEADING|SUBTITLE|DATA)__")


@dataclass(frozen=True, slots=True)
class _Assets:
    template: str
    style: str
    script: str
    csp: str


@functools.cache
def _assets() -> _Assets:
    folder = resources.files("tkg.pictures") / "assets"
    try:
        style = (folder / "neighbourhood.css").read_text(encoding="utf-8")
        script = (folder / "neighbourhood.js").read_text(encoding="utf-8")
        template = (folder / "neighbourhood.html").read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigurationError(
            f"the neighbourhood page's files are missing from the installed tkg ({exc.filename or folder}); "
            "reinstall tkg"
        ) from None
    csp = (
        f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(style)}; "
        "img-src 'none'; base-uri 'none'; form-action 'none'"
    )
    return _Assets(template=template, style=style, script=script, csp=csp)


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _json_for_script(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element: no ``</script>``, no ``<!--``."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def page_html(*, title: str, heading: str, subtitle: str, data: Any) -> str:
    """The page with its style, script and policy inlined, the three texts escaped and ``data`` as JSON."""
    assets = _assets()
    replacements = {
        "__CSP__": assets.csp,
        "__STYLE__": assets.style,
        "__SCRIPT__": assets.script,
        "__TITLE__": html.escape(title),
        "__HEADING__": html.escape(heading),
        "__SUBTITLE__": html.escape(subtitle),
        "__DATA__": _json_for_script(data),
    }
    return _TOKEN.sub(lambda m: replacements[m.group(0)], assets.template)
