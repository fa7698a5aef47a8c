"""What the bench drivers (grammar_drive.py, spec_drive.py) share: a client of a hearthd
that the calling script has just started, so it may still be loading."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
import hearth  # noqa: E402


def connect(sock, name, seconds=60):
    """A hearth.Client of the daemon at sock once it answers; None after seconds."""
    for _ in range(int(seconds * 10)):
        try:
            return hearth.Client(sock, name=name)
        except hearth.HearthError:
            time.sleep(0.1)
    print(f"{name}: no daemon at {sock}", file=sys.stderr)
    return None
