"""Print the top entries of a cProfile file: by own time and by cumulative time in kvtool.

python3 bench/profile_top.py FILE.prof [N]
"""

from __future__ import annotations

import pstats
import sys


def main() -> int:
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    st = pstats.Stats(path)
    print(f"== {path}: top {n} by own time")
    st.sort_stats("tottime").print_stats(n)
    print(f"== {path}: top {n} kvtool functions by cumulative time")
    st.sort_stats("cumtime").print_stats("kvtool/", n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
