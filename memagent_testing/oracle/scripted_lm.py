"""A scripted "perfect" causal LM behind the real hf engine (:class:`~memagent.engines.hf.TransformersEngine`).

:func:`scripted_engine` builds the real engine (chat template, batching, reserved KV cache,
speculation, JSON-Schema grammar, ``max_tokens``) over the packaged SmolLM2-135M-Instruct
tokenizer, with :class:`ScriptedLM` in place of the network: a model with no weights that writes,
for every prompt, the reply a ``ReplyFn`` gives for the prompt's text.

How the model knows what to say: it stores each token's id as its one-dimensional key in the KV
cache, so every forward sees each row's whole sequence (the attention mask drops padding and the
decode loop's holes). The prompt ends at the last generation header (``<|im_start|>assistant\\n``
for this template); the reply function is called once per distinct prompt, and its text,
tokenised with EOS appended, is the script. Each position's logits put the script's next token
first while the tokens so far follow the script (token by token, or else by text: a grammar may
force another split of the same text), then every token that writes a shorter start of the rest
of the reply (so a grammar that allows only part of the script's token, e.g. ``}`` of ``},``
at ``maxItems`` or a string's last allowed characters at ``maxLength``, still gets the script).
Every rank sits ``LOGIT_GAP`` below the one before, so sampling at temperature <= 1 writes the
tokens greedy decoding writes (a shorter split sampled instead would cut a reply at ``max_tokens``
earlier in its text).

Off the script (the grammar masked the scripted token, e.g. it closed an array at ``maxItems``,
or the tokens so far are not a prefix of the reply), every token keeps a fixed rank, best first:
EOS, ``]``, ``}``, ``"``, ``,``, ``:``, ``0``, then all other tokens by id (single characters
first) with whitespace-only tokens last; inside a JSON string (an odd number of unescaped ``"``
written so far) ``"`` moves up to just after EOS. Under a grammar that ends the value quickly:
close the string, then the array or object, else write what is still required with minimal
values (``""``, ``0``, ``[]``), never a whitespace loop. Unconstrained, an off-script row just
ends (EOS).

Limits: once the text written leaves the reply (the grammar forced a different character), the
model never returns to the script: it only closes the JSON (a string cut at ``maxLength`` is
closed, the keys still required get minimal values). A JSON reply must write its keys in the
schema's order (the grammar's order) to stay on the script. The tokenizer drops control
characters other than newline and tab, so no reply holds them. Special-token names in a reply
are written as plain text. The engine's sliding-window path (``model.generate``) is not
implemented: SmolLM2's config has no sliding window, so the engine never takes it. Each forward
loops in Python over rows and positions (fine for tests; not a speed model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from memagent.engines import hf
from memagent.engines.config import EngineConfig
from memagent.engines.hf import TransformersEngine
from memagent.engines.kv_cache import ReservedCache

ReplyFn = Callable[[str], str]  # the prompt's text (chat template applied) -> the reply a perfect model writes

MODEL = "smollm2-135m"
SCRIPT_LOGIT = 0.0  # the scripted token; every other token sits at least LOGIT_GAP below it
LOGIT_GAP = 40.0  # per rank: sampling at temperature <= 1 picks the best allowed token (e^-40 ~ 4e-18)
CLOSERS = ("]", "}", '"', ",", ":", "0")  # after EOS, the fallback's first choices, in this order


@dataclass
class ScriptedOutput:
    """What the engine reads from a forward: ``logits`` ``[B, kept, V]`` and the ``cache``."""

    logits: torch.Tensor
    cache: ReservedCache


def fallback_ranks(tokenizer: Any, vocab_size: int, eos_id: int) -> list[int]:
    """Every token id once, best first: EOS, the closers, other tokens by id, whitespace-only ones last."""
    first = [eos_id]
    for text in CLOSERS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in first:
            first.append(ids[0])
    chosen = set(first)
    pieces = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    blank = {i for i, p in enumerate(pieces) if p is not None and not tokenizer.convert_tokens_to_string([p]).strip()}
    rest = [i for i in range(vocab_size) if i not in chosen and i not in blank]
    return first + rest + sorted(blank - chosen)


def in_json_string(text: str) -> bool:
    """Whether ``text`` (the start of a JSON value) ends inside a string: an odd count of unescaped quotes."""
    inside = escaped = False
    for ch in text:
        if inside and escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return inside


def generation_header(tokenizer: Any) -> list[int]:
    """The tokens the chat template appends for the assistant's turn (what every prompt ends with)."""
    messages = [{"role": "user", "content": "x"}]
    ids = [list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=g)["input_ids"])
           for g in (False, True)]
    header = ids[1][len(ids[0]):]
    if not header or ids[1][: len(ids[0])] != ids[0]:
        raise ValueError("the chat template's generation prompt is not a suffix; cannot find where prompts end")
    return header


