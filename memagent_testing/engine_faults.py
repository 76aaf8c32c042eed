"""Engine faults through the batch job's ``build_engine`` seam (a seam a user could use too): an engine whose
``at_call``-th conversation kills its process (a crashed Ray actor) or is refused as a lost endpoint, once per
marker file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable


class CrashOnce:
    """The batch job's ``build_engine`` seam, for crash tests: the engine it builds kills its own
    process (the Ray actor) at its ``at_call``-th conversation, once per ``marker`` file."""

    fault = "crash"

    def __init__(self, at_call: int, marker: Path, build: Callable[[Any], Any] | None = None):
        self.at_call, self.marker, self.build = at_call, str(marker), build

    def __call__(self, engine_config: Any) -> Any:
        from memagent.engines import make_engine

        return FaultAtCall((self.build or make_engine)(engine_config), self.at_call, self.marker, self.fault)


class FaultAtCall:
    """Delegates to ``inner``; its ``at_call``-th conversation ``crash``es the process or is ``refuse``d as
    an endpoint that went away would be (``ConnectionRefusedError``), once per ``marker`` file."""

    def __init__(self, inner: Any, at_call: int, marker: str, fault: str):
        self.inner, self.at_call, self.marker, self.fault, self.calls = inner, at_call, marker, fault, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat(self, messages: Any, params: Any) -> Any:
        self.calls += 1
        if self.calls == self.at_call and not os.path.exists(self.marker):
            Path(self.marker).write_text(f"{self.fault} at call {self.calls} on pid {os.getpid()}\n")
            if self.fault == "crash":
                os._exit(1)
            raise ConnectionRefusedError("injected: the endpoint went away mid-chain")
        return await self.inner.chat(messages, params)
