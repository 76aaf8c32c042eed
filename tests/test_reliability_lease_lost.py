"""A run whose lease is taken while it writes stops writing at its next output file.

As reported: a run that learned it had lost its lease (another host forced it) kept writing for
about two minutes, to the end of its job. Now the writer reads the lease before each output file
(``pipelines.batch_qa.LeasedFilenames``) and the job ends with one line naming the new holder.
"""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest

from memagent.engines import EngineConfig
from pipelines import lease
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, scripted_engine, write_rows

pytestmark = pytest.mark.slow

ROWS = 16


def test_a_run_whose_lease_is_taken_stops_writing_at_once(ray_local, tiny_llama_dir, tmp_path):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(ROWS))
    out = tmp_path / "out"
    # One row per output file, one at a time, ~1 s a row: the job would run ~16 s to its end.
    cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(out), agent=FAST_AGENT,
                        engine=EngineConfig(model=str(tiny_llama_dir)),
                        job=JobConfig(batch_size=1, max_in_flight=1, progress=False))
    build = functools.partial(scripted_engine, {"tokenizer": str(tiny_llama_dir), "sleep_s": 0.25})
    taken: dict = {}

    def take_over() -> None:  # another host's run forces the lease once the first file is written
        deadline = time.monotonic() + 300
        while not list(out.glob("*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
        now = time.time()
        other = lease.Holder("feed0000aaaa", "another-host", 1, None, now, now, None, None)
        lease._store(str(out), None).put(other.encode(), expect=None, force=True)
        taken["files"], taken["t"] = len(list(out.glob("*.parquet"))), time.monotonic()

    thread = threading.Thread(target=take_over, daemon=True)
    thread.start()
    with pytest.raises(lease.LeaseLost) as err:
        run_batch_qa(cfg, build_engine=build)
    stopped_after = time.monotonic() - taken["t"]
    thread.join()
    msg = str(err.value)
    assert msg.startswith(f"output {out}: while this run wrote, its lease was taken over by run feed0000aaaa "
                          "(host another-host") and msg.endswith(f"repair-output --output {out}") and "\n" not in msg
    written = read_output(out)
    # Files named before the takeover may still land (at most the rows then in flight), nothing after.
    assert len(written) <= taken["files"] + 2 < ROWS, (len(written), taken)
    assert stopped_after < 10, stopped_after
    assert json.loads((out / lease.LEASE_NAME).read_text())["run_id"] == "feed0000aaaa"  # never released by the loser
