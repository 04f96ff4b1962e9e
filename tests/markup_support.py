"""Whether a page's markup is sound: ids unique, labels inside their own form, aria
references pointing at something."""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser


class _Markup(HTMLParser):
    """Every id (with the form it is in), every label's ``for`` and every reference."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.form_of: dict[str, int | None] = {}
        self.labels: list[tuple[str, int | None]] = []
        self.described: list[str] = []
        self._forms = 0
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attrs = dict(attrs)
        if tag == "form":
            self._forms += 1
            self._open.append(self._forms)
        form = self._open[-1] if self._open else None
        if attrs.get("id"):
            self.ids.append(attrs["id"])
            self.form_of[attrs["id"]] = form
        if tag == "label" and attrs.get("for"):
            self.labels.append((attrs["for"], form))
        for name in ("aria-describedby", "aria-labelledby"):
            self.described += (attrs.get(name) or "").split()

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._open:
            self._open.pop()


def markup_problems(html: str) -> list[str]:
    """Duplicate ids, labels pointing elsewhere than into their own form, and aria
    references to nothing: an empty list for a sound page."""
    markup = _Markup()
    markup.feed(html)
    problems = [f"duplicate id {i}" for i, n in Counter(markup.ids).items() if n > 1]
    for target, form in markup.labels:
        if target not in markup.form_of:
            problems.append(f"label for a missing {target}")
        elif markup.form_of[target] != form:
            problems.append(f"label for {target} outside its form")
    problems += [
        f"aria reference to a missing {i}" for i in markup.described if i not in markup.ids
    ]
    return problems
