#!/bin/sh
# The chart's Redis with replicas and sentinels (redis.sentinel.enabled): how a node and a
# sentinel start, and when each is ready. POSIX sh for the redis image's busybox.
#
#   redis-sentinel.sh node | node-ready | node-handover | sentinel | sentinel-ready
#
# Environment: SELF (this process's host:port as the others reach it), NODES and SENTINELS
# (host:port, comma-separated; the first node is the first master), MASTER_NAME, PASSWORD_FILE
# (Redis's password, also the sentinels'), DATA_DIR (a node's volume), CONF_DIR (a sentinel's
# writable directory), QUORUM, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS.
set -euf  # no globbing: replies are split into words, never into file names

if [ -n "${PASSWORD_FILE:-}" ]; then
  REDISCLI_AUTH=$(cat "$PASSWORD_FILE")
  export REDISCLI_AUTH
fi
LOCAL="127.0.0.1:${SELF##*:}"

cli() {  # cli HOST:PORT COMMAND...: one command, at most 3 s (a silent peer must not hang us)
  address=$1
  shift
  timeout 3 redis-cli --raw -h "${address%:*}" -p "${address##*:}" "$@" 2>/dev/null
}

role() {
  cli "$1" ROLE | head -n 1
}

master_by_sentinels() {  # the master's host:port, as the first sentinel that knows it says
  for sentinel in $(echo "$SENTINELS" | tr , ' '); do
    reply=$(cli "$sentinel" SENTINEL get-master-addr-by-name "$MASTER_NAME") || continue
    set -- $reply
    if [ $# -eq 2 ]; then
      echo "$1:$2"
      return 0
    fi
  done
  return 1
}

master_by_nodes() {  # a node that says it is the master
  for node in $(echo "$NODES" | tr , ' '); do
    if [ "$(role "$node")" = master ]; then
      echo "$node"
      return 0
    fi
  done
  return 1
}

# The master: the sentinels' word; without a sentinel (a new group, or all of them restarted)
# a node's own; without either, the first node. Only when every sentinel and node stopped at
# once does the first node lead again with what it holds.
current_master() {
  master_by_sentinels || master_by_nodes || echo "${NODES%%,*}"
}

node() {
  master=$(current_master)
  # An empty file so that CONFIG REWRITE (a sentinel's, after a failover) has one to write.
  : > "$DATA_DIR/redis.conf"
  set -- "$DATA_DIR/redis.conf" --port "${SELF##*:}" --dir "$DATA_DIR" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction --protected-mode no \
    --replica-announce-ip "${SELF%:*}"
  if [ -n "${REDISCLI_AUTH:-}" ]; then
    set -- "$@" --requirepass "$REDISCLI_AUTH" --masterauth "$REDISCLI_AUTH"
  fi
  if [ "$master" != "$SELF" ]; then
    set -- "$@" --replicaof "${master%:*}" "${master##*:}"
  fi
  echo "redis node $SELF: the master is $master"
  exec redis-server "$@"
}

node_ready() {  # a master that answers, or a replica whose link to its master is up
  info=$(cli "$LOCAL" INFO replication) || return 1
  case "$info" in
    *role:master*|*master_link_status:up*) return 0 ;;
  esac
  return 1
}

# A master about to stop has a sentinel promote a replica first (20 s at most), and follows
# it at once. Writes wait meanwhile (this node would drop them as it follows), then get READONLY
# and their clients go to the new master.
node_handover() {
  [ "$(role "$LOCAL")" = master ] || return 0
  cli "$LOCAL" CLIENT PAUSE 25000 WRITE > /dev/null || true
  for sentinel in $(echo "$SENTINELS" | tr , ' '); do
    if [ "$(cli "$sentinel" SENTINEL failover "$MASTER_NAME")" = OK ]; then
      break
    fi
  done
  waited=0
  until master=$(master_by_sentinels) && [ "$master" != "$SELF" ]; do
    if [ "$waited" -ge 20 ]; then
      master=$SELF
      break
    fi
    sleep 1
    waited=$((waited + 1))
  done
  if [ "$master" != "$SELF" ]; then
    cli "$LOCAL" REPLICAOF "${master%:*}" "${master##*:}" > /dev/null || true
  fi
  cli "$LOCAL" CLIENT UNPAUSE > /dev/null || true
}

quoted() {  # a value for a configuration file: in double quotes, \ and " escaped
  printf '"%s"' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')"
}

sentinel() {
  master=$(current_master)
  # Hostnames are resolved as the configuration is read: wait (30 s at most) for the master.
  waited=0
  until cli "$master" PING > /dev/null || [ "$waited" -ge 15 ]; do
    sleep 2
    waited=$((waited + 1))
  done
  conf="$CONF_DIR/sentinel.conf"  # a sentinel rewrites its file as the group changes
  {
    printf 'port %s\n' "${SELF##*:}"
    printf 'dir %s\n' "$(quoted "$CONF_DIR")"
    printf 'protected-mode no\n'
    printf 'sentinel resolve-hostnames yes\n'
    printf 'sentinel announce-hostnames yes\n'
    printf 'sentinel announce-ip %s\n' "${SELF%:*}"
    printf 'sentinel announce-port %s\n' "${SELF##*:}"
    if [ -n "${REDISCLI_AUTH:-}" ]; then  # also what it gives the other sentinels
      printf 'requirepass %s\n' "$(quoted "$REDISCLI_AUTH")"
    fi
    printf 'sentinel monitor %s %s %s %s\n' "$MASTER_NAME" "${master%:*}" "${master##*:}" "$QUORUM"
    if [ -n "${REDISCLI_AUTH:-}" ]; then
      printf 'sentinel auth-pass %s %s\n' "$MASTER_NAME" "$(quoted "$REDISCLI_AUTH")"
    fi
    printf 'sentinel down-after-milliseconds %s %s\n' "$MASTER_NAME" "$DOWN_AFTER_MS"
    printf 'sentinel failover-timeout %s %s\n' "$MASTER_NAME" "$FAILOVER_TIMEOUT_MS"
    printf 'sentinel parallel-syncs %s 1\n' "$MASTER_NAME"
  } > "$conf"
  echo "sentinel $SELF: watching $MASTER_NAME at $master"
  exec redis-server "$conf" --sentinel
}

sentinel_ready() {  # it knows the master and enough sentinels to fail it over
  case "$(cli "$LOCAL" SENTINEL ckquorum "$MASTER_NAME")" in
    OK*) return 0 ;;
  esac
  return 1
}

case "${1:-}" in
  node) node ;;
  node-ready) node_ready ;;
  node-handover) node_handover ;;
  sentinel) sentinel ;;
  sentinel-ready) sentinel_ready ;;
  *) echo "usage: $0 node | node-ready | node-handover | sentinel | sentinel-ready" >&2; exit 2 ;;
esac
