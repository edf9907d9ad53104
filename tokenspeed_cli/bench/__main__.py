"""``python -m tokenspeed_cli.bench``: the bench commands before (or without) the main CLI."""

from tokenspeed_cli.bench.cli import app

if __name__ == "__main__":
    app(prog_name="tokenspeed bench")
