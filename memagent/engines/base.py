"""The engine interface every backend implements (transformers, vLLM, OpenAI-compatible).

One request = one chat conversation. Callers are many concurrent coroutines (one per document);
the engine batches whatever is in flight. Engines return text plus the token accounting the
trace and the RL trainer need.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Messages = list[dict[str, str]]
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """Decoding of one request. ``temperature == 0`` means greedy."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    logprobs: bool = False  # return the behaviour log-prob of each generated token (RL)
    # Scheduling order for engines that schedule by priority (lower first; ties first come first
    # served). The agent gives the conversations still ahead of a document, negated: the longest
    # remaining read goes first; engines without a priority queue ignore it.
    priority: int = 0
    # Constrain the reply to this JSON Schema (the schema as JSON text, so params stay hashable):
    # engines decode under a grammar (hf: memagent.engines.constraint), vLLM's structured
    # outputs, or an OpenAI ``response_format``; the reply then always parses.
    json_schema: str | None = None
    # Sampling seed of this request (None: the engine's shared RNG): the same seeded request
    # samples the same reply (hf: a generator of its own per row; vLLM: its per-request seed).
    seed: int | None = None
    # The reply ends where one of these strings first occurs in its text (excluded from the text,
    # its tokens counted, finish_reason "stop"; memagent.engines.stop), or at one of these tokens
    # (kept, as EOS is). Lists are stored as tuples, so params stay hashable.
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # What the call is for ("memory", "records", "answer"; "" when unsaid): engines ignore it, the
    # metered engine (pipelines.engine_metrics) counts prefill computed vs reused per kind.
    call: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {list(self.stop)!r}")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One reply. Token ids are those of the policy's tokenizer (None if the backend cannot say)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason
    prompt_token_ids: list[int] | None = None
    # Prompt tokens whose KV the engine reused from an earlier call instead of computing it
    # (hf's prefix cache; vLLM / OpenAI servers when they report it; 0: none or cannot say).
    cached_prompt_tokens: int = 0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # one per token of token_ids, when asked for
    # Speculative decoding accounting (0 when the engine did not speculate or cannot say):
    # tokens drafted for this reply, how many of them the model accepted, and the decode
    # forward passes the reply took (completion_tokens / decode_steps = tokens per step).
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0


class EndpointError(RuntimeError):
    """A request a remote endpoint did not answer. ``status`` is the HTTP status (None: no response)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class EngineStats:
    """Counters an engine keeps, bounded however long it runs.

    ``batch_sizes[n]``: how many forwards held ``n`` requests (vLLM, which schedules its own
    forwards: how many requests were submitted with ``n`` in flight), one key per batch size.
    """

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those whose KV was reused (not prefilled again)
    completion_tokens: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)

    def count(self, completion: Completion) -> Completion:
        """Count one answered request; returns it."""
        self.requests += 1
        self.prompt_tokens += completion.prompt_tokens
        self.cached_prompt_tokens += completion.cached_prompt_tokens
        self.completion_tokens += completion.completion_tokens
        return completion


class Engine(abc.ABC):
    """An async chat-completion backend.

    Attributes:
        name: model name as reported in outputs.
        context_window: max tokens of prompt + reply.
        tokenizer: the policy's Hugging Face tokenizer (used for chunking and budgets).
    """

    name: str
    context_window: int
    tokenizer: Any
    stats: EngineStats
    # Whether :meth:`chat_ids` takes prompt token ids (hf, vLLM): a caller that has encoded the
    # prompt (the server, in a worker thread) hands them over instead of the messages.
    takes_prompt_ids: bool = False
    # Whether ``chat``/``chat_ids`` take ``on_tokens``, called with each decode step's kept tokens as they
    # are decoded (the server streams from it; an engine without it sends its reply when it ends).
    streams_tokens: bool = False
    # Whether the engine's grammar keeps special tokens and added vocabulary out of a constrained reply
    # (hf: memagent.engines.grammar masks them); an engine that cannot refuses a schema whose literals
    # hold one (:meth:`check_literals`), since the literal could be decoded as the token and end the reply.
    masks_special_tokens: bool = False

    @abc.abstractmethod
    async def chat(self, messages: Messages, params: SamplingParams, *,
                   on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """Generate the assistant reply to ``messages``. Safe to call from many coroutines at once.
        ``on_tokens``: called (from any thread) with each decode step's kept token ids as they are
        decoded, by engines with ``streams_tokens`` (callers pass it to no other engine)."""

    async def chat_ids(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """The reply to a prompt already encoded (:meth:`encode_chat`); engines with ``takes_prompt_ids``."""
        raise NotImplementedError(f"{type(self).__name__} takes messages, not prompt token ids")

    def check_literals(self, schema: Any, where: str = "json_schema") -> None:
        """ValueError naming the literal's path (``where`` + its path in ``schema``) when this engine's grammar
        could decode a literal of ``schema`` as a special token (engines without ``masks_special_tokens``)."""
        if self.masks_special_tokens:
            return
        from memagent.engines.special_literals import special_literal, special_texts
        from memagent.json_walk import dotted

        hit = special_literal(schema, special_texts(self.tokenizer))
        if hit is not None:
            path, text, token = hit
            raise ValueError(f"{dotted(path, where)}: the literal {text!r} holds the special token {token!r}, which "
                             f"this engine ({type(self).__name__}) cannot keep out of a constrained reply (it "
                             "would end the reply unparsed); leave the token out of the schema's literals")

    def check_window(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a request whose prompt plus reply cannot fit the context window."""
        if prompt_tokens + max_tokens > self.context_window:
            raise ValueError(f"prompt of {prompt_tokens} tokens + max_tokens {max_tokens} exceeds the "
                             f"model's context window of {self.context_window}")

    def encode_chat(self, messages: Messages) -> list[int]:
        """Prompt token ids: the chat template with the generation prompt (it holds any BOS)."""
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def count_chat_tokens(self, messages: Messages) -> int:
        """Tokens of ``messages`` rendered with the chat template and the generation prompt."""
        return len(self.encode_chat(messages))

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend (threads, subprocesses, GPU memory)."""
