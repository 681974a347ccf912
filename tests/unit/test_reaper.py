"""cluster/reaper.py: processes that must not outlive the process that started them."""

import signal
import subprocess
import sys
import time

import psutil

PARENT = r'''
import subprocess, sys, time
from cluster.reaper import reap_with_this_process
kept = subprocess.Popen(["sleep", "600"])
reaped = subprocess.Popen(["sleep", "600"])
reap_with_this_process([reaped.pid])
print(kept.pid, reaped.pid, flush=True)
time.sleep(600)
'''


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_process_handed_to_the_reaper_dies_when_its_parent_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    kept, reaped = map(int, parent.stdout.readline().split())
    watchdog = next(p for p in psutil.Process(parent.pid).children() if "cluster.reaper" in " ".join(p.cmdline()))
    try:
        time.sleep(1)
        assert not gone(reaped) and not gone(kept)  # the watchdog waits while the parent lives
        parent.send_signal(signal.SIGKILL)  # no cleanup of its own can run
        parent.wait()
        deadline = time.monotonic() + 10
        while not (gone(reaped) and gone(watchdog.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(reaped) and gone(watchdog.pid)
        assert not gone(kept)  # only what it was given
    finally:
        for pid in (kept, reaped):
            if not gone(pid):
                psutil.Process(pid).kill()
