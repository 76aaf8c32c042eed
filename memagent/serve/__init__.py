"""``memagent serve``: any local engine, and the memory agent over it, behind an OpenAI-compatible HTTP API.

Clients that speak the OpenAI chat API (``--engine openai`` of another memagent process, a Ray
job on other nodes, the ``openai`` SDK, instructor, LangChain, LangExtract) then share one loaded
model. Each request is a coroutine awaiting ``engine.chat``, so concurrent requests reach the
engine together and it batches them. What is supported, and the client calls tested: docs/serve.md.

One job a module: :mod:`~memagent.serve.protocol` (request models, errors, reply bodies),
:mod:`~memagent.serve.guard` (key, body size, hostile input), :mod:`~memagent.serve.app` (routes),
:mod:`~memagent.serve.handling` (what every route does with a request), :mod:`~memagent.serve.chat`
(the engine as a chat model), :mod:`~memagent.serve.tools` (function calling) and
:mod:`~memagent.serve.tool_calls` (the Hermes tool-call parser), :mod:`~memagent.serve.streaming`
(SSE), :mod:`~memagent.serve.responses` (``/v1/responses``), :mod:`~memagent.serve.messages`
(Anthropic's ``/v1/messages``), :mod:`~memagent.serve.memagent_model` (the memory agent as a served
model). The Batch API's routes live in ``pipelines/openai_batch_api.py`` (each line answered by
:func:`memagent.serve.handling.respond`, as the chat route answers it).
"""

from memagent.serve.app import ServeConfig, create_app, serve
from memagent.serve.chat import JSON_OBJECT_SCHEMA
from memagent.serve.guard import AccessLogRedactor, Guard
from memagent.serve.protocol import APIError

__all__ = ["JSON_OBJECT_SCHEMA", "APIError", "AccessLogRedactor", "Guard", "ServeConfig", "create_app", "serve"]
