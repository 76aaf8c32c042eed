"""Weights out of the trainer: into the rollout engine, into checkpoints, into HF exports.

Run directory layout (written by :func:`memagent.rl.trainer.train`): ``run.json``,
``model_config/`` (base config + tokenizer, for export), ``metrics.jsonl``,
``checkpoints/step_NNNNNN/`` (DeepSpeed states + ``hf/``) and ``checkpoints/latest``.
"""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping

import torch

from memagent.rl.rollout import WeightSync


def gathered_state_dict(model: torch.nn.Module, zero_stage: int) -> dict[str, torch.Tensor]:
    """Full CPU state dict of the policy (gathers ZeRO-3 partitions; stage <= 2 holds full weights).

    Always a copy: ZeRO-1/2 keep the weights as views of one flat buffer, which safetensors
    would refuse as shared memory.
    """
    ctx = nullcontext()
    if zero_stage == 3:
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    with ctx:
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def push_weights(model: torch.nn.Module, rollout_engine: WeightSync, zero_stage: int) -> None:
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


def step_tag(step: int) -> str:
    """The checkpoint tag of a step: ``step_000012``."""
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
    """Append one JSON line."""
    with path.open("a") as f:
        f.write(json.dumps(record, default=float) + "\n")


def save_checkpoint(engine: Any, tokenizer: Any, ckpt_dir: Path, step: int, cursors: list[int], *,
                    zero_stage: int, keep: int | None, rank: int) -> Path:
    """DeepSpeed states (all ranks, shared dir) + an HF export in ``<tag>/hf`` (rank 0).

    ``cursors``: each rank's data-stream cursor, restored on resume.
    """
    tag = step_tag(step)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step, "cursors": cursors})
    sd = gathered_state_dict(engine.module, zero_stage)  # collective at ZeRO-3
    if rank == 0:
        export_hf(engine.module, sd, tokenizer, ckpt_dir / tag / "hf")
        prune_checkpoints(ckpt_dir, keep)
    return ckpt_dir / tag


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
