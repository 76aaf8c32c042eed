"""Group rollouts through the memory agent, recorded conversation by conversation.

For each question, G trajectories run through :func:`memagent.agent.read_document` (the very
function batch jobs use), all at once so the engine batches them. Each trajectory yields
``n_chunks + 1`` conversations (memory updates, then the answer); each is recorded with its
prompt ids, response ids, behaviour log-probs and whether the length limit cut it. The
reward is computed on the final response only (default: strict ``boxed_em``).

Options (DAPO): dynamic sampling drops groups whose rewards are all equal (they carry no
advantage) and draws new questions until the batch is full or a round limit is hit;
``overlong`` masks or penalises conversations cut by their length limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from memagent.agent import InputError, Result, read_document
from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.rl.advantages import all_equal_groups
from memagent.verify import boxed_em

log = logging.getLogger(__name__)

RewardFn = Callable[[str, Sequence[str]], float]
"""``(final response text, reference answers) -> reward``; default :func:`boxed_em`."""
Draw = Callable[[int], list[Mapping[str, Any]]]
"""``draw(n)`` -> the next ``n`` examples (dicts with id, question, context, answers)."""


# What a rollout engine can do beyond :class:`Engine`, as checkable protocols: the trainer
# needs WeightSync or InProcessModel; SleepMode (vLLM) frees the GPU during updates; Shutdown
# stops a subprocess.
@runtime_checkable
class WeightSync(Protocol):
    """Takes the policy's full state dict (name -> tensor) and generates with it from then on."""

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None: ...


@runtime_checkable
class SleepMode(Protocol):
    """Releases its device memory between rollouts (weights offloaded, KV cache freed)."""

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...


@runtime_checkable
class InProcessModel(Protocol):
    """Generates with ``model``, a torch module in this process: the trainer can train that very module,
    so the weights are held once and every update is in the engine at once (no sync); ``weights_changed`` drops
    what the engine computed with the old weights (cached prompt KV)."""

    model: torch.nn.Module

    def weights_changed(self) -> None: ...


@runtime_checkable
class Shutdown(Protocol):
    """Holds a process or threads that should be stopped explicitly, not at interpreter exit."""

    def shutdown(self) -> None: ...


@dataclass
class Conversation:
    """One conversation of one trajectory, as the trainer needs it."""

    traj_index: int  # index into RolloutBatch.trajectories
    group_id: int  # question the trajectory answers (shared by its G trajectories)
    conv_index: int  # 0..n_chunks-1 memory updates, n_chunks the final answer
    prompt_ids: list[int]
    response_ids: list[int]  # ends with EOS when the model stopped by itself
    behaviour_logprobs: list[float] | None  # one per response id, from the rollout engine
    is_final: bool
    truncated: bool  # finish_reason == "length": cut by memory_tokens / answer_tokens
    trainable: bool = True  # False: masked out of the loss (overlong='mask', empty response)


@dataclass
class Trajectory:
    """One rollout of the agent on one question."""

    example_id: str
    group_id: int
    score: float  # the verifier's value on the final response
    reward: float  # what the advantage uses (score, minus an overlong penalty if asked)
    n_chunks: int
    n_convs: int
    response: str
    prediction: str | None
    truncated_convs: int


