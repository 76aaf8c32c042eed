"""The hf engine's batched decode loop, with speculation (n-gram and aligned drafts) and per-row constraints.

After the prefill (:mod:`memagent.engines.hf`) the batch cache holds every row's prompt except
its last token, left-padded to a common length ``n``. Each step feeds ``[B, t]`` tokens: per row
its pending token and its draft (``t = 1 + k``, shorter drafts padded), with explicit
``position_ids`` (each row's own positions) and a 2-D attention mask over the cache slots.

Rollback without copies: after a step row ``i`` keeps ``a_i`` slots (its pending token and its
``m_i`` accepted drafted tokens); the cache is cropped to ``n + max_i a_i`` (a view of the
reserved buffer, :class:`~memagent.engines.kv_cache.ReservedCache`) and the slots a row did not
keep below that are masked out for good. Alone, a row leaves no holes; in a batch the holes per
step are the spread of the rows' acceptances.

Rows stop at EOS or a stop token (kept in the reply), at their own ``max_tokens`` (drafts are cut
so a step never overshoots), when their constraint is finished, or at a stop string (checked after
every step; the tokens after the one that completed it are dropped). Finished rows stay in the
batch (their slots masked) until the batch ends, as ``generate`` kept them.

Greedy rows repeat exactly: each step's draft length is a function of the batch's drafts and its
rows' acceptance so far (the cost model is the device's fixed prior), so the same batch runs the
same forwards, the same shapes, and bf16 rounds the same way (``Speculation.learn`` trades that
for a cost model refitted from the wall clock).

Constrained rows (``SamplingParams.json_schema``) never draft: their replies are short JSON, and
drafting under a grammar would need the grammar state advanced through each drafted token and
rolled back; each of their steps masks the logits with the constraint, samples, and accepts.

Drafters (:mod:`memagent.engines.speculation`): each row has an n-gram lookup and an aligned
drafter over its own prompt (the previous memory is in it); each step every drafter proposes,
the row takes the proposal with the higher expected yield under its own acceptance for that
drafter, and after the step every drafter sees the kept tokens (the aligned pointer follows the
reply whichever drafter drafted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from memagent.engines.config import EngineConfig
from memagent.engines.constraint import TokenConstraint
from memagent.engines.kv_cache import ReservedCache
from memagent.engines.speculation import (
    AcceptanceTracker,
    AlignedDrafter,
    CostModel,
    NgramDrafter,
    TokenHistory,
    accept_greedy,
    accept_sampled,
    choose_draft_len,
    matched_prefix,
    pick_proposal,
    sampling_probs,
)
from memagent.engines.stop import StopStrings

# DEBUG: one record per decode forward, its ``decode_forward`` attribute (k, rows, active rows,
# seconds): where the adaptive draft length went, and its ``decode_drafters`` attribute (per
# drafter name: rows that drafted from it, tokens drafted, tokens kept) (benchmarks collect them).
log = logging.getLogger(__name__)

# Every this many forwards a learning loop drafts in full anyway: the cost model then sees long
# verifications too (a fit from k <= 1 steps alone can wrongly keep k small forever).
EXPLORE_EVERY = 16


@dataclass(frozen=True)
class Speculation:
    """Speculation settings of a decode loop (``max_draft`` = 0 turns it off);
    :meth:`from_config` maps :class:`~memagent.engines.config.EngineConfig` onto them."""

    max_draft: int  # most tokens an n-gram lookup drafts (0: no speculation at all)
    ngram_min: int
    ngram_max: int
    aligned_draft: int = 0  # most tokens the aligned drafter drafts (0: no aligned drafter)
    ngram: bool = True  # draft by n-gram lookup (False: only the aligned drafter, if on)
    adaptive: bool = True  # choose k per step from the cost model; False: each proposal in full
    # Learn from the engine's history: refit the cost model from measured forward times, start each
    # row's acceptance from all earlier rows'. Off (the default), each step's k is a function of the
    # batch's own drafts and acceptance so far, so the same batch runs the same forwards (same bits).
    learn: bool = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> Speculation:
        """``config``'s speculation settings; no drafts when it does not speculate."""
        on = config.speculates()
        return cls(max_draft=config.speculative_tokens if on else 0,
                   ngram_min=config.prompt_lookup_min, ngram_max=config.prompt_lookup_max,
                   aligned_draft=config.aligned_draft_tokens if on and config.draft_from != "ngram" else 0,
                   ngram=config.draft_from != "aligned", adaptive=config.adaptive_draft,
                   learn=config.draft_learning)

    @property
    def longest(self) -> int:
        """The most tokens any drafter drafts in a step."""
        return max(self.max_draft if self.ngram else 0, self.aligned_draft) if self.max_draft > 0 else 0


