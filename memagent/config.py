"""Typed configuration of the memory agent: token budgets, answer style, decoding.

One object per concern. ``AgentConfig`` holds what the paper calls the budgets (query,
chunk, memory, final answer) plus how the final answer is asked for and decoded. Values are
validated on construction; whether a config fits a given model's context window is checked by
:meth:`AgentConfig.check_fits`, which the agent calls once it knows the engine.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.extraction.groups import smallest_group_tokens
from memagent.extraction.schema import ExtractionSchema
from memagent.prompts import PromptTemplates
from memagent.replies import AnswerStyle

PresetName = Literal["paper", "small", "tiny"]

# Named budget sets; fields a preset does not name keep the paper's defaults below.
PRESET_VALUES: dict[str, dict[str, Any]] = {
    # The paper's budgets (chunk 5000, memory 1024, answer 1024): for 8K-window models of 7B+ on GPUs.
    "paper": {},
    # CPU-sized: a 2-core machine reads ~10K tokens a minute with the packaged 135M model.
    "small": {"chunk_tokens": 1024, "memory_tokens": 160, "answer_tokens": 48, "query_tokens": 160},
    # Tests and smoke runs: many short steps.
    "tiny": {"chunk_tokens": 256, "memory_tokens": 48, "answer_tokens": 24, "query_tokens": 96},
}
# The budgets an extraction schema sets when the caller leaves them at their defaults (_schema_budgets).
SCHEMA_BUDGETS = ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens")
# The jobs (command line, batch, evaluation, flows) read on a CPU by default; AgentConfig's own
# defaults are the paper's budgets.
JOB_PRESET: PresetName = "small"


class AgentConfig(BaseModel):
    """Budgets and decoding of one memory-agent read. Defaults are the paper's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: PresetName | None = Field(
        None, description="Start from a named budget set (paper, small, tiny); fields given explicitly override it."
    )
    chunk_tokens: int = Field(5000, gt=0, description="Document tokens per memory-update call (paper: 5000).")
    memory_tokens: int = Field(
        1024, gt=0, description="Max new tokens of each memory update; the reply *is* the new memory (paper: 1024)."
    )
    memory_heads: int = Field(
        1, ge=1, le=64,
        description="K > 1: the memory is K labelled heads of memory_tokens/K tokens each; a step sees them all and "
        "rewrites the least recently updated one (the others are carried verbatim). 1: the paper's single memory.",
    )
    answer_tokens: int = Field(1024, gt=0, description="Max new tokens of the final answer call (paper: 1024).")
    query_tokens: int = Field(
        1024, gt=0, description="Budget for the question in every prompt (paper: 1024); longer questions are an input error."
    )
    max_chunks: int | None = Field(
        None,
        gt=0,
        description="Cap on chunks per document; longer documents keep their head and tail halves "
        "(centre truncation, paper training: 8). None reads everything (paper evaluation).",
    )
    answer_style: AnswerStyle = Field(
        "phrase",
        description="'phrase': 'the answer is …' (paper evaluation); 'boxed': \\boxed{…} (training reward); "
        "'json': a JSON value (corpus extraction).",
    )
    strict_extraction: bool = Field(
        False,
        description="True: no answer marker in the reply gives prediction None (the paper's scoring). "
        "False: fall back to the cleaned reply.",
    )
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy decoding (paper evaluation used 0.7).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; only used when temperature > 0.")
    instruction: str | None = Field(
        None, description="Extra task instruction placed before the question in every prompt (corpus extraction)."
    )
    prompts: PromptTemplates = Field(
        default_factory=PromptTemplates,
        description="Prompt templates (memory_update, final_answer, full_context); default: the built-in ones. "
        "Load others from a TOML file with memagent.prompts.load_prompts.",
    )

    extraction: ExtractionSchema | None = Field(
        None,
        description="Corpus extraction: a JSON Schema (memagent.extraction) whose field list is the question and "
        "to which the final answer (one JSON object, answer_style 'json') is constrained. CLI: --schema FILE.",
    )
    require_grounding: bool = Field(
        False,
        description="Record types only: drop every record value not found in the document (strings, dates, numbers, "
        "list items; not enum labels or booleans) and every record whose key values are not all found, and count "
        "both (grounding_dropped_values/records columns, the job summary). Off: kept, with a null span.",
    )
    ground_elsewhere: bool = Field(
        False,
        description="Record types only: a record value not found in the text its call read (nor through the memory) "
        "is searched for in the whole document and, when found, given that span labelled 'elsewhere' (it proves "
        "nothing there). Off: such a value has a null span; the search costs a scan of the whole document per "
        "value. Not with require_grounding, which drops these values.",
    )

    @model_validator(mode="before")
    @classmethod
    def _json_answers_for_extraction(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("extraction") is not None and data.get("answer_style") is None:
            data = {**data, "answer_style": "json"}  # the one style an extraction answers in
        return data

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in PRESET_VALUES:
                raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_VALUES)}")
            given = data
            data = {**PRESET_VALUES[name], **data}
            if data.get("extraction") is not None:
                data = _schema_budgets(data, given)
        elif isinstance(data, dict) and data.get("extraction") is not None:
            data = _schema_budgets(data, data)
        return data

    @model_validator(mode="after")
    def _budgets_are_sane(self) -> AgentConfig:
        if self.memory_tokens > self.chunk_tokens * 4:
            raise ValueError(
                f"memory_tokens={self.memory_tokens} is more than 4x chunk_tokens={self.chunk_tokens}: "
                "the memory would dwarf what each step reads; lower memory_tokens or raise chunk_tokens"
            )
        if self.memory_heads > 1 and self.memory_tokens // self.memory_heads < 8:
            raise ValueError(f"memory_heads={self.memory_heads} leaves {self.memory_tokens // self.memory_heads} "
                             f"tokens a head (memory_tokens={self.memory_tokens}); a head needs 8 or more")
        if self.extraction is not None:
            if self.answer_style != "json":
                raise ValueError(f"an extraction schema answers in JSON: answer_style must be 'json' (or unset), "
                                 f"got {self.answer_style!r}")
            # Per head: the head a step rewrites may be the only one holding a field's value, so one head
            # must hold them all (K = 1: the whole memory).
            per_head, need = self.memory_tokens // self.memory_heads, self.extraction.memory_tokens_needed()
            if self.memory_heads > 1 and per_head < need:
                raise ValueError(f"memory_heads={self.memory_heads} leaves {per_head} tokens a head, and each head must "
                                 f"hold the schema's fields ({need} tokens); raise memory_tokens to "
                                 f"{need * self.memory_heads} or more, or lower memory_heads")
            self.extraction.check_budgets(per_head, self.answer_tokens)
        if self.require_grounding and self.ground_elsewhere:
            raise ValueError("ground_elsewhere labels record values found only outside the text their call read, and "
                             "require_grounding drops those very values: set one of them")
        if self.require_grounding and (self.extraction is None or not self.extraction.record_types):
            raise ValueError("require_grounding applies to record types (arrays of objects in the extraction "
                             "schema): give a schema that has some, or leave it off")
        return self

    def max_prompt_tokens(self, template_tokens: int, query_tokens: int | None = None) -> int:
        """Worst-case prompt length of a memory-update call, given the template's own tokens (and the question's,
        when it is known: an extraction's field list counted with the model's tokenizer)."""
        query = self.query_tokens if query_tokens is None else min(query_tokens, self.query_tokens)
        return template_tokens + query + self.memory_tokens + self.chunk_tokens

    def check_fits(self, context_window: int, template_tokens: int, query_tokens: int | None = None) -> None:
        """Reject budgets whose worst-case call (prompt + reply) exceeds the model's window; ``query_tokens``:
        the one question every call asks, counted (an extraction's), else ``self.query_tokens`` is assumed.

        Raises ``ValueError`` naming the numbers and what to change.
        """
        query = self.query_tokens if query_tokens is None else min(query_tokens, self.query_tokens)
        # Chunks are cut on the full document's tokens and re-tokenised inside the prompt;
        # boundaries can shift a few tokens, so keep a small slack.
        slack = 16
        need = self.max_prompt_tokens(template_tokens, query) + max(self.memory_tokens, self.answer_tokens) + slack
        if need > context_window:
            # The advice is a value that passes every check: chunk_tokens > 0 and memory_tokens at
            # most 4x chunk_tokens (_budgets_are_sane); when none fits, say so instead.
            fits = context_window - (need - self.chunk_tokens)  # the largest chunk that fits
            least = max(1, -(-self.memory_tokens // 4))
            if fits >= least:
                advice = (f"lower chunk_tokens to {fits} or less (and at least {least}, a quarter of memory_tokens)"
                          if least > 1 else f"lower chunk_tokens to {fits} or less")
                advice += "; or lower memory_tokens/query_tokens/answer_tokens"
            else:
                advice = (f"no chunk_tokens can make it fit: the call needs {need - self.chunk_tokens} tokens "
                          f"besides the chunk, leaving {max(fits, 0)} for it, and chunk_tokens must be at least "
                          f"{least} (a quarter of memory_tokens); lower memory_tokens/query_tokens/answer_tokens "
                          "or use a model with a larger context window")
                if self.extraction is not None:
                    advice += (". The extraction schema sets the least memory_tokens and answer_tokens and its "
                               "instructions are in the template: if those leave no room, the schema cannot fit "
                               "this model's window (extract fewer fields or shorten their descriptions)")
            raise ValueError(
                f"budgets do not fit the model's context window of {context_window} tokens: "
                f"template {template_tokens} + query {query} + memory {self.memory_tokens} + "
                f"chunk {self.chunk_tokens} + reply {max(self.memory_tokens, self.answer_tokens)} (+{slack} slack) "
                f"= {need}; {advice}"
            )

    def with_overrides(self, **overrides: object) -> AgentConfig:
        """A copy with the non-None overrides applied (and validated)."""
        data = self.model_dump()
        if overrides.get("extraction") is not None and overrides.get("answer_style") is None:
            data["answer_style"] = None  # filled in: an extraction answers in JSON
        if overrides.get("extraction") is not None:  # budgets still at their defaults follow the new schema
            defaults = {**{k: AgentConfig.model_fields[k].default for k in SCHEMA_BUDGETS},
                        **PRESET_VALUES.get(self.preset or "", {})}
            data = {k: v for k, v in data.items() if not (k in SCHEMA_BUDGETS and v == defaults[k])}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return AgentConfig(**data)


def _schema_budgets(data: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the budgets the caller did not give (``given`` lacks them) raised to what the extraction
    schema needs: the memory to hold its fields, the answer to hold its whole reply with room for every value
    (:func:`memagent.extraction.answer_bounds.answer_room_tokens`; a wider reply is split into field groups of the
    memory's budget instead, which costs no window: a call's reply is bounded by the larger of the two), the chunk to a quarter of the memory, the query to the question
    every memory update asks (:meth:`ExtractionSchema.memory_question`)."""
    try:
        schema = data["extraction"] if isinstance(data["extraction"], ExtractionSchema) \
            else ExtractionSchema(data["extraction"])
    except ValueError:
        return data  # the field's own validation says what is wrong
    out = dict(data)
    defaults = {k: AgentConfig.model_fields[k].default for k in SCHEMA_BUDGETS}
    if "memory_tokens" not in given:
        out["memory_tokens"] = max(out.get("memory_tokens", defaults["memory_tokens"]), schema.memory_tokens_needed())
    if "chunk_tokens" not in given:
        out["chunk_tokens"] = max(out.get("chunk_tokens", defaults["chunk_tokens"]), -(-out.get(
            "memory_tokens", defaults["memory_tokens"]) // 4))
    if "answer_tokens" not in given:
        memory = out.get("memory_tokens", defaults["memory_tokens"])
        room = schema.answer_room_tokens()  # 0 past ANSWER_ROOM_CAP: the reply is split into groups instead
        out["answer_tokens"] = max(out.get("answer_tokens", defaults["answer_tokens"]), room or memory,
                                   smallest_group_tokens(schema.fields))
    if "query_tokens" not in given:  # a token per byte of UTF-8 at most: field names (s1_16_3) cut small
        question = schema.memory_question(out.get("answer_tokens", defaults["answer_tokens"]))
        out["query_tokens"] = max(out.get("query_tokens", defaults["query_tokens"]), len(question.encode()))
    return out


PRESETS: dict[str, AgentConfig] = {name: AgentConfig(preset=name) for name in PRESET_VALUES}


def preset(name: str) -> AgentConfig:
    """The named preset; unknown names list the ones that exist."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
