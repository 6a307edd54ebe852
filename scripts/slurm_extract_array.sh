#!/usr/bin/env bash
# Slurm array job: extract GPT-OSS-20B activations in N shards (one GPU each), then merge.
#
#   sbatch --array=0-7 scripts/slurm_extract_array.sh runs/gptoss/trajectories.jsonl runs/gptoss/acts
#
# Task i runs `--shard i/N` (N = array size): the steps of a grid always land in one shard, so
# shards never overlap. A task that is preempted or killed (--requeue, SIGKILL, node failure)
# reruns the same command and resumes from its last finished part. When every task has
# succeeded, submit the merge, which checks that every step is covered exactly once:
#
#   sbatch --dependency=afterok:<array job id> --wrap \
#       "goalprobe merge runs/gptoss/acts/shard_*_of_8.h5 --out runs/gptoss/acts/activations.h5"
#
# The gres names the GPU type (here a100; use your cluster's name, e.g. h100): a requeued task
# then resumes on the same GPU model, which is part of the store's identity (with the weights'
# format, dtype, driver and CUDA; `goalprobe merge` refuses shards computed on others). A card
# of the same model but another size (A100-40 after A100-80) resumes: the batch is planned per
# run and recorded per part, outside the identity. On an offline node, pre-fetch the MXFP4
# kernel first (the --dry-run plan says whether it loads, and how to fetch it).
#
#SBATCH --job-name=goalprobe-extract
#SBATCH --gres=gpu:a100:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=08:00:00
#SBATCH --requeue
#SBATCH --output=logs/extract_%A_%a.out
set -euo pipefail

TRAJECTORIES=${1:?usage: sbatch --array=0-(N-1) $0 TRAJECTORIES OUT_DIR}
OUT_DIR=${2:?usage: sbatch --array=0-(N-1) $0 TRAJECTORIES OUT_DIR}
INDEX=${SLURM_ARRAY_TASK_ID:?run as an array job (sbatch --array=0-7 ...)}
COUNT=${SLURM_ARRAY_TASK_COUNT:-$((SLURM_ARRAY_TASK_MAX - SLURM_ARRAY_TASK_MIN + 1))}

mkdir -p "$OUT_DIR" logs
python scripts/extract_gptoss20b.py "$TRAJECTORIES" \
    --out "$OUT_DIR/shard_${INDEX}_of_${COUNT}.h5" \
    --shard "${INDEX}/${COUNT}" \
    --rows-per-part 256
