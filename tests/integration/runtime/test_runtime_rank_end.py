"""A rank the launcher stops with SIGTERM (after another rank failed) says its last words (in a run: its buffered
step lines and a "failure" event) and still dies of SIGTERM, so the launcher reads the same exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from paths import ROOT

RANK = """
import json, sys, time
from geotrain.runtime.watchdog import Watchdog, end_on_sigterm

def last_words(why, step):
    with open(sys.argv[1], "w") as file:
        json.dump([why, step], file)

watchdog = Watchdog(None, None, 0, 1, str, last_words=last_words)  # the stores are the thread's: not started here
watchdog.completed_steps = 7
end_on_sigterm(watchdog)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_rank_stopped_with_sigterm_says_its_last_words_and_dies_of_sigterm(tmp_path):
    words = tmp_path / "words.json"
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(words)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert rank.stdout.readline().strip() == "ready"
        rank.send_signal(signal.SIGTERM)
        assert rank.wait(timeout=30) == -signal.SIGTERM
    finally:
        rank.kill()
        rank.wait()
    assert json.loads(words.read_text()) == ["stopped by the launcher (SIGTERM) after 7 completed steps", 7]
