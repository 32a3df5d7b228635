#!/usr/bin/env python3
"""Run trace_processor_shell on a trace; pass its output and status through.

Usage: trace_processor_shell.py [--statements SQL] [SHELL_ARGS...] TRACE

Runs `trace_processor_shell SHELL_ARGS [-q FILE] TRACE`, where FILE holds
SQL (the statements that `-q` runs, each result set printed as CSV), and
prints the shell's stdout and stderr and exits with its status.

For tests that cannot run the shell themselves: a guest of the kernel
matrix has neither the shell nor Python, so its VITALS_PYTHON is the decoder
relay, which sends this script's name, its options and the trace to the
host (xtask/src/vm/relay.rs), where this script runs. The tests read the
output exactly as they read the shell's own (tests/src/trace_processor.rs).

The shell is looked for in the order tests/src/trace_processor.rs uses:
$TRACE_PROCESSOR_SHELL, then ../shared/tools/trace_processor_shell beside
this checkout, then the `perfetto` package's pinned download (network needed
the first time; see trace_processor_path.py).
"""
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def shell_path():
    env = os.environ.get("TRACE_PROCESSOR_SHELL")
    if env:
        if not os.access(env, os.X_OK):
            sys.exit(f"TRACE_PROCESSOR_SHELL={env} is not an executable file")
        return env
    root = Path(__file__).resolve().parents[2]
    shared = root.parent / "shared" / "tools" / "trace_processor_shell"
    if os.access(shared, os.X_OK):
        return str(shared)
    from perfetto.trace_processor.platform import PlatformDelegate

    # The download prints on stdout, which is the shell's here.
    with contextlib.redirect_stdout(sys.stderr):
        return PlatformDelegate().get_shell_path(bin_path=None)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    trace, args = args[-1], args[:-1]
    statements = None
    if args[:1] == ["--statements"]:
        statements, args = args[1], args[2:]
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        if statements is not None:
            f.write(statements)
            f.flush()
            args += ["-q", f.name]
        out = subprocess.run([shell_path(), *args, trace], capture_output=True)
    sys.stdout.buffer.write(out.stdout)
    sys.stderr.buffer.write(out.stderr)
    sys.exit(out.returncode)


if __name__ == "__main__":
    main()
