"""Dashboard widgets that Textual does not ship: a stacked KV-page bar."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tokenspeed_cli.top.model import TierView

ACTIVE_STYLE = "bold #e5534b"
CACHED_STYLE = "#d29922"
FREE_STYLE = "#3fb950"


def split_cells(width: int, fractions: tuple[float, ...]) -> list[int]:
    """Cells per segment for a bar `width` wide: sums to `width`, a non-zero share gets >= 1."""
    if width <= 0 or not fractions or sum(fractions) <= 0:
        return [0] * len(fractions)
    total = sum(fractions)
    raw = [f / total * width for f in fractions]
    cells = [int(r) for r in raw]
    for i, f in enumerate(fractions):
        if f > 0 and cells[i] == 0:
            cells[i] = 1
    # Hand out (or take back) the rounding remainder by largest fractional part.
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    while sum(cells) < width:
        for i in order:
            if sum(cells) >= width:
                break
            cells[i] += 1
    while sum(cells) > width:
        i = max(range(len(cells)), key=lambda k: cells[k])
        cells[i] -= 1
    return cells


class PageBar(Widget):
    """One KV tier as a stacked bar (active | cached | free) with its counts as a caption."""

    DEFAULT_CSS = """
    PageBar { height: 2; }
    """

    def __init__(self, tier_name: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tier = TierView(tier_name, 0, 0, 0, 0)

    def set_tier(self, tier: TierView) -> None:
        """Show new counts (redraws only when they changed)."""
        if tier != self.tier:
            self.tier = tier
            self.refresh()

    def render(self) -> Text:
        text = Text(self.tier.legend() + "\n", no_wrap=True, overflow="ellipsis")
        width = max(0, self.content_size.width)
        if not self.tier.present:
            text.append("·" * width, style="dim")
            return text
        a, c, f = split_cells(width, self.tier.fractions())
        text.append("█" * a, style=ACTIVE_STYLE)
        text.append("█" * c, style=CACHED_STYLE)
        text.append("█" * f, style=FREE_STYLE)
        return text
