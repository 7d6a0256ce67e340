"""A tmux server of a test's own (``-L``): a full-screen program in a real pseudo-terminal."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid

import pytest

DEADLINE_S = 90.0
"""How long a screen may take to show what a test waits for (a loaded machine is slow)."""

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not on PATH")


class Tmux:
    """One tmux server (``-L``, never the user's), one window running ``command``.

    Args:
        command: The shell command the window runs.
        width: Columns of the terminal.
        height: Rows of the terminal.
    """

    def __init__(self, command: str, width: int = 80, height: int = 24) -> None:
        self.sock = f"kvtool-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.name = "top"
        self._tmux(
            "new-session", "-d", "-x", str(width), "-y", str(height), "-s", self.name, command
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout

    def screen(self) -> str:
        """The pane as it shows now."""
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        """Type ``keys`` (tmux key names: ``q``, ``C-c`` ...)."""
        self._tmux("send-keys", "-t", self.name, *keys)

    def resize(self, width: int, height: int) -> None:
        """Resize the terminal (the program gets SIGWINCH)."""
        self._tmux("resize-window", "-t", self.name, "-x", str(width), "-y", str(height))

    def wait_for(self, pattern: str, also: str | None = None) -> str:
        """Poll the screen until ``pattern`` (a multi-line regex) shows, and the plain text
        ``also`` too when given; fail after :data:`DEADLINE_S` with the screen."""
        deadline = time.monotonic() + DEADLINE_S
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen, re.MULTILINE) and (also is None or also in screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never showed; the screen:\n{screen}")

    def kill(self) -> None:
        """Stop this test's tmux server (and the program in it)."""
        subprocess.run(
            ["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=30, check=False
        )
