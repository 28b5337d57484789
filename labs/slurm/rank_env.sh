#!/usr/bin/env bash
# One srun task = one rank: turn SLURM's task variables into the ones torch.distributed
# reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then
# run the command. lessonlib.run sees RANK and WORLD_SIZE and joins the group from them,
# exactly as under torchrun.
#
#   srun --ntasks 8 bash labs/slurm/rank_env.sh python labs/ddp.py --json results/ddp.json
#
# MASTER_ADDR defaults to the first node of the step; MASTER_PORT to a port derived from
# the job and step ids, so two steps of one job (a sweep) never reuse a port.
set -euo pipefail

: "${SLURM_PROCID:?rank_env.sh runs inside srun (SLURM_PROCID is not set)}"
: "${SLURM_NTASKS:?rank_env.sh runs inside srun (SLURM_NTASKS is not set)}"

export RANK="$SLURM_PROCID"
export WORLD_SIZE="$SLURM_NTASKS"
export LOCAL_RANK="${SLURM_LOCALID:-0}"
# Ranks per node, as torchrun sets it; lessonlib uses NCCL only when every rank of a node has
# its own GPU, so take the busiest node of this step: SLURM_STEP_TASKS_PER_NODE reads like
# "8(x2)" or "4,3" (tasks on each node, in node order).
most=0
IFS=, read -ra per_node <<< "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}}"
for entry in "${per_node[@]}"; do
    count="${entry%%(*}"
    (( count > most )) && most="$count"
done
nodes="${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}"
(( most > 0 )) || most=$(( (SLURM_NTASKS + nodes - 1) / nodes ))
export LOCAL_WORLD_SIZE="$most"
if [ -z "${MASTER_ADDR:-}" ]; then
    MASTER_ADDR="$(scontrol show hostnames "${SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}" | head -n 1)"
fi
export MASTER_ADDR
export MASTER_PORT="${MASTER_PORT:-$(( 20000 + (${SLURM_JOB_ID:-0} * 16 + ${SLURM_STEP_ID:-0}) % 20000 ))}"

exec "$@"
