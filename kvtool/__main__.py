"""Run kvtool as ``python -m kvtool``; also the console script's entry point (``main``)."""

import sys

from kvtool import _signals


def main() -> None:
    """Entry point: signals first, then the CLI (whose imports take tens of ms)."""
    _signals.install(sys.argv[1:])
    try:
        from kvtool.cli import main as cli_main
    except KeyboardInterrupt:
        _signals.interrupted()
    cli_main()


if __name__ == "__main__":  # worker processes (report --jobs) import this module too
    main()