@dataclass
class RolloutBatch:
    """All trajectories of one step and their conversations (grouped by trajectory, in order)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)
    examples_drawn: int = 0
    groups_generated: int = 0
    groups_dropped: int = 0  # dynamic sampling: all-equal rewards
    groups_failed: int = 0  # input errors (e.g. question over query_tokens)
    rounds: int = 0
    seconds: float = 0.0
    generated_tokens: int = 0
    # Reward and score of every trajectory generated, kept or dropped: the policy's actual
    # success rate (kept groups alone are biased towards mixed outcomes by dynamic sampling).
    generated_rewards: list[float] = field(default_factory=list)
    generated_scores: list[float] = field(default_factory=list)

    @property
    def rewards(self) -> torch.Tensor:
        """``[N]`` reward of each trajectory."""
        return torch.tensor([t.reward for t in self.trajectories], dtype=torch.float32)

    @property
    def group_ids(self) -> torch.Tensor:
        """``[N]`` group id of each trajectory."""
        return torch.tensor([t.group_id for t in self.trajectories], dtype=torch.long)

    @property
    def conv_traj_index(self) -> torch.Tensor:
        """``[M]`` trajectory index of each conversation."""
        return torch.tensor([c.traj_index for c in self.conversations], dtype=torch.long)


def default_reward(response: str, answers: Sequence[str]) -> float:
    """Strict training reward: the last ``\\boxed{}`` equals a reference (the paper's training reward)."""
    return boxed_em(response, answers)


def _answers(example: Mapping[str, Any]) -> list[str]:
    answers = example.get("answers")
    if answers is None:
        raise InputError(f"example {example.get('id')!r} has no 'answers': training needs references")
    if isinstance(answers, str):
        return [answers]
    return [str(a) for a in answers]


async def rollout_group(
    engine: Engine, example: Mapping[str, Any], config: AgentConfig, group_size: int
) -> list[Result]:
    """G independent reads of one example, concurrently (the engine batches their calls)."""
    reads = [
        read_document(engine, example["question"], example["context"], config, keep_completions=True, logprobs=True)
        for _ in range(group_size)
    ]
    return list(await asyncio.gather(*reads))


def record_group(
    batch: RolloutBatch,
    example: Mapping[str, Any],
    results: Sequence[Result],
    group_id: int,
    *,
    reward_fn: RewardFn = default_reward,
    overlong: str = "none",
    overlong_penalty: float = 0.5,
) -> None:
    """Append one group's trajectories and conversations to ``batch`` (in place)."""
    answers = _answers(example)
    for res in results:
        assert res.completions is not None, "read_document must keep completions for training"
        convs = conversations(res, len(batch.trajectories), group_id, overlong)
        batch.conversations += convs
        batch.generated_tokens += sum(len(c.response_ids) for c in convs)
        cut = sum(c.truncated for c in convs)
        score = float(reward_fn(res.response, answers))
        reward = score - (overlong_penalty if overlong == "penalize" and cut else 0.0)
        batch.trajectories.append(Trajectory(
            example_id=str(example.get("id", "")), group_id=group_id, score=score, reward=reward,
            n_chunks=res.n_chunks, n_convs=len(convs), response=res.response, prediction=res.prediction,
            truncated_convs=cut))


def conversations(res: Result, traj_index: int, group_id: int, overlong: str) -> list[Conversation]:
    """One trajectory's conversations (memory updates, then the answer), trainable unless empty or, with
    ``overlong="mask"``, cut by their token budget."""
    out = []
    for j, c in enumerate(res.completions or ()):
        if c.prompt_token_ids is None or c.token_ids is None:
            raise RuntimeError("the engine returned no token ids: it cannot serve RL rollouts")
        truncated = c.finish_reason == "length"
        out.append(Conversation(
            traj_index=traj_index, group_id=group_id, conv_index=j, prompt_ids=list(c.prompt_token_ids),
            response_ids=list(c.token_ids), behaviour_logprobs=list(c.logprobs) if c.logprobs is not None else None,
            is_final=j == len(res.completions or ()) - 1, truncated=truncated,
            trainable=len(c.token_ids) > 0 and not (overlong == "mask" and truncated)))
    return out


async def collect_rollouts(
    engine: Engine,
    draw: Draw,
    *,
    batch_size: int,
    group_size: int,
    config: AgentConfig,
    reward_fn: RewardFn = default_reward,
    dynamic_sampling: bool = False,
    max_rounds: int = 4,
    overlong: str = "none",
    overlong_penalty: float = 0.5,
) -> RolloutBatch:
    """Roll out ``batch_size`` questions x ``group_size`` trajectories.

    ``config`` should sample (temperature > 0) and ask for ``\\boxed{}`` answers. Without
    dynamic sampling one round of ``batch_size`` examples is drawn. With it, groups whose
    rewards are all equal are dropped and new examples drawn (as many as are missing) until
    ``batch_size`` groups are kept or ``max_rounds`` rounds ran; the batch may then be short.
    Groups whose example is invalid (:class:`InputError`) are skipped and counted.
    """
    t0 = time.perf_counter()
    out = RolloutBatch()
    next_group = 0
    kept = 0
    while kept < batch_size and out.rounds < (max_rounds if dynamic_sampling else 1):
        out.rounds += 1
        examples = draw(batch_size - kept)
        out.examples_drawn += len(examples)
        if not examples:
            break
        round_batch = await rollout_round(engine, examples, out, next_group, config=config, group_size=group_size,
                                          reward_fn=reward_fn, overlong=overlong, overlong_penalty=overlong_penalty)
        next_group += len({t.group_id for t in round_batch.trajectories})
        drop = all_equal_groups(round_batch.rewards, round_batch.group_ids) if dynamic_sampling else set()
        room = batch_size - kept
        keep_ids = [g for g in dict.fromkeys(t.group_id for t in round_batch.trajectories) if g not in drop][:room]
        out.groups_dropped += len(drop)
        _append_groups(out, round_batch, set(keep_ids))
        kept += len(keep_ids)
    out.seconds = time.perf_counter() - t0
    return out


async def rollout_round(engine: Engine, examples: list[dict[str, Any]], out: RolloutBatch, first_group: int, *,
                        config: AgentConfig, group_size: int, reward_fn: RewardFn, overlong: str,
                        overlong_penalty: float) -> RolloutBatch:
    """One round: every example's group rolled out at once, recorded as groups ``first_group``, ... in a batch
    of its own; ``out`` counts what was generated (and the groups skipped for an invalid example)."""
    results = await asyncio.gather(*(rollout_group(engine, ex, config, group_size) for ex in examples),
                                   return_exceptions=True)
    round_batch, group = RolloutBatch(), first_group
    for ex, res in zip(examples, results):
        if isinstance(res, InputError):
            out.groups_failed += 1
            log.warning("skipping example %r: %s", ex.get("id"), res)
            continue
        if isinstance(res, BaseException):
            raise res
        record_group(round_batch, ex, res, group, reward_fn=reward_fn, overlong=overlong,
                     overlong_penalty=overlong_penalty)
        group += 1
    out.groups_generated += group - first_group
    out.generated_tokens += round_batch.generated_tokens
    out.generated_rewards += [t.reward for t in round_batch.trajectories]
    out.generated_scores += [t.score for t in round_batch.trajectories]
    return round_batch


def _append_groups(dst: RolloutBatch, src: RolloutBatch, keep: set[int]) -> None:
    """Move the trajectories (and their conversations) of groups ``keep`` from src to dst."""
    remap: dict[int, int] = {}
    for i, t in enumerate(src.trajectories):
        if t.group_id in keep:
            remap[i] = len(dst.trajectories)
            dst.trajectories.append(t)
    for c in src.conversations:
        if c.traj_index in remap:
            c.traj_index = remap[c.traj_index]
            dst.conversations.append(c)
