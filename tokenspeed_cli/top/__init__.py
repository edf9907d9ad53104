"""``tokenspeed top``: a Textual dashboard fed by the server's `/v1/stats/stream`.

Modules: `command` (the Typer command), `client` (HTTP + SSE), `model` (snapshot -> view,
pure), `widgets` (the stacked page bar), `app` (the Textual app).
"""

from tokenspeed_cli.top.command import top

__all__ = ["top"]
