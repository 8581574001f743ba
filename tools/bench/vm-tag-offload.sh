#!/bin/bash
# ucx-perf UCP tag tests over rc_verbs with tag matching off and on (emulated), alternated, three
# rounds; run inside the Soft-RoCE VM from the workspace root:
#   cargo build --release -p ucx-perf && tools/rdma-vm/run -- bash tools/bench/vm-tag-offload.sh
B=${UCX_PERF_BIN:-$(pwd)/target/release/ucx-perf}
one() { # $1 = tm y/n, rest = args
  local tm=$1; shift
  local port=$(( 20000 + RANDOM % 20000 ))
  UCX_TLS=rc_v UCX_RC_TM_ENABLE=$tm UCX_RC_RX_QUEUE_LEN=512 UCX_TM_THRESH=0 $B "$@" -p $port -f >/dev/null 2>&1 &
  local s=$!
  sleep 1
  UCX_TLS=rc_v UCX_RC_TM_ENABLE=$tm UCX_RC_RX_QUEUE_LEN=512 UCX_TM_THRESH=0 timeout 120 $B 127.0.0.1 "$@" -p $port -f 2>/dev/null | awk 'NF==8 && $1 ~ /^[0-9]+$/ {l=$0} END {print l}'
  wait $s
}
for args in "-t tag_lat -s 8 -n 5000" "-t tag_lat -s 65536 -n 300" "-t tag_bw -s 65536 -n 300" "-t tag_sync_lat -s 8 -n 2000"; do
  for r in 1 2 3; do
    for tm in n y; do echo "$args TM=$tm: $(one $tm $args)"; done
  done
done
