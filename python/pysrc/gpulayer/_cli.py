"""The `gpulayer` console script: the Rust CLI, run inside this interpreter."""

import signal
import sys


def main() -> None:
    from gpulayer import _native

    # Ctrl-C and a closed pipe behave as with the standalone binary: the CLI's own handlers
    # (or the default action) decide, not Python's KeyboardInterrupt machinery.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_native.run_cli(["gpulayer", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
