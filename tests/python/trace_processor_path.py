#!/usr/bin/env python3
"""Print the path of the trace_processor_shell the `perfetto` package uses.

Usage: trace_processor_path.py

The third place the tests look for trace_processor_shell (after the
TRACE_PROCESSOR_SHELL variable and ../shared/tools). It asks the package the
same way `TraceProcessor()` does when given no `bin_path`:
`PlatformDelegate().get_shell_path(bin_path=None)`, which returns the
trace_processor version pinned to this package release, downloading it on
first use (checked against the pinned SHA-256) into
~/.local/share/perfetto/prebuilts. That needs the network the first time.

Prints the path as the only line of stdout; anything the package prints while
downloading goes to stderr. Exits non-zero with the package's error when it
cannot provide the binary (no network, no prebuilt for this platform).
"""
import contextlib
import sys
from importlib import metadata

from perfetto.trace_processor.platform import PlatformDelegate


def main():
    # The download prints "Downloading <url>" on stdout; keep stdout for the
    # path alone.
    try:
        with contextlib.redirect_stdout(sys.stderr):
            path = PlatformDelegate().get_shell_path(bin_path=None)
    except Exception as e:  # the package raises plain Exception and CalledProcessError
        print(f"perfetto {metadata.version('perfetto')}: {e}", file=sys.stderr)
        sys.exit(1)
    print(path)


if __name__ == "__main__":
    main()
