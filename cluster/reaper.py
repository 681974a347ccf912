"""Processes that must not outlive the process that started them, however it ends.

vLLM's engine core runs in a process of its own (unless `rollout.vllm.in_process`), started
with multiprocessing by the process that builds the engine. It shuts down when that process
closes the engine, but nothing stops it when that process is killed: after a SIGKILL of the
process holding an engine (`ray.kill` of a rollout worker or teacher, a crash, an OOM kill),
its `VLLM::EngineCore` and `VLLM::Worker` were still running 30 s later under init, with their
memory (GPU memory on a GPU node), and a restarted worker starts an engine beside them
(measured by SIGKILLing a process that held a `VLLMEngine`; with this module, all were gone
within 5 s). vLLM ties its own workers to the engine core with a pipe whose
closing tells them to exit; this does the same one level up. A served model
(models/vllm_server.py) is a process group: the server, started in a session of its own, and
the engine core and worker it starts. When a Ray worker exits (`ray.kill` included) Ray kills
its direct children, not theirs (RAY_kill_child_processes_on_worker_exit): a judge actor's end
killed its server and left the server's engine core and worker under init (seen after the
turn-judge test, with the server's parent-death signal in place). The whole group is handed over
instead, and the watchdog itself is nobody's child, or Ray would kill it first.

    Reaper(pids, process_groups=())

starts a watchdog process holding the read end of a pipe whose write end only this process
holds. The kernel closes the write end when this process ends, however it ends; the watchdog's
read then returns, and it SIGKILLs every pid it was given that is still the same process (its
start, in clock ticks since boot, unchanged) and every process group it was given, then exits. A
group is named by its leader's pid; Linux does not hand out a pid while a group still carries it
as its id, so a group whose leader is gone is still that group; one whose leader's pid now names
another process (the group emptied and the pid was reused) is left alone. `Reaper.close` closes
the write end itself: the owner's orderly close of what it started (the watchdog does not
outlive it either). A fork copies every descriptor, and vLLM forks its engine cores where it may
(its default off CPU, before CUDA is initialised; on CPU it spawns): a child this process forks
closes its copies at once (os.register_at_fork), or the first engine's watchdog would wait for
the second engine's core. Tests: tests/unit/test_reaper.py, tests/unit/test_vllm_engine.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil

_OPEN: set[int] = set()
"""This process's write ends of its watchdogs' pipes."""


def _close_in_child() -> None:
    for write_end in _OPEN:
        os.close(write_end)
    _OPEN.clear()


os.register_at_fork(after_in_child=_close_in_child)


class Reaper:
    """A watchdog that kills `pids` and the process groups led by `process_groups` once this
    process is gone, or at `close`."""

    def __init__(self, pids: list[int], process_groups: list[int] = ()) -> None:
        processes = [(pid, _start_ticks(pid)) for pid in pids]
        groups = [(leader, _start_ticks(leader)) for leader in process_groups]
        read_end, self._write_end = os.pipe()
        _OPEN.add(self._write_end)
        # Its own session: a signal to this process's group does not stop it before its work.
        launcher = subprocess.Popen(
            [sys.executable, "-m", "cluster.reaper", str(read_end), json.dumps(processes), json.dumps(groups)],
            pass_fds=(read_end,), start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        os.close(read_end)
        self.watchdog = psutil.Process(int(launcher.stdout.readline()))
        launcher.stdout.close()
        launcher.wait()

    def close(self, timeout_s: float = 30.0) -> None:
        """Kill what is left of the pids and groups now (as this process's end would) and let the
        watchdog exit."""
        if self._write_end not in _OPEN:  # closed before, or this is a forked child's copy
            return
        _OPEN.remove(self._write_end)
        os.close(self._write_end)
        try:
            self.watchdog.wait(timeout=timeout_s)
        except psutil.NoSuchProcess:  # already gone (and reaped by init)
            pass


def _start_ticks(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field).

    Not `psutil.Process.create_time()`: that adds the boot time as the wall clock now places it
    (/proc/stat's `btime`, whole seconds), which moves when the clock is stepped or slewed, so one
    process's start read twice a second apart can differ by a second. A CI run's watchdog exited
    without killing a live child it was given, which only that explains. psutil's own process
    identity (`Process.__eq__`) uses these ticks for the same reason."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[19])  # field 22 counted from the pid, 1-based; this list starts at field 3


def _same(pid: int, started: int) -> bool | None:
    """Whether `pid` is still the process that started at `started`; None: no process has it."""
    try:
        return _start_ticks(pid) == started
    except (FileNotFoundError, ProcessLookupError):
        return None


def _watch(read_end: int, processes: list[tuple[int, int]], groups: list[tuple[int, int]]) -> None:
    """Block until the pipe's writer is gone, then kill what is left of `processes` and `groups`."""
    while os.read(read_end, 1):  # nothing is ever written: returns b"" at the writer's end
        pass
    for leader, started in groups:
        if _same(leader, started) is not False:
            try:
                os.killpg(leader, signal.SIGKILL)
            except ProcessLookupError:  # the group ended with its owner, or was closed before
                pass
    for pid, started in processes:
        if _same(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the check and the kill
                pass


if __name__ == "__main__":
    # The watchdog is nobody's child: Ray kills a worker's direct children when the worker exits
    # (RAY_kill_child_processes_on_worker_exit, on by default), which would take the watchdog
    # with it before the pipe tells it anything; the launcher names it and exits.
    watchdog = os.fork()
    if watchdog:
        print(watchdog, flush=True)
        os._exit(0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    _watch(int(sys.argv[1]), [tuple(p) for p in json.loads(sys.argv[2])],
           [tuple(g) for g in json.loads(sys.argv[3])])
