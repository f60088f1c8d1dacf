#!/bin/sh
# Forms the example Redis Cluster: 3 masters with one replica each, from the StatefulSet's
# pods. Waits until every pod resolves in DNS and answers PING. Idempotent: exits 0 at once
# when any node already reports cluster_state:ok, and refuses to create a second cluster
# over nodes that have already joined one (that needs a person: redis-cli --cluster check).
set -eu

nodes=${REDIS_NODES:-6}
service=${REDIS_SERVICE:-redis-cluster}
namespace=${NAMESPACE:?NAMESPACE must be set}
domain=${CLUSTER_DOMAIN:-cluster.local}
port=6379

name_of() { echo "$service-$1.$service.$namespace.svc.$domain"; }
# Prints one field of CLUSTER INFO (empty when the node does not answer).
cluster_info() { redis-cli -h "$1" -p "$port" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }

# 1. Every node resolvable and up. CLUSTER MEET, which --cluster create uses, takes IP
#    addresses, not names, so collect the addresses too.
addresses=""
i=0
while [ "$i" -lt "$nodes" ]; do
  name=$(name_of "$i")
  ip=$(getent hosts "$name" | awk '{ print $1; exit }')
  if [ -z "$ip" ] || [ "$(redis-cli -h "$ip" -p "$port" ping 2>/dev/null)" != "PONG" ]; then
    echo "waiting for $name"
    sleep 2
    continue
  fi
  addresses="$addresses $ip:$port"
  i=$((i + 1))
done

# 2. Already formed, or half formed?
joined=""
i=0
while [ "$i" -lt "$nodes" ]; do
  name=$(name_of "$i")
  if [ "$(cluster_info "$name" cluster_state)" = "ok" ]; then
    echo "cluster_state:ok on $name: the cluster is already formed, nothing to do"
    exit 0
  fi
  if [ "$(cluster_info "$name" cluster_known_nodes)" != "1" ]; then
    joined="$joined $name"
  fi
  i=$((i + 1))
done
if [ -n "$joined" ]; then
  # Possibly a cluster still converging after an earlier attempt: fail, and let the Job's
  # retry look again.
  echo "nodes already in a cluster that is not ok:$joined; not creating another" >&2
  exit 1
fi

# 3. Create. --cluster-yes accepts the proposed slot and replica layout.
echo "creating the cluster from:$addresses"
# shellcheck disable=SC2086 # one argument per address
redis-cli --cluster create $addresses --cluster-replicas 1 --cluster-yes

# 4. Wait for the cluster to settle.
tries=0
until [ "$(cluster_info "$(name_of 0)" cluster_state)" = "ok" ]; do
  tries=$((tries + 1))
  if [ "$tries" -gt 60 ]; then
    echo "cluster created but not ok after 120 s" >&2
    exit 1
  fi
  sleep 2
done
echo "cluster formed: cluster_state:ok"
