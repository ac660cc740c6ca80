"""Progress bars (`pipeline.progress.progress_bar`) as a user sees them, from real processes: a
bar redrawn in place on a terminal, and in a log file a line now and then that reads as counts
(not `0triplet`, not the same bar written over and over on one line)."""
import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# About a second of reading 50 batches of 4,096 triplets behind a bar
READING = ("import time\nfrom pipeline.progress import progress_bar\n"
           "with progress_bar(desc='read triplets-sen/test', unit=' triplets', unit_scale=True) as bar:\n"
           "    for _ in range(50):\n        time.sleep(0.02)\n        bar.update(4096)\n")


def test_a_bar_written_to_a_log_file_is_a_first_and_a_last_line_reading_as_counts(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as stderr:
        subprocess.run([sys.executable, "-c", READING], cwd=REPO, stderr=stderr, check=True, timeout=120)
    text = log.read_text()
    assert "\r" not in text
    first, last = text.splitlines()   # a line every 30 s: the second's only its last
    assert first.startswith("read triplets-sen/test: 0.00 triplets [00:00")
    assert last.startswith("read triplets-sen/test: 205k triplets [00:0") and "k triplets/s]" in last


def test_a_bar_on_a_terminal_is_redrawn_in_place(tmp_path):
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a new pty is 0 columns wide
    process = subprocess.Popen([sys.executable, "-c", READING], cwd=REPO, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:   # the terminal's other end closed: the process is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert process.wait(timeout=120) == 0
    text = shown.decode()
    assert text.count("\r") > 3 and "205k triplets" in text
