"""Two training processes under torchrun (gloo on CPU): the DeepSpeed launch path of multi-GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memagent.net import free_port
from memagent.rl.distributed import merge_rank_metrics
from test_rl_rollout import niah


def test_rank_metrics_merge_into_the_step_of_the_whole_run():
    a = {"step": 3, "trajectories": 2, "reward_mean": 1.0, "response_tokens": 10, "kl": 0.2, "step_s": 5.0,
         "grad_norm": 0.7, "example_ids": ["q1"], "data_cursor": [0, 1], "rollout_tokens_per_s": 4.0}
    b = {"step": 3, "trajectories": 6, "reward_mean": 0.0, "response_tokens": 30, "kl": 0.6, "step_s": 7.0,
         "grad_norm": 0.7, "example_ids": ["q2"], "data_cursor": [0, 1], "rollout_tokens_per_s": 6.0}
    m = merge_rank_metrics([a, b])
    assert (m["step"], m["trajectories"], m["world_size"], m["grad_norm"]) == (3, 8, 2, 0.7)
    assert m["reward_mean"] == pytest.approx(0.25)  # weighted by trajectories: 2 of 8 rewarded
    assert m["kl"] == pytest.approx(0.5)  # weighted by response tokens
    assert m["step_s"] == 7.0 and m["rollout_tokens_per_s"] == 10.0  # slowest rank; throughputs add
    assert m["example_ids"] == ["q1", "q2"] and m["data_cursor"] == [[0, 1], [0, 1]]
    assert merge_rank_metrics([a]) == a
    gen = merge_rank_metrics([{"trajectories_generated": 2, "reward_generated_mean": 1.0, "rollout_rounds": 1},
                              {"trajectories_generated": 6, "reward_generated_mean": 0.0, "rollout_rounds": 3}])
    assert gen["reward_generated_mean"] == pytest.approx(0.25) and gen["rollout_rounds"] == 3


@pytest.mark.slow
def test_two_process_training_run(tiny_llama_dir: Path, tmp_path: Path):
    """Two ranks train one run: one metrics record per step counting both ranks' rollouts, disjoint questions,
    a checkpoint; DeepSpeed's shared-memory all-reduce (inference only) is never built."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in niah(8)))
    (tmp_path / "cfg.json").write_text(json.dumps({"warmup_steps": 0, "micro_batch_tokens": 1024, "save_every": 2}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "memagent_cli", "train", "--data", str(data), "--out", str(out),
           "--model", str(tiny_llama_dir), "--preset", "tiny", "--chunk-tokens", "64", "--memory-tokens", "16",
           "--answer-tokens", "8", "--steps", "2", "--batch-size", "4", "--group-size", "2", "--lr", "1e-3",
           "--config", str(tmp_path / "cfg.json")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1]  # one record per step, written once (rank 0)
    for s in steps:
        assert s["world_size"] == 2 and s["trajectories"] == 4 * 2  # both ranks' rollouts counted
        assert len(s["example_ids"]) == 4 and len(set(s["example_ids"])) == 4  # ranks read disjoint questions
    assert (out / "checkpoints" / "step_000002" / "hf" / "model.safetensors").is_file()
    assert run.stdout.count("done: metrics in") == 1  # rank 0 reports
    assert "shm_comm" not in run.stdout + run.stderr  # DeepSpeed prints "...shm_comm_op built" when it loads it

