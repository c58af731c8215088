"""Markdown as agents write it, rendered to the HTML subset Matrix clients show
(`org.matrix.custom.html`): paragraphs, headings, bold/italic/strikethrough, inline code,
fenced code blocks, links, lists (nested by indentation), block quotes and rules.

Everything else is text: every character that means something in HTML is escaped, link
targets are limited to http(s), mailto and matrix.to, and a single plain paragraph comes
back as bare inline text (so a reply without markup needs no `formatted_body`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_RULE = re.compile(r"^ {0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^ {0,3}> ?(.*)$")
_ITEM = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\[([^\]\n]+)\]\(\s*([^\s)]+)\s*\)")
_AUTOLINK = re.compile(r"&lt;((?:https?://|mailto:)[^\s&]+)&gt;")
_BARE_URL = re.compile(r"(?<![\w/])(https?://[^\s<>\x00]*[^\s<>\x00.,:;!?'\")\]])")
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_EM = re.compile(
    r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"
)
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HOLE = re.compile("\x00(\\d+)\x00")
_SAFE_URL = re.compile(r"^(https?://|mailto:|matrix:)", re.I)


def to_html(markdown: str) -> str:
    """The HTML for `markdown`; one plain paragraph is returned without a <p>."""
    lines = markdown.replace("\x00", "").replace("\r\n", "\n").split("\n")
    blocks = _blocks(lines)
    if len(blocks) == 1 and blocks[0][0] == "p":
        return blocks[0][1]
    return "".join(f"<p>{body}</p>" if kind == "p" else body for kind, body in blocks)


def has_markup(markdown: str, rendered: str) -> bool:
    """True when the HTML says more than the escaped text would."""
    return rendered != html.escape(markdown.replace("\x00", "").strip(), quote=False)


def _blocks(lines: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(("p", "<br>".join(inline(line.strip()) for line in para)))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            flush()
            i += 1
        elif fence := _FENCE.match(line):
            flush()
            i = _code_block(lines, i, fence, out)
        elif heading := _HEADING.match(line):
            flush()
            level = len(heading.group(1))
            out.append(("h", f"<h{level}>{inline(heading.group(2))}</h{level}>"))
            i += 1
        elif _RULE.match(line):
            flush()
            out.append(("hr", "<hr>"))
            i += 1
        elif _QUOTE.match(line):
            flush()
            quoted = []
            while i < len(lines) and (m := _QUOTE.match(lines[i])):
                quoted.append(m.group(1))
                i += 1
            inner = "".join(f"<p>{b}</p>" if k == "p" else b for k, b in _blocks(quoted))
            out.append(("q", f"<blockquote>{inner}</blockquote>"))
        elif _ITEM.match(line):
            flush()
            i = _list_block(lines, i, out)
        else:
            para.append(line)
            i += 1
    flush()
    return out


def _code_block(lines: list[str], i: int, fence: re.Match[str], out: list[tuple[str, str]]) -> int:
    marker, lang = fence.group(1), fence.group(2)
    body: list[str] = []
    i += 1
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(marker[0] * len(marker)) and not stripped.strip(marker[0]):
            i += 1
            break
        body.append(lines[i])
        i += 1
    attr = f' class="language-{html.escape(lang)}"' if lang else ""
    code = html.escape("\n".join(body), quote=False)
    out.append(
        ("pre", f"<pre><code{attr}>{code}\n</code></pre>" if body else "<pre><code></code></pre>")
    )
    return i


@dataclass
class _Item:
    indent: int
    ordered: bool
    number: int
    text: list[str]
    children: list[_Item] = field(default_factory=list)


def _list_block(lines: list[str], i: int, out: list[tuple[str, str]]) -> int:
    """Consecutive items (and their indented continuation lines) as nested lists."""
    items: list[_Item] = []
    while i < len(lines):
        line = lines[i]
        if m := _ITEM.match(line):
            marker = m.group(2)
            ordered = marker[0].isdigit()
            items.append(
                _Item(
                    len(m.group(1).expandtabs(4)),
                    ordered,
                    int(marker[:-1]) if ordered else 1,
                    [m.group(3)],
                )
            )
        elif line.strip() and items and line.startswith((" ", "\t")):
            items[-1].text.append(line.strip())
        else:
            break
        i += 1
    out.append(("list", _render_items(_nest(items))))
    return i


def _nest(flat: list[_Item]) -> list[_Item]:
    roots: list[_Item] = []
    stack: list[_Item] = []
    for item in flat:
        while stack and item.indent <= stack[-1].indent:
            stack.pop()
        (stack[-1].children if stack else roots).append(item)
        stack.append(item)
    return roots


def _render_items(items: list[_Item]) -> str:
    parts: list[str] = []
    run: list[_Item] = []
    for item in items:
        if run and item.ordered != run[0].ordered:
            parts.append(_one_list(run))
            run = []
        run.append(item)
    if run:
        parts.append(_one_list(run))
    return "".join(parts)


def _one_list(run: list[_Item]) -> str:
    tag = "ol" if run[0].ordered else "ul"
    start = f' start="{run[0].number}"' if run[0].ordered and run[0].number != 1 else ""
    body = "".join(
        "<li>"
        + "<br>".join(inline(t) for t in item.text)
        + (_render_items(item.children) if item.children else "")
        + "</li>"
        for item in run
    )
    return f"<{tag}{start}>{body}</{tag}>"


def inline(text: str) -> str:
    """Code spans, links and emphasis in one line of text; everything else escaped."""
    holes: list[str] = []

    def hole(markup: str) -> str:
        holes.append(markup)
        return f"\x00{len(holes) - 1}\x00"

    def code(m: re.Match[str]) -> str:
        return hole(f"<code>{html.escape(m.group(2).strip(), quote=False)}</code>")

    pieces = []
    last = 0
    for m in _CODE_SPAN.finditer(text):  # code first: nothing inside it is markup
        pieces.append(html.escape(text[last : m.start()], quote=False))
        pieces.append(code(m))
        last = m.end()
    pieces.append(html.escape(text[last:], quote=False))
    out = "".join(pieces)

    def link(m: re.Match[str]) -> str:
        label, url = m.group(1), html.unescape(m.group(2))
        if not _SAFE_URL.match(url):
            return m.group(0)
        return hole(f'<a href="{html.escape(url)}">{_emphasis(label)}</a>')

    def autolink(m: re.Match[str]) -> str:
        url = html.unescape(m.group(1))
        return hole(f'<a href="{html.escape(url)}">{html.escape(url, quote=False)}</a>')

    out = _LINK.sub(link, out)
    out = _AUTOLINK.sub(autolink, out)
    out = _BARE_URL.sub(autolink, out)  # before emphasis: a URL's _ and * are not markup
    out = _emphasis(out)
    while _HOLE.search(out):
        out = _HOLE.sub(lambda m: holes[int(m.group(1))], out)
    return out


def _emphasis(text: str) -> str:
    text = _STRONG.sub(lambda m: f"<strong>{m.group(1) or m.group(2)}</strong>", text)
    text = _EM.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)
    return _STRIKE.sub(lambda m: f"<del>{m.group(1)}</del>", text)
