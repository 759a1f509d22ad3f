#!/usr/bin/env bash
# Hosts joined by a slow Ethernet, on one machine: N network namespaces ts1b-h0..h(N-1), each
# with one veth to a bridge that lives in its own namespace ts1b-sw (nothing in the root
# namespace changes), addresses 10.77.0.1..N/24, and every veth end capped by a token bucket:
#   tc qdisc add dev ... root tbf rate $RATE burst 128kb latency 50ms
# so each host sends and receives at most RATE (default 1gbit). Needs root.
#
#   scripts/bench/netns_1gbit.sh up N [RATE]   create (replacing any earlier ones)
#   scripts/bench/netns_1gbit.sh down          remove every ts1b-* namespace (their veths go with them)
#   scripts/bench/netns_1gbit.sh exec K CMD... run CMD in host K's namespace
set -euo pipefail
prefix=ts1b

down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
}

up() {
  local n=${1:?number of hosts} rate=${2:-1gbit}
  down
  trap 'down' ERR
  ip netns add $prefix-sw
  ip -n $prefix-sw link add br0 type bridge
  ip -n $prefix-sw link set br0 up
  ip -n $prefix-sw link set lo up
  for ((k = 0; k < n; k++)); do
    local ns=$prefix-h$k
    ip netns add $ns
    # both ends are created inside the switch namespace, then one end moves to the host
    ip -n $prefix-sw link add p$k type veth peer name eth0
    ip -n $prefix-sw link set eth0 netns $ns
    ip -n $prefix-sw link set p$k master br0
    ip -n $prefix-sw link set p$k up
    ip -n $ns addr add 10.77.0.$((k + 1))/24 dev eth0
    ip -n $ns link set eth0 up
    ip -n $ns link set lo up
    ip netns exec $ns tc qdisc add dev eth0 root tbf rate "$rate" burst 128kb latency 50ms
    ip netns exec $prefix-sw tc qdisc add dev p$k root tbf rate "$rate" burst 128kb latency 50ms
  done
  trap - ERR
}

cmd=${1:?up N [RATE] | down | exec K CMD...}
shift
case $cmd in
  up) up "$@" ;;
  down) down ;;
  exec) k=$1; shift; exec ip netns exec $prefix-h$k "$@" ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
