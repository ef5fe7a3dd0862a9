"""Running a command with stderr on a pseudo-terminal, to see what a person at a terminal sees
(progress bars are drawn only there)."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios


def run_with_tty_stderr(argv, env, timeout=120, size=None):
    """Runs argv with stdout piped and stderr on a pty; returns (exit status, stderr text).
    size=(columns, rows) sets the terminal's size (default: none, as a bare pty has)."""
    master, slave = pty.openpty()
    if size is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while select.select([master], [], [], timeout)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    p.wait(timeout=timeout)
    os.close(master)
    return p.returncode, seen.decode(errors="replace")
