"""Weight staging for vLLM reloads: shared memory only when it has room, and what killed
processes left is removed (no vLLM needed)."""

import os
import subprocess
import sys

from actors.vllm_engine import STAGING_PREFIX, remove_stale_staging, staging_dir


def test_staging_falls_back_to_disk_when_shared_memory_is_too_small(tmp_path):
    small = staging_dir(1024, shm=tmp_path)
    assert small.parent == tmp_path and small.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-")
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    big = staging_dir(free, shm=tmp_path)  # needs twice what is free
    assert big.parent != tmp_path
    big.rmdir()


def test_what_a_killed_process_left_is_removed_and_nothing_else(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    left = tmp_path / f"{STAGING_PREFIX}{dead}-abc"
    (left / "sub").mkdir(parents=True)
    mine = tmp_path / f"{STAGING_PREFIX}{os.getpid()}-def"
    mine.mkdir()
    other = tmp_path / "apprentice-other"
    other.mkdir()
    assert remove_stale_staging((tmp_path,)) == []  # too young: a reload may be under way
    os.utime(left, (0, 0))
    os.utime(mine, (0, 0))
    assert remove_stale_staging((tmp_path,)) == [left]
    assert not left.exists() and mine.exists() and other.exists()
