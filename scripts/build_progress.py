"""Reads a CMake build's output on stdin and prints one line per tenth of it done, with the
seconds since it started reading.

    ... | python scripts/build_progress.py TAG

Understands Ninja's "[12/240]" and Make's "[ 45%]" prefixes; prints nothing else.
"""

import re
import sys
import time

STEP = re.compile(r"^\s*\[\s*(\d+)/(\d+)\]|^\s*\[\s*(\d+)%\]")


def main() -> int:
    tag = sys.argv[1] if len(sys.argv) > 1 else "build"
    shown = -10
    start = time.monotonic()
    for line in sys.stdin:
        m = STEP.match(line)
        if not m:
            continue
        done = int(m[1]) * 100 // int(m[2]) if m[1] else int(m[3])
        if done >= shown + 10:
            shown = done - done % 10
            print(f"[{tag}] build    {shown:3d}%  {time.monotonic() - start:5.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
