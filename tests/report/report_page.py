"""A small DOM of an HTML page, built with html.parser, for the report tests to query."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Optional

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict
    parent: Optional["Element"] = None
    children: list = field(default_factory=list)  # Elements and text strings

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    @property
    def classes(self) -> set:
        return set((self.attrs.get("class") or "").split())

    def iter(self, tag: Optional[str] = None):
        for c in self.children:
            if isinstance(c, Element):
                if tag is None or c.tag == tag:
                    yield c
                yield from c.iter(tag)

    def find_all(self, tag: str, cls: Optional[str] = None) -> list["Element"]:
        return [e for e in self.iter(tag) if cls is None or cls in e.classes]

    def find(self, tag: str, cls: Optional[str] = None) -> "Element":
        found = self.find_all(tag, cls)
        assert found, f"no <{tag}{' class=' + cls if cls else ''}>"
        return found[0]


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Element("#document", {})

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs), self.current)
        self.current.children.append(element)
        if tag not in _VOID:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, dict(attrs), self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(text: str) -> Element:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    return builder.root


def table_rows(table: Element) -> list[list[Element]]:
    """The rows of a table's body as lists of cells (th and td)."""
    body = table.find("tbody")
    return [[c for c in tr.children if isinstance(c, Element) and c.tag in ("td", "th")] for tr in body.find_all("tr")]


def svgs(text: str) -> list[str]:
    """The inline <svg> plots of a page, as the XML text of each."""
    return re.findall(r"<svg\b.*?</svg>", text, re.S)


def svg_texts(svg: str) -> list[str]:
    """The text of every <text> element of a plot (tick labels, axis labels, title), in order."""
    return [html.unescape(t) for t in re.findall(r"<text\b[^>]*>(.*?)</text>", svg, re.S)]
