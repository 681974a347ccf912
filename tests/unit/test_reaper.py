"""cluster/reaper.py: processes that must not outlive the process that started them."""

import signal
import subprocess
import sys
import time

import psutil

PARENT = r'''
import subprocess, sys, time
from cluster.reaper import Reaper
kept = subprocess.Popen(["sleep", "600"])
reaped = subprocess.Popen(["sleep", "600"])
reaper = Reaper([reaped.pid])
print(kept.pid, reaped.pid, reaper.watchdog.pid, flush=True)
time.sleep(600)
'''


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_process_handed_to_the_reaper_dies_when_its_parent_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    kept, reaped, watchdog = map(int, parent.stdout.readline().split())
    # Nobody's child: Ray kills the direct children of a worker that exits, a watchdog with them.
    assert watchdog not in {p.pid for p in psutil.Process(parent.pid).children()}
    try:
        time.sleep(1)
        assert not gone(reaped) and not gone(kept)  # the watchdog waits while the parent lives
        parent.send_signal(signal.SIGKILL)  # no cleanup of its own can run
        parent.wait()
        deadline = time.monotonic() + 10
        while not (gone(reaped) and gone(watchdog)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(reaped) and gone(watchdog)
        assert not gone(kept)  # only what it was given
    finally:
        for pid in (kept, reaped):
            if not gone(pid):
                psutil.Process(pid).kill()


GROUP_PARENT = r'''
import subprocess, sys, time
from cluster.reaper import Reaper
# A served model's shape: a leader in a session of its own that starts a child in its group, then
# is gone itself (the engine core a dead server left behind).
leader = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; wait"], start_new_session=True,
                          stdout=subprocess.PIPE, text=True)
orphan = int(leader.stdout.readline())
reaper = Reaper([], process_groups=[leader.pid])
leader.kill()
leader.wait()
print(leader.pid, orphan, flush=True)
time.sleep(600)
'''


def test_a_process_group_handed_to_the_reaper_dies_with_its_parent_after_its_leader_is_gone():
    import os

    parent = subprocess.Popen([sys.executable, "-c", GROUP_PARENT], stdout=subprocess.PIPE, text=True)
    leader, orphan = map(int, parent.stdout.readline().split())
    try:
        time.sleep(1)
        assert gone(leader) and not gone(orphan) and os.getpgid(orphan) == leader
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while not gone(orphan) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(orphan)
    finally:
        if not gone(orphan):
            psutil.Process(orphan).kill()


def test_closing_the_reaper_kills_its_processes_now_and_ends_the_watchdog():
    from cluster.reaper import Reaper

    child = subprocess.Popen(["sleep", "600"])
    reaper = Reaper([child.pid])
    try:
        assert reaper.watchdog.is_running() and child.poll() is None
        reaper.close()
        assert not reaper.watchdog.is_running() and child.wait(timeout=10) == -signal.SIGKILL
        reaper.close()  # once
    finally:
        if child.poll() is None:
            child.kill()


def test_a_forked_child_holds_no_write_end_so_closing_does_not_wait_for_it():
    """vLLM forks each engine core: a second engine's core must not keep the first's watchdog waiting."""
    import os

    from cluster.reaper import Reaper

    child = subprocess.Popen(["sleep", "600"])
    reaper = Reaper([child.pid])
    forked = os.fork()
    if forked == 0:  # the forked child lives on, as an engine core would
        time.sleep(600)
        os._exit(0)
    try:
        start = time.monotonic()
        reaper.close(timeout_s=10)
        assert time.monotonic() - start < 5 and child.wait(timeout=10) == -signal.SIGKILL
    finally:
        os.kill(forked, signal.SIGKILL)
        os.waitpid(forked, 0)
        if child.poll() is None:
            child.kill()
