#!/usr/bin/env bash
# Instructions per message of each side of a ucx-perf test, counted by callgrind: the server
# (side 0) runs under callgrind with the client native, then the other way round. For
# tag_bw/am_bw the server receives and the client sends; for the ping-pong tests both do both.
# Two figures per side: the marginal one, (I(2n) - I(n)) / n from runs of n and 2n iterations,
# which leaves out the one-off start-up (context, worker, wireup), and the program's total over
# (n + warm-up) of the n-run, the figure the earlier rows of docs/performance.md give. When the
# two disagree, the side under callgrind spent instructions waiting for the other (polling an
# empty queue): use a larger n.
#
# usage: tools/bench/callgrind-tag.sh [-b UCX_PERF] [-n ITERS] -- <ucx-perf args without -n>
#   e.g. UCX_TLS=shm,self tools/bench/callgrind-tag.sh -n 1000000 -- -t tag_bw -s 8
# Prints: "server <marginal> (<total/msgs>) client <marginal> (<total/msgs>) instructions per message".
set -eu
bin=target/release/ucx-perf
iters=1000000
while [[ $# -gt 0 ]]; do
  case $1 in
    -b) bin=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-b UCX_PERF] [-n ITERS] -- <args>" >&2; exit 2 ;;
  esac
done
args=("$@" -f)
warmup=10000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total() { # $1 = side under callgrind (server|client), $2 = iterations; prints its total
  local port=$(( 20000 + RANDOM % 20000 )) out=$tmp/cg.$1 n=$2
  if [[ $1 == server ]]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "${args[@]}" -n $n -p $port >/dev/null 2>&1 &
    local srv=$!
    sleep 3
    "$bin" 127.0.0.1 "${args[@]}" -n $n -p $port >/dev/null
    wait $srv
  else
    "$bin" "${args[@]}" -n $n -p $port >/dev/null &
    local srv=$!
    sleep 1
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" 127.0.0.1 "${args[@]}" -n $n -p $port >/dev/null 2>&1
    wait $srv
  fi
  awk '/^summary:/ {print $2}' "$out"
}
count() { # $1 = side; prints "marginal (total/msgs)"
  local a b
  a=$(total "$1" "$iters")
  b=$(total "$1" $((2 * iters)))
  awk -v a="$a" -v b="$b" -v n="$iters" -v w="$warmup" 'BEGIN {printf "%.1f (%.1f)", (b - a) / n, a / (n + w)}'
}
s=$(count server)
c=$(count client)
echo "server $s client $c instructions per message"
