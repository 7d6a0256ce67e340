"""Run kvtool as ``python -m kvtool``."""

from kvtool.cli import main

if __name__ == "__main__":  # worker processes (report --jobs) import this module too
    main()
