"""Run kvtool as ``python -m kvtool``."""

from kvtool.cli import main

main()
