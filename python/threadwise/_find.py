"""Where pip put the `threadwise` binary: the scripts directory of the scheme
this package was installed with (a venv's bin/, ~/.local/bin for --user, a
--target or --prefix directory's bin/), then PATH."""

from __future__ import annotations

import os
import shutil
import sysconfig
from typing import Iterator, Optional


def _candidates(name: str) -> Iterator[str]:
    yield os.path.join(sysconfig.get_path("scripts"), name)
    if hasattr(sysconfig, "get_preferred_scheme"):  # Python >= 3.10
        user = sysconfig.get_preferred_scheme("user")
    else:
        user = "posix_user"
    try:
        yield os.path.join(sysconfig.get_path("scripts", scheme=user), name)
    except KeyError:  # pragma: no cover - unknown scheme
        pass
    # pip install --target DIR / --prefix DIR: DIR/bin beside DIR/threadwise,
    # or PREFIX/bin above PREFIX/lib/pythonX.Y/site-packages/threadwise.
    here = os.path.dirname(os.path.abspath(__file__))
    site = os.path.dirname(here)
    yield os.path.join(site, "bin", name)
    yield os.path.join(site, "..", "..", "..", "bin", name)


def find_binary(name: str = "threadwise") -> Optional[str]:
    """The path of the installed binary `name` (`threadwise` or
    `threadwise-workload`), or None when it is nowhere to be found."""
    for path in _candidates(name):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.normpath(path)
    return shutil.which(name)
