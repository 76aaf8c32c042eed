"""Speculation, the pure parts: drafting, acceptance, how many tokens to draft, the sampling distribution.

A memory update mostly copies: the new memory repeats the old one, or quotes the chunk. So the
reply's last n-gram usually occurs earlier in its prompt (or reply), and the tokens that followed
it there are a good guess for what comes next. The decode loop (:mod:`memagent.engines.hf_decode`)
feeds each row's pending token plus its draft in one forward pass and keeps, per row, the
drafted tokens the model agrees with plus the model's own next token, so the output is the
model's (:mod:`.acceptance`: greedy keeps the argmax continuation, sampling keeps the distribution).

- :mod:`.drafters`: n-gram lookup over an index of the row's tokens (:class:`NgramDrafter`) and
  aligned drafting (:class:`AlignedDrafter`): a memory update is mostly a copy of the previous
  memory, which sits in the prompt, so a pointer into the prompt follows the reply and drafts
  the rest of the memory; after an edit :func:`resync` finds the reply's last three, two or one
  tokens in the prompt nearest to the pointer, so drafting resumes on the first copied token.
- :mod:`.cost`: the forward cost model ``c0 + c_row·B + c_tok·B·t``, the device's fixed prior
  (refitted online only when asked to: greedy replies then follow the wall clock)
  (:class:`CostModel`), and the draft length ``k`` that maximises expected tokens per second
  (:func:`choose_draft_len`). Each step a row takes the proposal, n-gram or aligned, with the
  higher expected yield under its own acceptance for that drafter at the step's ``k``
  (:func:`pick_proposal`).
- :mod:`.acceptance`: the greedy and sampled acceptance rules, and the per-drafter acceptance
  estimate (:class:`AcceptanceTracker`); both drafters are scored against the kept tokens every
  step, drafted or not (:func:`matched_prefix`).
- :mod:`.top_p`: the sampling distribution (temperature, then top-p) both rules compare against.
"""

from memagent.engines.speculation.acceptance import AcceptanceTracker, accept_greedy, accept_sampled, matched_prefix
from memagent.engines.speculation.cost import (
    CostModel,
    choose_draft_len,
    expected_tokens,
    nonnegative_quadratic_min,
    pick_proposal,
)
from memagent.engines.speculation.drafters import (
    AlignedDrafter,
    NgramDrafter,
    NgramIndex,
    TokenHistory,
    advance_alignment,
    aligned_draft,
    resync,
    token_index,
)
from memagent.engines.speculation.top_p import sampling_probs

__all__ = [
    "AcceptanceTracker", "AlignedDrafter", "CostModel", "NgramDrafter", "NgramIndex", "accept_greedy",
    "accept_sampled", "advance_alignment", "aligned_draft", "choose_draft_len", "expected_tokens",
    "matched_prefix", "nonnegative_quadratic_min", "pick_proposal", "resync", "sampling_probs",
    "token_index", "TokenHistory",
]
