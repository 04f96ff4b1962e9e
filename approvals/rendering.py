"""How the review page shows an artifact: escaped first, never trusted as HTML.

Text and JSON are shown preformatted (JSON pretty-printed). Markdown gets a tiny subset
(headings, paragraphs, lists, emphasis, inline code, fenced code) applied to text that is
already HTML-escaped, so no markup from the artifact can ever reach the page; links stay
plain text. Anything else is described, not shown.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

MAX_RENDER_BYTES = 512 * 1024
MAX_DIFF_LINES = 2000
MARKDOWN_TYPES = {"text/markdown", "text/x-markdown"}
JSON_TYPES = {"application/json"}


@dataclass
class Rendered:
    kind: str  # "markdown", "json", "text" or "binary"
    text: str = ""  # for json and text: shown in <pre>, escaped by the template
    html: SafeString = field(default_factory=lambda: mark_safe(""))  # markdown only
    truncated: bool = False


def decode_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _base_type(media_type: str) -> str:
    return (media_type or "").split(";")[0].strip().lower()


def render_artifact(data: bytes, media_type: str) -> Rendered:
    truncated = len(data) > MAX_RENDER_BYTES
    text = decode_text(data[:MAX_RENDER_BYTES] if truncated else data)
    if text is None and truncated:
        text = data[:MAX_RENDER_BYTES].decode("utf-8", errors="ignore")
    if text is None or "\x00" in text:
        return Rendered(kind="binary", truncated=truncated)
    base = _base_type(media_type)
    if base in JSON_TYPES or base.endswith("+json"):
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            return Rendered(kind="json", text=pretty, truncated=truncated)
        except ValueError:
            return Rendered(kind="text", text=text, truncated=truncated)
    if base in MARKDOWN_TYPES:
        return Rendered(kind="markdown", html=markdown_subset(text), truncated=truncated)
    return Rendered(kind="text", text=text, truncated=truncated)


_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^\s*\d+[.)]\s+(.*)$")
_CODE = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])")


def _inline(escaped: str) -> str:
    # Input is already escaped: these substitutions only add our own fixed tags.
    parts = _CODE.split(escaped)
    out = []
    for index, part in enumerate(parts):
        if index % 2:
            out.append(f"<code>{part}</code>")
        else:
            part = _STRONG.sub(r"<strong>\1</strong>", part)
            out.append(_EMPHASIS.sub(r"<em>\1</em>", part))
    return "".join(out)


def markdown_subset(text: str) -> SafeString:
    """Headings, paragraphs, bullet and numbered lists, **strong**, *em*, `code` and fenced
    code blocks. Every character of the source is escaped before any tag is added."""
    html: list[str] = []
    paragraph: list[str] = []
    list_kind: str | None = None
    in_fence = False
    fence: list[str] = []

    def flush_paragraph() -> None:
        if paragraph:
            html.append("<p>" + _inline(" ".join(paragraph)) + "</p>")
            paragraph.clear()

    def close_list() -> None:
        nonlocal list_kind
        if list_kind:
            html.append(f"</{list_kind}>")
            list_kind = None

    for raw in text.splitlines():
        if raw.strip().startswith("```"):
            if in_fence:
                html.append("<pre><code>" + "\n".join(fence) + "</code></pre>")
                fence.clear()
            else:
                flush_paragraph()
                close_list()
            in_fence = not in_fence
            continue
        line = escape(raw)
        if in_fence:
            fence.append(line)
            continue
        if not line.strip():
            flush_paragraph()
            close_list()
            continue
        heading = _HEADING.match(line)
        item = _BULLET.match(line)
        numbered = None if item else _NUMBERED.match(line)
        if heading:
            flush_paragraph()
            close_list()
            level = len(heading.group(1))
            # Start below the page's own h1/h2 so the document outline stays intact.
            html.append(f"<h{min(level + 2, 6)}>{_inline(heading.group(2))}</h{min(level + 2, 6)}>")
        elif item or numbered:
            flush_paragraph()
            kind = "ul" if item else "ol"
            if list_kind != kind:
                close_list()
                html.append(f"<{kind}>")
                list_kind = kind
            html.append("<li>" + _inline((item or numbered).group(1)) + "</li>")
        else:
            close_list()
            paragraph.append(line.strip())
    if in_fence:
        html.append("<pre><code>" + "\n".join(fence) + "</code></pre>")
    flush_paragraph()
    close_list()
    return mark_safe("\n".join(html))  # noqa: S308 - built only from escaped text


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add", "del", "hunk", "file" or "same"
    text: str


def diff_lines(previous: str, current: str, *, old_label: str, new_label: str) -> list[DiffLine]:
    """A unified diff (difflib) as classified lines; the template escapes the text."""
    lines = []
    for line in difflib.unified_diff(
        previous.splitlines(),
        current.splitlines(),
        fromfile=old_label,
        tofile=new_label,
        lineterm="",
        n=3,
    ):
        if line.startswith(("---", "+++")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        lines.append(DiffLine(kind, line))
        if len(lines) >= MAX_DIFF_LINES:
            lines.append(DiffLine("hunk", f"… the diff is longer than {MAX_DIFF_LINES} lines"))
            break
    return lines


def time_left(seconds: float) -> str:
    """'2 h 5 min', '4 min 10 s', or 'expired'."""
    if seconds <= 0:
        return "expired"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"