class ScriptedLM(torch.nn.Module):
    """A causal LM (as the hf engine calls it) that writes ``reply(prompt text)`` for every prompt.

    Args:
        model_dir: the converted model directory (its tokenizer, config and generation config).
        reply: the reply function; called once per distinct prompt (cached in :attr:`replies`).
    """

    def __init__(self, model_dir: str | Path, reply: ReplyFn):
        super().__init__()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.config = AutoConfig.from_pretrained(str(model_dir), num_hidden_layers=1)
        self.generation_config = GenerationConfig.from_pretrained(str(model_dir))
        self.reply = reply
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.header = generation_header(self.tokenizer)
        quote = self.tokenizer.encode('"', add_special_tokens=False)
        self.quote_id = quote[0] if len(quote) == 1 else None
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # hidden size 1: the engine reads the device from it
        # Each ordinary token by its text (the lowest id where texts repeat): the prefixes of a reply.
        special = set(self.tokenizer.all_special_ids) | set(self.tokenizer.added_tokens_decoder)
        texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])
        self.pieces: dict[str, int] = {}
        for i, piece in enumerate(texts):
            if i not in special and piece and "\ufffd" not in piece:
                self.pieces.setdefault(piece, i)
        self.longest_piece = max(map(len, self.pieces))
        # The script's tokens take ranks 0..longest_piece (its own token, then each shorter start of the
        # rest); the fallback's ranks follow, every rank LOGIT_GAP below the one before.
        vocab, script_ranks = int(self.config.vocab_size), self.longest_piece + 1
        base = torch.empty(vocab, dtype=torch.float32)
        base[torch.tensor(fallback_ranks(self.tokenizer, vocab, self.eos_id))] = \
            SCRIPT_LOGIT - LOGIT_GAP * torch.arange(script_ranks, script_ranks + vocab, dtype=torch.float32)
        self.register_buffer("fallback", base, persistent=False)
        self.quote_logit = float(base[self.eos_id]) - LOGIT_GAP / 2  # inside a JSON string: '"' just after EOS
        self.replies: dict[str, str] = {}  # prompt text -> reply text, one call of ``reply`` each
        self._scripts: dict[tuple[int, ...], tuple[str, list[int]]] = {}

    @property
    def device(self) -> torch.device:
        """Where the model lives (a seeded request's sampler is made there), as a transformers model has it."""
        return self.anchor.device

    # -- the script ---------------------------------------------------------------------------

    def split(self, seq: list[int]) -> tuple[tuple[int, ...], list[int]] | None:
        """(prompt, generated) of a row's sequence, cut after its last generation header; None without one."""
        h = self.header
        start = next((j for j in range(len(seq) - 1, -1, -1) if seq[j] == h[0]), None)
        if start is None or seq[start: start + len(h)] != h:
            return None  # e.g. a prefill of all but the prompt's last token: no complete header yet
        cut = start + len(h)
        return tuple(seq[:cut]), seq[cut:]

    def script(self, prompt: tuple[int, ...]) -> tuple[str, list[int]]:
        """The reply text and its tokens (EOS last) for ``prompt`` (the reply function runs once per prompt)."""
        if prompt not in self._scripts:
            text = self.tokenizer.decode(list(prompt))
            if text not in self.replies:
                self.replies[text] = self.reply(text)
            reply = self.replies[text]
            ids = self.encode(reply)
            self._scripts[prompt] = (reply, [*ids, self.eos_id])
        return self._scripts[prompt]

    def next_tokens(self, seq: list[int]) -> tuple[list[int], bool]:
        """The script's next tokens after ``seq`` (a row's tokens so far), best first, and whether the
        reply so far is inside a JSON string.

        Best first: the script's own next token, then every token that writes a shorter start of the
        rest of the reply, longest first (a grammar may allow only part of the script's token).
        Empty when off the script.
        """
        parts = self.split(seq)
        if parts is None:
            return [], False
        prompt, generated = parts
        text, ids = self.script(prompt)
        said = self.tokenizer.decode(generated)
        inside = in_json_string(said)
        g = len(generated)
        on_tokens = g < len(ids) and ids[:g] == generated
        # By text: the grammar (or a draft) may have split the same characters into other tokens.
        on_text = self.eos_id not in generated and "\ufffd" not in said and text.startswith(said)
        if not on_text:
            return ([ids[g]] if on_tokens else []), inside
        rest = text[len(said):]
        first = ids[g] if on_tokens else (self.encode(rest) or [self.eos_id])[0]
        pieces = (self.pieces.get(rest[:k]) for k in range(min(self.longest_piece, len(rest)), 0, -1))
        return [first, *(p for p in pieces if p is not None and p != first)], inside

    def encode(self, text: str) -> list[int]:
        """``text``'s tokens, special-token names in it written as plain text."""
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    # -- the forward --------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: ReservedCache | None = None,
                past_key_values: ReservedCache | None = None, use_cache: bool = True, logits_to_keep: int = 0,
                **kwargs: Any) -> ScriptedOutput:
        """Logits ``[B, kept, V]`` for the last ``logits_to_keep`` positions (0: all of them)."""
        b, t = input_ids.shape
        cache = cache if cache is not None else past_key_values
        if cache is None:
            cache = ReservedCache(int(self.config.num_hidden_layers), t)
        # Token ids as fp32 keys: exact below 2**24, whatever dtype the engine chose.
        keys = input_ids.to(torch.float32)[:, None, :, None]
        stored, _ = cache.update(keys, keys, 0)
        seq = stored[:, 0, :, 0].long().cpu()
        total = seq.shape[1]
        valid = torch.ones_like(seq, dtype=torch.bool) if attention_mask is None else attention_mask.cpu().bool()
        if valid.shape != seq.shape:
            raise ValueError(f"attention_mask covers {valid.shape[1]} slots, the cache holds {total}")
        kept = t if logits_to_keep in (0, None) or logits_to_keep > t else int(logits_to_keep)
        logits = self.fallback.expand(b, kept, -1).clone()
        for i in range(b):
            real = valid[i].nonzero()[:, 0]
            row = seq[i, real].tolist()
            counts = valid[i].cumsum(0).tolist()  # tokens of the row up to and including each slot
            for j in range(kept):
                slot = total - kept + j
                if not valid[i, slot]:
                    continue  # padding or a finished row: any logits do
                best, in_string = self.next_tokens(row[: counts[slot]])
                if in_string and self.quote_id is not None:  # the fallback, should the script's tokens be masked
                    logits[i, j, self.quote_id] = self.quote_logit
                for rank, tok in enumerate(best):  # all above EOS: at most longest_piece + 1 of them
                    logits[i, j, tok] = SCRIPT_LOGIT - LOGIT_GAP * rank
        return ScriptedOutput(logits=logits, cache=cache)


def scripted_engine(reply: ReplyFn, config: EngineConfig | None = None, **engine_kwargs: Any) -> TransformersEngine:
    """The real hf engine over :class:`ScriptedLM` (``engine.model``) and the packaged SmolLM2 tokenizer.

    ``config`` defaults to ``EngineConfig(engine="hf", model="smollm2-135m", device="cpu")`` (its
    ``model`` must name a model with this tokenizer); ``engine_kwargs`` go to the engine
    (``batch_wait_s``, ``name``).
    """
    from memagent.models import resolve_model

    config = config or EngineConfig(engine="hf", model=MODEL, device="cpu")
    model_dir = resolve_model(config.model)

    class _Loader:  # stands in for AutoModelForCausalLM while the engine loads its model
        @staticmethod
        def from_pretrained(path: str, **kwargs: Any) -> ScriptedLM:
            return ScriptedLM(path, reply)

    with mock.patch.object(hf, "AutoModelForCausalLM", _Loader):
        return TransformersEngine(model_dir, config, **{"name": MODEL, **engine_kwargs})
