"""`python -m threadwise ARGS`: the installed `threadwise` binary with ARGS,
for environments whose scripts directory is not on PATH."""

from __future__ import annotations

import os
import sys

from . import find_binary


def main() -> int:
    binary = find_binary("threadwise")
    if binary is None:
        print(
            "error: the threadwise binary is not installed beside this package\n"
            "hint: reinstall with `pip install --force-reinstall threadwise`",
            file=sys.stderr,
        )
        return 3
    os.execv(binary, [binary, *sys.argv[1:]])
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
