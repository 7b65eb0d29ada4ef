"""The one table printer (tabulate): the size check, verify, inspect, bench and the release
comparison print their tables through it, so columns line up however wide a cell gets.

Cells are strings, formatted by the caller (numbers keep the caller's precision: no parsing).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence


def table(header: Optional[Sequence[str]], rows: Iterable[Sequence], right: Iterable[int] = (),
          indent: int = 0, markdown: bool = False) -> list:
    """The table's lines: `header` (column names, or None), `rows` of cells; the columns whose
    index is in `right` right-aligned, the others left; each line indented by `indent` spaces.
    markdown: a GitHub-flavoured Markdown table (`| a | b |`) instead of plain columns."""
    # Imported here: the toolchain container's step runner imports modules that print tables
    # on the host (checks/sizes.py), and its locked wheels (requirements/container.in) have
    # no tabulate.
    import tabulate as _tabulate
    _tabulate.MIN_PADDING = 0   # columns as wide as their widest cell, header included
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    columns = len(header) if header else max((len(r) for r in rows), default=0)
    if not columns:
        return []
    rows = [r + [""] * (columns - len(r)) for r in rows]
    right = set(right)
    align = ["right" if i in right else "left" for i in range(columns)]
    text = _tabulate.tabulate(rows, headers=list(header) if header else (),
                              tablefmt="github" if markdown else "plain", colalign=align,
                              disable_numparse=True,
                              preserve_whitespace=True)   # leading spaces indent a cell (inspect)
    return [(" " * indent + line).rstrip() for line in text.splitlines()]
