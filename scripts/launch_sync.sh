#!/usr/bin/env bash
# Synchronous data-parallel training on N identical hosts, restarted from the last checkpoint
# whenever a host is lost (spot instances). Run the same command on every host.
#
#   MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=4 NODE_RANK=k NPROC_PER_NODE=8 \
#     scripts/launch_sync.sh RUN_DIR [tscale train options: CONFIG, --set ..., --tokens ...]
#
# The first launch starts the run; every later attempt adds --resume (the run folder on the
# host of rank 0 holds the checkpoints: give it shared storage, or keep NODE_RANK=0 on a host
# that survives). torchrun's c10d rendezvous waits for all NNODES hosts, so a replaced host
# only has to run this script again. MAX_RESTARTS (default 100) bounds the attempts;
# RESTART_DELAY_S (default 10) spaces them. Extra torchrun flags: TORCHRUN_ARGS.
set -u

: "${MASTER_ADDR:?set MASTER_ADDR (host of the rendezvous, reachable by every host)}"
: "${NNODES:?set NNODES (number of hosts)}"
: "${NODE_RANK:?set NODE_RANK (0..NNODES-1)}"
MASTER_PORT=${MASTER_PORT:-29500}
NPROC_PER_NODE=${NPROC_PER_NODE:-1}
MAX_RESTARTS=${MAX_RESTARTS:-100}
RESTART_DELAY_S=${RESTART_DELAY_S:-10}
RUN_DIR=${1:?usage: launch_sync.sh RUN_DIR [tscale train options]}
shift

log=$(mktemp -t launch_sync.XXXXXX)
trap 'rm -f "$log"' EXIT
attempt=0
while true; do
  resume=()
  if [ -f "$RUN_DIR/config.toml" ]; then
    resume=(--resume)  # later attempts continue from the newest checkpoint
  fi
  echo "launch_sync: attempt $attempt on node $NODE_RANK/$NNODES (${resume[*]:-fresh run})" >&2
  # shellcheck disable=SC2086
  torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "tscale-$(basename "$RUN_DIR")" \
    --max-restarts 0 ${TORCHRUN_ARGS:-} \
    --no-python tscale train -o "$RUN_DIR" "${resume[@]}" "$@" 2>&1 | tee "$log"
  code=${PIPESTATUS[0]}
  if [ "$code" -eq 0 ]; then
    echo "launch_sync: finished" >&2
    exit 0
  fi
  if grep -q "^tscale train: error: " "$log"; then  # torchrun exits 1 whatever the worker's code
    echo "launch_sync: tscale reported a user error; not restarting" >&2
    exit 2
  fi
  attempt=$((attempt + 1))
  if [ $attempt -gt "$MAX_RESTARTS" ]; then
    echo "launch_sync: giving up after $MAX_RESTARTS restarts (last exit $code)" >&2
    exit $code
  fi
  echo "launch_sync: exit $code (host lost?); restarting from the last checkpoint in ${RESTART_DELAY_S}s" >&2
  sleep "$RESTART_DELAY_S"
done
