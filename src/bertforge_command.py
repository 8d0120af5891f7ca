"""The `bertforge` command's entry point, outside the package: importing bertforge loads torch, which takes a second
or two, and a Ctrl-C in that time would end in a traceback. Here the import runs inside the same guard as the
command itself, so an interrupt at any moment ends with one line and exit status 130."""

import sys


def main() -> int:
    try:
        from bertforge.cli.main import main as run_command
    except KeyboardInterrupt:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    return run_command()
