"""Plumbing of the trainer: distributed setup, data order, batching, log-probs, weights, checkpoints.

Nothing here is the algorithm (that is :mod:`advantages`, :mod:`loss` and the loop in
:mod:`trainer`); these are the helpers a reader can skip on first reading.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from memagent.rl.loss import entropy_from_logits, masked_mean, token_log_probs
from memagent.rl.rollout import Conversation

REQUIRED_COLUMNS = ("id", "question", "context", "answers")
TEMPLATE = Path(__file__).resolve().parents[2] / "infra" / "deepspeed" / "zero2.json"


# ---------------------------------------------------------------------------------------------
# Distributed setup
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed() -> tuple[int, int]:
    """Prepare the environment DeepSpeed reads; returns ``(rank, world_size)``.

    Under the DeepSpeed launcher or torchrun the variables are already set. A plain
    ``python`` process becomes rank 0 of 1 (DeepSpeed otherwise tries MPI discovery, and it
    asserts on ``LOCAL_RANK`` even single-process). Without CUDA it selects the CPU
    accelerator, whose backend is gloo when oneCCL is absent.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    import deepspeed

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=None if torch.cuda.is_available() else "gloo",
                                   auto_mpi_discovery=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def all_reduce(value: float, op: str = "sum") -> float:
    """A scalar reduced over ranks (identity when single-process)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM)
    return float(t.item())


def all_gather_ints(value: int) -> list[int]:
    """One int per rank, in rank order."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return [int(value)]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, int(value))
    return [int(v) for v in out]


def all_gather_objects(value: Any) -> list[Any]:
    """One picklable value per rank, in rank order."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


# How each per-rank step metric combines into the run's: counts and throughputs add up, times
# and memory take the slowest rank, per-trajectory means weight ranks by their trajectories,
# token-level statistics by their response tokens; _GLOBAL ones are the same on every rank.
_SUMMED = {"groups", "groups_dropped", "groups_failed", "trajectories", "trajectories_generated", "trained_convs",
           "response_tokens", "rollout_tokens_per_s", "train_tokens_per_s"}
_SLOWEST = {"rollout_s", "update_s", "step_s", "peak_rss_mb", "rollout_rounds"}
_PER_TRAJECTORY = {"reward_mean", "accuracy", "convs_per_traj", "chunks_per_doc", "memory_len", "answer_len",
                   "truncated_frac"}
_PER_GENERATED = {"reward_generated_mean", "accuracy_generated"}
_GLOBAL = {"step", "lr", "grad_norm", "optimizer_steps"}


def merge_rank_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine one step's metric records of all ranks (rank order) into the run's record.

    ``[{"trajectories": 2, "reward_mean": 1.0, ...}, {"trajectories": 2, "reward_mean": 0.0, ...}]``
    -> ``{"trajectories": 4, "reward_mean": 0.5, ...}``. Lists (example ids) are concatenated;
    ``data_cursor`` becomes one pair per rank.
    """
    if len(records) == 1:
        return dict(records[0])
    merged: dict[str, Any] = {}
    for key, first in records[0].items():
        values = [r[key] for r in records]
        if key == "data_cursor":
            merged[key] = [list(v) for v in values]
        elif isinstance(first, list):
            merged[key] = [x for v in values for x in v]
        elif not isinstance(first, (int, float)) or isinstance(first, bool) or key in _GLOBAL:
            merged[key] = first
        elif key in _SUMMED:
            merged[key] = sum(values)
        elif key in _SLOWEST:
            merged[key] = max(values)
        else:
            weight = ("trajectories" if key in _PER_TRAJECTORY else
                      "trajectories_generated" if key in _PER_GENERATED else "response_tokens")
            w = [r.get(weight) or 0 for r in records]
            merged[key] = sum(v * x for v, x in zip(values, w)) / sum(w) if sum(w) else sum(values) / len(values)
    merged["world_size"] = len(records)
    return merged


# ---------------------------------------------------------------------------------------------
# Data: loading and a resumable, deterministic order
# ---------------------------------------------------------------------------------------------


