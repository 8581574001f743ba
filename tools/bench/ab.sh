#!/usr/bin/env bash
# Two builds of ucx-perf against each other: runs A and B alternately (A, B, A, B, ...), each as
# two processes (server pinned to CPU 0, client to CPU 1, loopback bootstrap), and prints each
# round's two final message rates (or bandwidths) and, at the end, their means and the ratio
# B/A. For a before/after of a change where vs-ucx.sh compares against C.
#
# usage: tools/bench/ab.sh [-r ROUNDS] A_BIN B_BIN -- <ucx-perf args>
#   e.g. git stash; cargo build --release -p ucx-perf; cp target/release/ucx-perf /tmp/before
#        git stash pop; cargo build --release -p ucx-perf
#        UCX_TLS=shm,self tools/bench/ab.sh -r 8 /tmp/before target/release/ucx-perf -- -t tag_bw -s 8 -n 2000000
set -u
rounds=6
if [[ ${1:-} == -r ]]; then rounds=$2; shift 2; fi
[[ $# -ge 3 && $3 == -- ]] || { echo "usage: $0 [-r ROUNDS] A_BIN B_BIN -- <args>" >&2; exit 2; }
a=$1 b=$2
shift 3
one() { # $1 = binary; prints the last field of the client's final line
  local bin=$1 port=$(( 20000 + RANDOM % 20000 )) srv
  timeout 300 taskset -c 0 "$bin" "${@:2}" -p $port -f >/dev/null 2>&1 &
  srv=$!
  timeout 300 taskset -c 1 "$bin" "${@:2}" -p $port -f 127.0.0.1 2>/dev/null | tail -1 | awk '{print $NF}'
  wait $srv
}
for ((i = 0; i < rounds; i++)); do
  echo "$(one "$a" "$@") $(one "$b" "$@")"
done | awk '{print; if ($1 > 0 && $2 > 0) {sa += $1; sb += $2; n++}}
  END {if (n) printf "means: A %.6g B %.6g ratio B/A %.3f over %d rounds\n", sa / n, sb / n, sb / sa, n; else exit 1}'
