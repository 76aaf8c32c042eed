#!/usr/bin/env bash
# Multi-GPU Multi-Conv DAPO on one node: one trainer rank per GPU (DeepSpeed ZeRO, NCCL), each
# rank rolling out its share of the questions with its own vLLM engine on its own GPU
# (rollout_engine=vllm; weights synced after every step through safetensors + reload_weights).
#
#   NUM_GPUS=8 bash infra/deepspeed/launch_multi_gpu.sh --data s3://lake/train.parquet --out runs/dapo \
#       --steps 200 --batch-size 64 --group-size 8 --zero-stage 2 --config train.json
#
# Any `memagent train` flag may follow (see `memagent train --help`); --batch-size must be
# divisible by NUM_GPUS. vLLM's share of each GPU and sleep mode come from --config, e.g.
#   {"rollout_gpu_memory_utilization": 0.3, "rollout_sleep_mode": true}
# Env: NUM_GPUS (default: all GPUs), LAUNCHER=deepspeed|torchrun, ENGINE=vllm|hf.
# Several nodes: `deepspeed --hostfile hosts ...` with the same module arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."

NUM_GPUS=${NUM_GPUS:-$(nvidia-smi --list-gpus | wc -l)}
ENGINE=${ENGINE:-vllm}
ARGS=(-m memagent_cli train --engine "$ENGINE" "$@")
# The module parses its own flags: no --local_rank argument (ranks read LOCAL_RANK from the env).
case "${LAUNCHER:-deepspeed}" in
  deepspeed) exec deepspeed --no_local_rank --num_gpus "$NUM_GPUS" --module "${ARGS[@]:1}" ;;
  torchrun)  exec torchrun --standalone --nproc_per_node "$NUM_GPUS" "${ARGS[@]}" ;;
  *) echo "LAUNCHER must be deepspeed or torchrun" >&2; exit 2 ;;
esac
