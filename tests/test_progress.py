"""Where progress bars are redrawn often: only where a person watches them."""

import os
import pty

from bertforge.progress import LOG_SECONDS, progress_bar, watched


def test_a_terminal_and_a_notebook_are_watched_a_file_is_not(tmp_path, monkeypatch):
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal, open(tmp_path / "log", "w") as log:
        assert watched(terminal) and not watched(log)
    os.close(leader)
    notebook = type("OutStream", (), {"__module__": "ipykernel.iostream", "write": lambda self, text: None})()
    assert watched(notebook)
    monkeypatch.setattr("sys.stderr", notebook)
    assert progress_bar(range(3)).mininterval == 0.1
    with open(tmp_path / "log", "w") as log:
        monkeypatch.setattr("sys.stderr", log)
        bar = progress_bar(range(3), desc="counting")
        assert bar.mininterval == LOG_SECONDS and list(bar) == [0, 1, 2]
    assert (tmp_path / "log").read_text().count("counting:") == 2  # drawn at the start and at the end