def load_examples(data: str | Path | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Training examples from a Parquet file/URI (local or s3://), a JSONL file, or a list of dicts.

    Each needs ``id``, ``question``, ``context``, ``answers`` (list of strings); other
    columns are kept. Raises ``ValueError`` naming what is missing.
    """
    if isinstance(data, (str, Path)):
        src = str(data)
        if src.endswith((".jsonl", ".json")):
            rows = [json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()]
        else:
            import pyarrow.parquet as pq

            rows = pq.read_table(src).to_pylist()
    else:
        rows = [dict(r) for r in data]
    if not rows:
        raise ValueError("training data is empty")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"training data lacks column(s) {missing}; needs {list(REQUIRED_COLUMNS)}")
    for r in rows:
        if isinstance(r["answers"], str):
            r["answers"] = [r["answers"]]
    return rows


class DataStream:
    """Examples in a seeded order, epoch after epoch, from a cursor that checkpoints restore.

    ``order(epoch)`` is a permutation fixed by (seed, epoch), so ``DataStream(cursor=k)``
    continues exactly where a stream that had drawn k examples stopped.
    """

    def __init__(self, examples: Sequence[Mapping[str, Any]], *, seed: int, shuffle: bool, cursor: int = 0):
        if not examples:
            raise ValueError("no examples for this rank")
        self.examples = list(examples)
        self.seed, self.shuffle, self.cursor = seed, shuffle, cursor
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            n = len(self.examples)
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._orders[epoch] = torch.randperm(n, generator=g).tolist()
            else:
                self._orders[epoch] = list(range(n))
        return self._orders[epoch]

    def draw(self, n: int) -> list[Mapping[str, Any]]:
        out = []
        size = len(self.examples)
        for _ in range(n):
            epoch, pos = divmod(self.cursor, size)
            out.append(self.examples[self.order(epoch)[pos]])
            self.cursor += 1
        return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Batching conversations for the policy forward
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    """A conversation ready for the loss: its advantage and (after scoring) its log-probs."""

    conv: Conversation
    advantage: float
    old_logp: torch.Tensor | None = None  # [T] recomputed by the policy before the update
    ref_logp: torch.Tensor | None = None  # [T] under the reference (initial) policy

    @property
    def length(self) -> int:
        return len(self.conv.prompt_ids) + len(self.conv.response_ids)


def micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Split into micro-batches whose padded size (rows x longest row) stays within the budget.

    Samples are sorted by length first (less padding); a sample longer than the budget gets a
    micro-batch of its own. Example: lengths [10, 30, 12, 28], budget 60 -> [[10, 12], [28, 30]].
    """
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in sorted(samples, key=lambda s: s.length):
        if cur and (len(cur) + 1) * s.length > token_budget:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def collate(samples: Sequence[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded ``prompt + response`` rows; response tokens right-aligned in ``[B, T]``.

    Returns ``input_ids, attention_mask, position_ids [B, L]``, ``targets, response_mask
    [B, T]`` (T = longest response) and ``advantages [B]``. Left padding puts every response
    at the end of its row, so the policy needs logits only for the last ``T + 1`` positions.
    Position ids count real tokens only, as during generation.
    """
    L = max(s.length for s in samples)
    T = max(len(s.conv.response_ids) for s in samples)
    B = len(samples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        ids = s.conv.prompt_ids + s.conv.response_ids
        r = len(s.conv.response_ids)
        input_ids[i, L - len(ids):] = torch.tensor(ids)
        attention[i, L - len(ids):] = 1
        if r:
            targets[i, T - r:] = torch.tensor(s.conv.response_ids)
            response_mask[i, T - r:] = 1.0 if s.conv.trainable else 0.0
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
            "targets": targets, "response_mask": response_mask, "advantages": advantages}


def response_log_probs(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *, temperature: float = 1.0, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, T]`` of the response tokens (and their entropies ``[B, T]`` if asked).

    Logits at position p predict token p+1: the last ``T + 1`` positions' logits, minus the
    final one, line up with the right-aligned ``targets``.
    """
    device = next(model.parameters()).device
    T = batch["targets"].shape[1]
    out = model(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        position_ids=batch["position_ids"].to(device),
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, -(T + 1):-1, :]  # [B, T, V]
    logp = token_log_probs(logits, batch["targets"].to(device), temperature)  # [B, T]
    ent = None
    if entropy:
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach() / temperature)
    return logp, ent


@torch.no_grad()
def score_samples(
    model: torch.nn.Module, samples: Sequence[Sample], *, pad_id: int, token_budget: int, temperature: float,
    attr: str,
) -> None:
    """Fill ``sample.<attr>`` (``old_logp`` or ``ref_logp``) with ``model``'s response log-probs."""
    for mb in micro_batches(samples, token_budget):
        batch = collate(mb, pad_id)
        logp, _ = response_log_probs(model, batch, temperature=temperature)
        for i, s in enumerate(mb):
            r = len(s.conv.response_ids)
            setattr(s, attr, logp[i, logp.shape[1] - r:].float().cpu() if r else torch.zeros(0))


def stack_right(values: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    """Right-align 1-D tensors into ``[B, T]`` (zeros on the left), matching :func:`collate`."""
    out = torch.zeros((len(values), T))
    for i, v in enumerate(values):
        if v.numel():
            out[i, T - v.numel():] = v
    return out


def behaviour_gap(samples: Sequence[Sample], old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |old - behaviour| log-prob over masked tokens ``[B, T]``: how far the rollout engine's
    numbers are from the trainer's (dtype, kernels, padding). 0.0 when the engine gave none."""
    if any(s.conv.behaviour_logprobs is None for s in samples):
        return 0.0
    beh = stack_right([torch.tensor(s.conv.behaviour_logprobs) for s in samples], old_logp.shape[1])
    return masked_mean((old_logp.float().cpu() - beh).abs(), mask.cpu()).item()


# ---------------------------------------------------------------------------------------------
# Weights: gather, push into the rollout engine, export
# ---------------------------------------------------------------------------------------------


def gathered_state_dict(model: torch.nn.Module, zero_stage: int) -> dict[str, torch.Tensor]:
    """Full CPU state dict of the policy (gathers ZeRO-3 partitions; stage <= 2 holds full weights)."""
    ctx = nullcontext()
    if zero_stage == 3:
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    with ctx:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def push_weights(model: torch.nn.Module, rollout_engine: Any, zero_stage: int) -> None:
    """Weight sync: the rollout engine generates with the updated policy from now on.

    Both engines take the full state dict through ``update_weights``: the transformers engine
    copies it into its model in place; the vLLM engine writes it as safetensors, reloads it in
    every worker (``collective_rpc("reload_weights")``) and resets its prefix cache.
    """
    rollout_engine.update_weights(gathered_state_dict(model, zero_stage))


def export_hf(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], tokenizer: Any, out: Path) -> Path:
    """Write an HF model directory (safetensors + config + tokenizer) any engine can load."""
    out.mkdir(parents=True, exist_ok=True)
    # Tied copies (lm_head = embeddings) are stored once, as save_pretrained does for a live model.
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    sd = {k: v for k, v in state_dict.items() if k not in tied}
    model.save_pretrained(out, state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints and logs
# ---------------------------------------------------------------------------------------------


def step_tag(step: int) -> str:
    return f"step_{step:06d}"


def latest_tag(ckpt_dir: Path) -> str | None:
    """The tag DeepSpeed's ``latest`` file names, if any."""
    f = ckpt_dir / "latest"
    return f.read_text().strip() if f.is_file() else None


def prune_checkpoints(ckpt_dir: Path, keep: int | None) -> None:
    """Delete all but the newest ``keep`` step_* checkpoints."""
    if keep is None:
        return
    tags = sorted(p for p in ckpt_dir.glob("step_*") if p.is_dir())
    for p in tags[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def write_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=float) + "\n")


def resolve_checkpoint(checkpoint: str | Path) -> tuple[Path, str]:
    """``(checkpoints dir, tag)`` for a run dir, its checkpoints dir, or one tag dir."""
    p = Path(checkpoint)
    for cand in (p / "checkpoints", p):
        tag = latest_tag(cand)
        if tag:
            return cand, tag
    if (p.parent / "latest").is_file() or any(p.glob("*model_states.pt")):
        return p.parent, p.name
    raise FileNotFoundError(f"no DeepSpeed checkpoint found at {p} (expected a 'latest' file or step_* dir)")


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """HF export from a DeepSpeed checkpoint (fp32 master weights), without DeepSpeed running.

    Model config and tokenizer come from the run's ``model_config/`` (written at start).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    ckpt_dir, tag = resolve_checkpoint(checkpoint)
    cfg_dir = ckpt_dir.parent / "model_config"
    if not (cfg_dir / "config.json").is_file():
        raise FileNotFoundError(f"{cfg_dir} missing: export needs the run's model_config/ next to checkpoints/")
    if any((ckpt_dir / tag).glob("zero_pp_rank_*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
    else:  # ZeRO stage 0: the module states hold the full model
        sd = torch.load(ckpt_dir / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    config = AutoConfig.from_pretrained(cfg_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    return export_hf(model, model.state_dict(), AutoTokenizer.from_pretrained(cfg_dir), Path(out))


def mean(values: Iterable[float]) -> float:
    vals = list(values)
    return float(sum(vals) / len(vals)) if vals else 0.0