@dataclass
class Row:
    """One request in the loop. ``temperature == 0`` is greedy."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    logprobs: bool = False
    constraint: TokenConstraint | None = None
    generator: torch.Generator | None = None  # a seeded request's own RNG (None: the loop's)
    abandoned: Callable[[], bool] | None = None  # True once nobody awaits the reply: the row stops
    on_tokens: Callable[[list[int]], None] | None = None  # called with each step's kept tokens (streaming)
    stop_ids: frozenset[int] = frozenset()  # tokens that end the reply besides EOS (kept, as EOS is)
    stop_strings: StopStrings | None = None  # strings that end the reply (the tokens up to one are kept)
    # Filled by the loop:
    tokens: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    stopped: bool = False  # EOS, a stop token or string, or a finished constraint (vs the max_tokens limit)
    done: bool = False
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0


class DecodeLoop:
    """Runs :class:`Row` s to completion over a prefilled cache.

    Args:
        model: the causal LM (called with ``input_ids``, ``position_ids``, ``attention_mask``,
            ``cache``).
        eos_ids: tokens that end a reply.
        pad_id: token fed in padded slots (masked out).
        spec: speculation settings.
        cost: the engine's forward-cost model (shared across batches, refitted online).
        acceptance: the engine's running acceptance per drafter name (the prior of each new row's
            estimate for that drafter).
        generator: torch RNG for sampling (None: the global one).
    """

    def __init__(self, model: torch.nn.Module, eos_ids: set[int], pad_id: int, spec: Speculation,
                 cost: CostModel | None = None, acceptance: dict[str, AcceptanceTracker] | None = None,
                 generator: torch.Generator | None = None):
        self.model, self.eos_ids, self.pad_id, self.spec = model, eos_ids, pad_id, spec
        self.cost = cost or CostModel()
        self.acceptance = acceptance if acceptance is not None else {}
        self.generator = generator
        self._forwards = 0

    @torch.inference_mode()
    def run(self, rows: list[Row], cache: ReservedCache, prefix_mask: torch.Tensor) -> list[Row]:
        """Decode every row; returns ``rows`` filled in.

        Args:
            rows: the batch, ``B`` rows.
            cache: a :class:`ReservedCache` holding each row's prompt but its last token,
                left-padded to ``n`` slots (``n`` may be 0).
            prefix_mask: ``[B, n]`` 1 where a slot holds a real token, 0 for padding.
        """
        device = next(self.model.parameters()).device
        b = len(rows)
        n = prefix_mask.shape[1]
        capacity = n + max(r.max_tokens for r in rows) + self.spec.max_draft + 1
        mask = torch.zeros((b, capacity), dtype=torch.long, device=device)
        mask[:, :n] = prefix_mask.to(device)
        built = [self.row_drafting(r) for r in rows]
        history, drafters = [h for h, _ in built], [ds for _, ds in built]
        pending = [r.prompt_ids[-1] for r in rows]
        position = [len(r.prompt_ids) - 1 for r in rows]
        trackers = [[AcceptanceTracker() for _ in ds] for ds in drafters]
        while not all(r.done for r in rows):
            drafts, proposals, chosen = self._drafts(rows, history, drafters, trackers)
            t = 1 + max(len(d) for d in drafts)
            if n + t > mask.shape[1]:  # holes outran the reservation: grow the mask (the cache grows itself)
                mask = torch.cat([mask, mask.new_zeros((b, n + t + capacity - mask.shape[1]))], dim=1)
            ids, pos = self._step_inputs(rows, pending, drafts, position, mask, n, t)
            keep = self._forward(rows, drafts, chosen, drafters, (ids, pos, mask[:, : n + t]), cache, device)
            grown = 0
            for i, r in enumerate(rows):
                if keep[i] is None:
                    continue
                slots = 1 + min(len(keep[i]) - 1, len(drafts[i]))  # pending + accepted drafted tokens
                mask[i, n + slots : n + t] = 0
                grown = max(grown, slots)
                kept = self._accept(r, keep[i], drafts[i], proposals[i], drafters[i], trackers[i], history[i])
                pending[i] = kept[-1]
                position[i] += len(kept)
            n += max(grown, 1)
            cache.truncate(n)
        return rows

    def _step_inputs(self, rows: list[Row], pending: list[int], drafts: list[list[int]], position: list[int],
                     mask: torch.Tensor, n: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's ``[B, t]`` input ids (per row its pending token, then its draft, padded) and positions
        (each row's own); the slots they fill are opened in ``mask`` from ``n`` on (done rows feed padding)."""
        ids = torch.full((len(rows), t), self.pad_id, dtype=torch.long)
        pos = torch.zeros((len(rows), t), dtype=torch.long)
        for i, r in enumerate(rows):
            pos[i] = torch.arange(position[i], position[i] + t)
            if r.done:
                continue
            seq = [pending[i], *drafts[i]]
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, n : n + len(seq)] = 1
        return ids, pos

    def _forward(self, rows: list[Row], drafts: list[list[int]], chosen: list[int | None], drafters: list[list],
                 inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], cache: ReservedCache,
                 device: torch.device) -> list[list[int] | None]:
        """One forward of the step's ``(ids, positions, attention mask)`` and its verification: per row the kept
        tokens (None: done). Timed, for the cost model (when it learns) and the DEBUG record."""
        ids, pos, attention = inputs
        t0 = time.perf_counter()
        logits = self.model(input_ids=ids.to(device), position_ids=pos.to(device),
                            attention_mask=attention, cache=cache, use_cache=True).logits
        keep = self._verify(rows, drafts, logits)
        seconds = time.perf_counter() - t0
        if self.spec.learn:  # the wall clock steers k only when asked to: greedy replies then vary
            self.cost.update(len(rows), ids.shape[1], seconds)
        if log.isEnabledFor(logging.DEBUG):
            self._log_forward(rows, drafts, chosen, drafters, keep, ids.shape[1] - 1, seconds)
        return keep

    def _accept(self, row: Row, kept: list[int], draft: list[int], proposals: list[list[int]], drafters: list,
                trackers: list[AcceptanceTracker], history: TokenHistory) -> list[int]:
        """Book one row's step: its counters, every drafter's acceptance (drafted or not), the reply and
        what the drafters have seen. Returns the tokens the reply grew by (cut at EOS or the limit)."""
        row.draft_tokens += len(draft)
        row.accepted_tokens += len(kept) - 1
        row.decode_steps += 1
        for proposal, drafter, tracker in zip(proposals, drafters, trackers):
            observed, agreed = matched_prefix(proposal, kept)
            tracker.record(observed, agreed)
            if self.spec.learn:
                self._global(drafter.name).record(observed, agreed)
        kept = self._finish(row, kept)
        history.extend(kept)
        for drafter in drafters:
            drafter.observe(history, len(kept))
        return kept

    def row_drafting(self, row: Row) -> tuple[TokenHistory, list[NgramDrafter | AlignedDrafter]]:
        """The row's token history (prompt + reply, grown in place, reserved for the reply) and its
        drafters over it, n-gram first (it wins ties). Constrained rows never draft."""
        spec = self.spec
        history = TokenHistory(row.prompt_ids, reserve=row.max_tokens + 1)
        if spec.max_draft <= 0 or row.constraint is not None:
            return history, []
        out: list[NgramDrafter | AlignedDrafter] = []
        if spec.ngram:
            out.append(NgramDrafter(history, spec.ngram_min, spec.ngram_max))
        if spec.aligned_draft > 0:
            out.append(AlignedDrafter(history.prompt))
        return history, out

    def _global(self, name: str) -> AcceptanceTracker:
        if name not in self.acceptance:  # not setdefault: a tracker per call, rows x drafters a step
            self.acceptance[name] = AcceptanceTracker()
        return self.acceptance[name]

    def _drafts(self, rows: list[Row], history: list[TokenHistory], drafters: list[list], trackers: list[list]
                ) -> tuple[list[list[int]], list[list[list[int]]], list[int | None]]:
        """Per row its draft this step (``[]`` for done, constrained or budget-bound rows), every
        drafter's proposal, and which one the draft is (cut to the step's ``k``; None: none).

        Each row takes the proposal with the higher expected yield: compared in full to choose a
        first ``k``, then again at that ``k`` (a long aligned draft cut short may yield less than
        an n-gram one), and ``k`` chosen again for the proposals kept.
        """
        spec = self.spec
        caps = {"ngram": spec.max_draft, "aligned": spec.aligned_draft}
        # Learning: the drafters' acceptance over all earlier rows is every row's prior; else the trackers' own.
        names = {d.name for ds in drafters for d in ds}
        prior = {name: self._global(name).alpha() for name in names} if spec.learn else dict.fromkeys(names)
        proposals: list[list[list[int]]] = []
        alphas: list[list[float]] = []
        for r, h, ds, trs in zip(rows, history, drafters, trackers):
            room = r.max_tokens - len(r.tokens) - 1  # the step also yields the model's own token
            live = not r.done and room > 0
            proposals.append([d.propose(h, min(caps[d.name], room)) if live else [] for d in ds])
            alphas.append([tr.alpha(prior[d.name]) for d, tr in zip(ds, trs)])
        self._forwards += 1
        chosen = [pick_proposal(p, a) if p else None for p, a in zip(proposals, alphas)]
        found = [p[j] if j is not None else [] for p, j in zip(proposals, chosen)]
        if not spec.adaptive or not any(found):
            return found, proposals, chosen
        active = [i for i, r in enumerate(rows) if not r.done and chosen[i] is not None]
        for _ in range(2):
            k = choose_draft_len([len(found[i]) for i in active], [alphas[i][chosen[i]] for i in active], len(rows),
                                 self.cost, spec.longest)
            chosen = [pick_proposal(p, a, k) if p else None for p, a in zip(proposals, alphas)]
            found = [p[j] if j is not None else [] for p, j in zip(proposals, chosen)]
        if spec.learn and self._forwards % EXPLORE_EVERY == 0:
            k = max(k, spec.max_draft)  # the refitted cost model also sees long verifications
        return [d[:k] for d in found], proposals, chosen

    def _log_forward(self, rows: list[Row], drafts: list[list[int]], chosen: list[int | None], drafters: list[list],
                     keep: list[list[int] | None], k: int, seconds: float) -> None:
        active = sum(not r.done for r in rows)
        by_drafter: dict[str, list[int]] = {}
        for i, j in enumerate(chosen):
            if j is not None and drafts[i] and keep[i] is not None:
                counts = by_drafter.setdefault(drafters[i][j].name, [0, 0, 0])
                counts[0] += 1
                counts[1] += len(drafts[i])
                counts[2] += len(keep[i]) - 1
        log.debug("decode forward: k=%d rows=%d active=%d %.4fs drafters=%s", k, len(rows), active, seconds,
                  by_drafter, extra={"decode_forward": (k, len(rows), active, seconds),
                                     "decode_drafters": {n: tuple(c) for n, c in by_drafter.items()}})

    def _verify(self, rows: list[Row], drafts: list[list[int]], logits: torch.Tensor) -> list[list[int] | None]:
        """Per row the kept tokens (accepted drafted ones + the model's next), None for done rows.

        ``logits`` ``[B, t, V]``; row i's positions ``0..len(drafts[i])`` are read.
        """
        greedy_rows = [i for i, r in enumerate(rows) if not r.done and r.temperature == 0 and r.constraint is None]
        targets = logits[greedy_rows].argmax(-1).tolist() if greedy_rows else []
        by_row = dict(zip(greedy_rows, targets))
        out: list[list[int] | None] = []
        for i, r in enumerate(rows):
            if r.done:
                out.append(None)
                continue
            d = len(drafts[i])
            row_logits = logits[i, : d + 1]
            if r.constraint is not None:  # d == 0: constrained rows never draft
                row_logits = r.constraint.mask_logits(row_logits[0].float().clone()).unsqueeze(0)
            if i in by_row:
                kept = accept_greedy(drafts[i], by_row[i])
            elif r.temperature == 0:
                kept = [int(row_logits[0].argmax())]
            else:
                kept = accept_sampled(drafts[i], sampling_probs(row_logits, r.temperature, r.top_p),
                                      r.generator or self.generator)
            if r.logprobs:  # the model's log-probs (before any constraint mask), as without speculation
                temp = r.temperature if r.temperature > 0 else 1.0
                logp = torch.log_softmax(logits[i, : len(kept)].float() / temp, dim=-1)
                r.token_logprobs.extend(logp.gather(-1, torch.tensor(kept, device=logp.device)[:, None])[:, 0].tolist())
            out.append(kept)
        return out

    def _finish(self, r: Row, kept: list[int]) -> list[int]:
        """Append ``kept`` to the reply up to EOS / a stop token / the limit / a finished constraint (or an
        abandoned row), then cut it after a stop string; mark done; hand what was kept to ``on_tokens``."""
        for j, tok in enumerate(kept):
            if r.constraint is not None:
                r.constraint.accept(tok)
            r.tokens.append(tok)
            stop = (tok in self.eos_ids or tok in r.stop_ids
                    or (r.constraint is not None and r.constraint.is_finished()))
            if stop or len(r.tokens) >= r.max_tokens or (r.abandoned is not None and r.abandoned()):
                r.stopped, r.done = stop, True
                kept = kept[: j + 1]
                break
        if r.stop_strings is not None:
            keep = r.stop_strings.scan(r.tokens, len(kept))
            if keep is not None:  # a stop string ends the reply: the drafted tokens after it go
                kept = kept[: len(kept) - (len(r.tokens) - keep)]
                del r.tokens[keep:]
                r.stopped, r.done = True, True
        if r.logprobs:
            del r.token_logprobs[len(r.tokens):]
        if r.on_tokens is not None:
            r.on_tokens(kept)
        return kept
