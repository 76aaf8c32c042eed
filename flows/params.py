"""Parameters of the Prefect flows: the same typed configs the command line and the jobs take.

Flows take them as top-level parameters (``input``, ``engine``, ``agent``, ``job``, …) rather
than one big object, because a deployment run merges parameters at the top level only:
``prefect deployment run 'batch-qa/nightly' -p engine='{"model": "…"}'`` replaces ``engine``
and keeps every other deployment default. Prefect validates each parameter with pydantic
before the flow body runs, and deployments enforce the JSON schema these models produce.
Only what a flow needs beyond the shared configs is defined here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from memagent.batch import Method
from memagent.data.io import check_uri
from memagent.data.ruler import RulerItems
from memagent.rl.config import TrainConfig

# Defaults of the nightly deployment: the local demo lake (a flow task generates it if absent).
DEMO_INPUT = "runs/lake/docs"
DEMO_OUTPUT = "runs/lake/answers"


def check_local_dir(path: str) -> str:
    """A local directory path (DeepSpeed checkpoints and stage manifests are written locally)."""
    if not path or not path.strip():
        raise ValueError("must not be empty")
    if "://" in path:
        raise ValueError(f"{path!r}: must be a local directory (no URI scheme); checkpoints are written locally")
    return path


DatasetURI = Annotated[str, AfterValidator(check_uri)]
LocalDir = Annotated[str, AfterValidator(check_local_dir)]


class EvalStage(RulerItems):
    """The evaluation stage: RULER items, the methods compared, and whether it runs at all."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="False skips the stage in the train flow.")
    methods: list[Method] = Field(["memagent", "full-context"], min_length=1)

    def items(self) -> RulerItems:
        return RulerItems(**self.model_dump(exclude={"enabled", "methods"}))


# CPU-sized defaults of the flows (minutes on two cores); the configs' own defaults are the paper's.
CPU_EVAL = EvalStage(tasks=["niah_single_1", "vt"], lengths=[1024, 2048], samples=4)
# Two DAPO steps of 2 questions x 2 trajectories; 1024-token micro-batches keep the logits small.
CPU_TRAIN = TrainConfig(steps=2, batch_size=2, group_size=2, warmup_steps=0, save_every=2, lr=1e-6,
                        micro_batch_tokens=1024)


def resolve_local(path: str) -> str:
    """Absolute form of a local path (relative paths are relative to the working directory,
    the repository root under the deployments' pull step); URIs are returned unchanged."""
    return path if "://" in path else str(Path(path).expanduser().resolve())
