"""What a job prints: its own lines in full, the workers' output filtered to what a user acts on.

Ray streams every actor's stdout and stderr to the driver. Most of it on this system is the
engines' chatter (vLLM's WARNING lines at every engine start and weight load, torch's NUMA note,
checkpoint-loading progress bars, Python FutureWarnings from dependencies): harmless, listed in
docs/vllm_cpu.md, and it buried the training lines (690 console lines for the quickstart). So
the job replaces Ray's printer with `WorkerLogs`:

    actor stdout/stderr --Ray--> WorkerLogs.handle --all lines--> RUN_DIR/logs/workers.log
                                        |
                                        +--lines at or above run.log_level--> Ray's own printer

A line is *third-party* when it has a library's logging shape (`WARNING 12-02 08:15:30 [file.py:12]`,
torch's `[W1202 ...]`, `file.py:12: FutureWarning:`), is a progress bar, or is in KNOWN_NOISE;
anything else (this project's own prints, a traceback) is shown. Indented lines continue the
level of the line before them (a warning's source line, a traceback's frames).
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from typing import Any, Iterator, Literal

LogLevel = Literal["error", "warning", "info"]
"""The lowest level of third-party worker output the console shows: `error` (default: errors and
tracebacks only), `warning`, or `info` (everything, as Ray prints it; `jobs.train --verbose`)."""
RANK = {"info": 0, "warning": 1, "error": 2}

_LOGGING = re.compile(r"^(?:\([\w.-]+ pid=\d+\) )?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
"""Python logging as vLLM, Ray and transformers format it, after vLLM's `(EngineCore pid=N) `."""
_TORCH = re.compile(r"^(?:\([\w.-]+ pid=\d+\) )?\[([IWEF])\d{4} ")
"""glog / c10 lines: `[W1202 08:15:49.380 utils.cpp:68] Warning: ...`."""
_PY_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")
_PROGRESS = re.compile(r"\d+%\s*(?:\||Completed \|)")
KNOWN_NOISE: tuple[tuple[str, str], ...] = (
    ("Triton is installed, but doesn't include CPU backend", "warning"),
)
"""Plain prints of dependencies with no level of their own: (text the line contains, its level)."""


def classify(line: str, previous: str | None) -> str | None:
    """The level of a third-party worker line (`info`, `warning`, `error`), or None for a line
    that is not recognisably third-party (shown at every level). `previous`: the level of the
    same process's line before it, which indented lines and blank lines continue."""
    if not line.strip():
        return previous or "info"
    if line[0] in " \t" and previous is not None:
        return previous
    if line.startswith("Traceback (most recent call last)"):
        return None
    match = _LOGGING.match(line)
    if match:
        level = match.group(1)
        return "info" if level in ("DEBUG", "INFO") else "warning" if level.startswith("WARN") else "error"
    match = _TORCH.match(line)
    if match:
        return {"I": "info", "W": "warning"}.get(match.group(1), "error")
    if _PY_WARNING.match(line):
        return "warning"
    if _PROGRESS.search(line):
        return "info"
    for text, level in KNOWN_NOISE:
        if text in line:
            return level
    return None


class WorkerLogs:
    """Ray's handler for the workers' output, filtered at `level`; every line goes to `path` too."""

    def __init__(self, path: Path, level: LogLevel) -> None:
        self.threshold = RANK[level]
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._previous: dict[Any, str | None] = {}
        """(pid, is_err) -> the level of that stream's last line."""
        self.num_hidden = 0

    def keep(self, data: dict[str, Any]) -> list[str]:
        """The lines of one batch the console shows (all of them are written to the file)."""
        stream = (data.get("pid"), data.get("is_err"))
        who = f"({data.get('actor_name') or data.get('task_name') or 'worker'} pid={data.get('pid')})"
        kept = []
        with self._lock:
            for line in data.get("lines", []):
                level = classify(line, self._previous.get(stream))
                self._previous[stream] = level
                if self._file is not None:
                    self._file.write(f"{who} {line}\n")
                if level is None or RANK[level] >= self.threshold:
                    kept.append(line)
                else:
                    self.num_hidden += 1
            if self._file is not None:
                self._file.flush()
        return kept

    def handle(self, data: dict[str, Any]) -> None:
        from ray._private.worker import print_to_stdstream

        # The autoscaler's status reports, which Ray's printer reduces to its events itself.
        kept = data.get("lines", []) if data.get("pid") == "autoscaler" else self.keep(data)
        if kept:
            print_to_stdstream({**data, "lines": kept}, ignore_prefix=False)

    def close(self) -> None:
        """The file is closed; the filter goes on (nothing more is written)."""
        with self._lock:
            self._file.close()
            self._file = None


def progress_bar(total: int, desc: str, unit: str):
    """A tqdm bar on stderr; off a terminal (a pipe, `ray job logs`) it redraws every 30 s rather than
    ten times a second, since each redraw stays in the log."""
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=0.1 if sys.stderr.isatty() else 30.0)


HANDLER = "ray_print_logs"
"""The name under which `ray.init(log_to_driver=True)` registers its printer (ray/_private/worker.py)."""


@contextlib.contextmanager
def filtered_worker_logs(run_dir: Path, level: LogLevel) -> Iterator[WorkerLogs]:
    """A WorkerLogs in place of Ray's printer of the workers' output (after `ray.init`). After the
    block it keeps filtering what arrives late (an actor's last progress bar after the summary) but
    writes no more to the file; `ray.shutdown` removes it, as it removes Ray's printer."""
    from ray._private import worker

    dispatcher = worker.global_worker_stdstream_dispatcher
    logs = WorkerLogs(run_dir / "logs" / "workers.log", level)
    dispatcher.remove_handler(HANDLER)
    dispatcher.add_handler(HANDLER, logs.handle)
    try:
        yield logs
    finally:
        logs.close()
