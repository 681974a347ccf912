"""W&B logging offline (no network): the run directory W&B writes holds every step's numbers, the
staleness histogram and the figures, read back from its record log with the package's protobuf
definitions; a second job on the same run directory continues the same W&B run."""

import json
import struct
import time

import pytest

from jobs.wandb_log import WandbConfig, WandbLog
from test_records import record

pytest.importorskip("wandb", reason="needs the wandb extra (the test command installs it)")

BLOCK = 32768
"""W&B's .wandb file is a LevelDB-style log: 7-byte file header, then 32 KiB blocks of chunks,
each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""


def wandb_records(path):
    from wandb.proto import wandb_internal_pb2

    data, records, pending = path.read_bytes(), [], b""
    assert data[:4] == b":W&B"
    offset = 7
    while offset + 7 <= len(data):
        room = BLOCK - offset % BLOCK
        if room < 7:  # the block's tail is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(pending)
            records.append(parsed)
    return records


def history(run_dir):
    """(run id, {step: {key: value}}) of each offline run W&B wrote under run_dir, oldest first."""
    runs = []
    for log in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        steps, run_id = {}, None
        for rec in wandb_records(log):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run_id = rec.run.run_id
            elif kind == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
                steps[items.pop("_step")] = items
        runs.append((run_id, steps))
    return runs


def test_an_offline_run_records_every_step_and_a_resume_continues_it(tmp_path):
    config = WandbConfig(project="apprentice-test", mode="offline", tags=("unit",))
    first = WandbLog(config, tmp_path, {"run": {"steps": 3}})
    first.scalar("warm_start/loss", 2.5, 1)
    first.record(record(2))
    first.record(record(3))
    first.close()
    second = WandbLog(config, tmp_path, {"run": {"steps": 4}})
    assert second.run_id == first.run_id == (tmp_path / "wandb_run_id").read_text()
    second.record(record(4))
    figure = tmp_path / "kl.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.plot([0, 1]), plt.savefig(figure), plt.close()
    second.figures([figure], 4)
    second.close()
    # W&B's service process may still be writing the second run's record log after `finish`
    # returns (seen once under a loaded CI: its run record not yet there).
    deadline = time.monotonic() + 60
    while any(run_id is None or not steps for run_id, steps in history(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    (id1, steps1), (id2, steps2) = history(tmp_path)
    assert id1 == id2 == first.run_id
    assert steps1[1]["warm_start/loss"] == 2.5
    assert steps1[2]["learner/loss"] == pytest.approx(0.1) and steps1[3]["mismatch/mismatch_kl"] == 0.0
    assert steps1[2]["learner/staleness/_type"] == "histogram" and steps1[2]["learner/staleness/values"] == [1, 1]
    assert steps1[2]["kl/reverse_kl_by_turn/00"] == 0.5 and "kl/reverse_kl_by_turn/01" not in steps1[2]
    assert set(steps2) == {4} and steps2[4]["report/kl/_type"] == "image-file"
