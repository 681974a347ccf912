"""Weights & Biases for a run (`run.wandb: {project: ...}`): every step record's numbers under the
same sections as TensorBoard (jobs/tensorboard.py), eval success per task type, the staleness of
the trained samples as a histogram, the warm start's loss, and the report's figures at the end.

The W&B run's id is kept in RUN_DIR/wandb_run_id: `--resume` (and a recovery inside the job)
continues the same W&B run (`resume="allow"`), its steps the learner versions. `mode: offline`
writes RUN_DIR/wandb/offline-run-*/ with no network (`wandb sync` uploads it later); `disabled`
logs nothing. The `wandb` extra provides the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from jobs.records import StepRecord
from jobs.tensorboard import scalars


class WandbConfig(BaseModel):
    """Where the run goes in W&B."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = Field(min_length=1)
    entity: str | None = None
    """W&B team or user; None: the API key's default entity."""
    mode: Literal["online", "offline", "disabled"] = "online"
    tags: tuple[str, ...] = ()
    name: str | None = None
    """Display name; None: the run directory's name."""


class WandbLog:
    """One W&B run per training run, across resumes."""

    def __init__(self, config: WandbConfig, run_dir: Path, job_config: dict) -> None:
        import secrets

        import wandb

        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        self.run = wandb.init(project=config.project, entity=config.entity, mode=config.mode, tags=list(config.tags),
                              name=config.name or run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
                              config=job_config, settings=wandb.Settings(console="off", silent=True))
        self.run_id = run_id

    def scalar(self, tag: str, value: float, version: int) -> None:
        self.run.log({tag: value}, step=version)

    def record(self, record: StepRecord) -> None:
        import wandb

        values: dict = dict(scalars(record))
        if record.sample_versions:
            staleness = np.array([record.version - 1 - v for v in record.sample_versions])
            bins = np.arange(staleness.max() + 2) - 0.5  # one bin per staleness 0, 1, ...
            values["learner/staleness"] = wandb.Histogram(np_histogram=np.histogram(staleness, bins=bins))
        self.run.log(values, step=record.version)

    def figures(self, paths: list[Path], version: int) -> None:
        import wandb

        self.run.log({f"report/{path.stem}": wandb.Image(str(path)) for path in paths}, step=version)

    def close(self) -> None:
        self.run.finish()
