"""A griffe extension for the API reference: the docstrings' reST roles (``:func:`name``` ...) become links.

Each role becomes ``<autoref identifier="full.path" optional><code>name</code></autoref>``: a link where the
object is on the site, inline code where it is not. Names resolve from the docstring's own scope, as Sphinx's do.
Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option); tests/test_docs_site.py checks the built HTML.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: ``:role:`target``` or ``:role:`title <target>```, also with a domain (``:py:func:``); ``~`` shows the last part.
ROLE = re.compile(r":(?:py:)?(func|class|data|meth|attr|mod|exc|obj|const|type):`([^`]+)`")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` means in ``obj``'s docstring; ``name`` itself where it cannot be resolved."""
    name = name.lstrip(".")
    head, _, rest = name.partition(".")
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            path = scope.resolve(head)
        except Exception:  # noqa: BLE001 - griffe raises NameResolutionError or a loading error
            continue
        return f"{path}.{rest}" if rest else path
    return name


def convert(text: str, obj: griffe.Object) -> str:
    """``text`` with every role replaced by an optional autorefs reference (see the module docstring)."""

    def one(m: re.Match[str]) -> str:
        body = m.group(2).strip()
        explicit = re.match(r"^(.*?)\s*<([^>]+)>$", body, re.S)
        if explicit:
            title, name = explicit.group(1), explicit.group(2)
        else:
            name = body
            title = name.lstrip("~.")
            if name.startswith("~"):
                title = title.rsplit(".", 1)[-1]
        identifier = _target(obj, name.lstrip("~"))
        return (f'<autoref identifier="{html.escape(identifier, quote=True)}" optional>'
                f"<code>{html.escape(title, quote=False)}</code></autoref>")

    return ROLE.sub(one, text)


def _walk(obj: griffe.Object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if obj.docstring is not None and ROLE.search(obj.docstring.value):
        obj.docstring.value = convert(obj.docstring.value, obj)
        obj.docstring.__dict__.pop("parsed", None)  # parsed again from the new text, should it have been cached
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)


class ReSTRoles(griffe.Extension):
    """Rewrite reST roles into optional autorefs references once a package is loaded (its names resolvable)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, set())
