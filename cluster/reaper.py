"""Processes that must not outlive the process that started them, however it ends.

vLLM's engine core runs in a process of its own (unless `rollout.vllm.in_process`), started
with multiprocessing by the process that builds the engine. It shuts down when that process
closes the engine, but nothing stops it when that process is killed: after a SIGKILL of the
process holding an engine (`ray.kill` of a rollout worker or teacher, a crash, an OOM kill),
its `VLLM::EngineCore` and `VLLM::Worker` were still running 30 s later under init, with their
memory (GPU memory on a GPU node), and a restarted worker starts an engine beside them
(measured by SIGKILLing a process that held a `VLLMEngine`; with this module, all were gone
within 5 s). vLLM ties its own workers to the engine core with a pipe whose
closing tells them to exit; this does the same one level up. (A process we start ourselves,
such as models/vllm_server.py's server, asks the kernel instead: PR_SET_PDEATHSIG in the child.
The engine core is started by vLLM, where no such hook runs.)

    Reaper(pids)

starts a watchdog process holding the read end of a pipe whose write end only this process
holds. The kernel closes the write end when this process ends, however it ends; the
watchdog's read then returns, and it SIGKILLs every pid it was given that is still the same
process (its start time unchanged), then exits. `Reaper.close` closes the write end itself:
the owner's orderly close of what it started (the watchdog does not outlive it either). A
fork copies every descriptor, and vLLM forks its engine cores where it may (its default off
CPU, before CUDA is initialised; on CPU it spawns): a child this process forks closes its
copies at once (os.register_at_fork), or the first engine's watchdog would wait for the second
engine's core. Tests: tests/unit/test_reaper.py, tests/unit/test_vllm_engine.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

_OPEN: set[int] = set()
"""This process's write ends of its watchdogs' pipes."""


def _close_in_child() -> None:
    for write_end in _OPEN:
        os.close(write_end)
    _OPEN.clear()


os.register_at_fork(after_in_child=_close_in_child)


class Reaper:
    """A watchdog that kills `pids` once this process is gone, or at `close`."""

    def __init__(self, pids: list[int]) -> None:
        import psutil

        processes = [(pid, psutil.Process(pid).create_time()) for pid in pids]
        read_end, self._write_end = os.pipe()
        _OPEN.add(self._write_end)
        # Its own session: a signal to this process's group does not stop it before its work.
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "cluster.reaper", str(read_end), json.dumps(processes)], pass_fds=(read_end,),
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        os.close(read_end)

    def close(self, timeout_s: float = 30.0) -> None:
        """Kill what is left of the pids now (as this process's end would) and let the watchdog exit."""
        if self._write_end not in _OPEN:  # closed before, or this is a forked child's copy
            return
        _OPEN.remove(self._write_end)
        os.close(self._write_end)
        self.watchdog.wait(timeout=timeout_s)


def _watch(read_end: int, processes: list[tuple[int, float]]) -> None:
    """Block until the pipe's writer is gone, then kill what is left of `processes`."""
    import psutil

    while os.read(read_end, 1):  # nothing is ever written: returns b"" at the writer's end
        pass
    for pid, started in processes:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:  # it ended with its parent, or was closed before
            continue


if __name__ == "__main__":
    _watch(int(sys.argv[1]), [tuple(p) for p in json.loads(sys.argv[2])])
