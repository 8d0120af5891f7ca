"""The `bertforge` command's entry point, outside the package: importing bertforge loads torch, which takes a second
or two, and a Ctrl-C in that time would end in a traceback, or be lost. Here a Ctrl-C during the import is noted by
a handler of our own and answered once the import is done, so an interrupt at any moment ends with one line and exit
status 130."""

import signal
import sys


def main() -> int:
    # A KeyboardInterrupt raised while the import machinery runs one of its callbacks (an import lock's weakref
    # callback) is printed as "Exception ignored" and dropped, and the command would run on: during the import,
    # Ctrl-C only sets a flag.
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        from bertforge.cli.main import main as run_command
    except OSError as error:  # a full disk: libraries that torch imports want a temporary folder at import
        where = f"{error.filename}: " if error.filename else ""
        print(f"bertforge: error: can't start: {where}{error.strerror or error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)  # from here a Ctrl-C raises KeyboardInterrupt, which the command ends
    if interrupted:
        print("bertforge: interrupted", file=sys.stderr)
        return 130
    return run_command()
