#!/usr/bin/env bash
# Try a SLURM template on one machine without SLURM: stand-in `srun` and `scontrol`
# commands start the tasks locally (CPU ranks, gloo), so a typo in a template or a lab's
# flags shows up before the job waits in the queue.
#
#   bash labs/slurm/dry_run.sh srun 2 ddp --model tiny --steps 2      # 2 srun tasks = 2 ranks
#   bash labs/slurm/dry_run.sh torchrun 2 ddp --model tiny --steps 2  # 1 node, torchrun x 2
#
# The stand-in srun runs its command once per task in the background, with SLURM_PROCID,
# SLURM_LOCALID, SLURM_NTASKS and the step variables set as srun sets them on one node.
set -euo pipefail

TEMPLATE="${1:?usage: dry_run.sh srun|torchrun RANKS LAB [LAB FLAGS...]}"
RANKS="${2:?usage: dry_run.sh srun|torchrun RANKS LAB [LAB FLAGS...]}"
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT

cat > "$fake/scontrol" <<'SH'
#!/usr/bin/env bash
# `scontrol show hostnames LIST`: this machine stands for every node.
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
SH

cat > "$fake/srun" <<'SH'
#!/usr/bin/env bash
ntasks="" per_node=""
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case "$1" in
        --ntasks=*) ntasks="${1#*=}" ;;
        -n) ntasks="$2"; shift ;;
        --ntasks-per-node=*) per_node="${1#*=}" ;;
    esac
    shift
done
if [ -z "$ntasks" ]; then
    if [ -n "$per_node" ]; then ntasks=$(( per_node * ${SLURM_NNODES:-1} )); else ntasks="$SLURM_NTASKS"; fi
fi
step_file="${TMPDIR:-/tmp}/fake-srun-step-$SLURM_JOB_ID"
step=$(( $(cat "$step_file" 2>/dev/null || echo -1) + 1 ))
echo "$step" > "$step_file"
# rank_env.sh derives the port from the job id, which on a cluster's own nodes is free; on
# a shared machine it may not be, so each step takes one the kernel hands out.
export MASTER_PORT="${MASTER_PORT:-$("$FREE_PORT_PYTHON" -c "$FREE_PORT")}"
pids=()
for (( i = 0; i < ntasks; i++ )); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=$ntasks SLURM_STEP_ID=$step \
    SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" SLURM_STEP_NUM_NODES=1 \
    SLURM_STEP_TASKS_PER_NODE=$ntasks "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
SH
chmod +x "$fake/scontrol" "$fake/srun"

# A port the kernel hands out (bound, read, released) for the rendezvous, unless one is set:
# the templates' port from the job id can be taken on a machine that runs other things.
FREE_PORT='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
FREE_PORT_PYTHON="${PYTHON:-python3}"
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && FREE_PORT_PYTHON=.venv/bin/python
export FREE_PORT FREE_PORT_PYTHON
[ "$TEMPLATE" = torchrun ] && export RDZV_PORT="${RDZV_PORT:-$("$FREE_PORT_PYTHON" -c "$FREE_PORT")}"
export PATH="$fake:$PATH" TMPDIR="$fake"
export SLURM_JOB_ID="$$" SLURM_JOB_NODELIST="fake-node" SLURM_NNODES=1
export SLURM_SUBMIT_DIR="${SLURM_SUBMIT_DIR:-$PWD}" SLURM_CPUS_PER_TASK=1
case "$TEMPLATE" in
    srun) export SLURM_NTASKS="$RANKS" SLURM_NTASKS_PER_NODE="$RANKS" SLURM_TASKS_PER_NODE="$RANKS" ;;
    torchrun) export SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 SLURM_TASKS_PER_NODE=1 GPUS_PER_NODE="$RANKS" ;;
    *) echo "template must be srun or torchrun, not $TEMPLATE" >&2; exit 2 ;;
esac
exec bash "$here/$TEMPLATE.sbatch" "$@"
