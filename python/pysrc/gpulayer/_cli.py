"""The `gpulayer` console script: the Rust CLI, run inside this interpreter."""

import signal
import sys

# Commands that serve connections for a long time: a peer that hangs up must cost one
# connection (EPIPE), never the process (SIGPIPE).
_SERVING = {"up", "join", "mcp"}


def _command(args: list) -> str:
    """The subcommand's name: the first word that is not an option or a global option's value."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--fingerprint":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return ""


def main() -> None:
    from gpulayer import _native

    # Ctrl-C and a closed pipe behave as with the standalone binary: the CLI's own handlers
    # (or the default action) decide, not Python's KeyboardInterrupt machinery. A closed
    # pipe ends a client command quietly (`gpulayer jobs | head`); the serving commands keep
    # Python's SIGPIPE-ignored setting, as the standalone binary ignores it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE") and _command(sys.argv[1:]) not in _SERVING:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_native.run_cli(["gpulayer", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
