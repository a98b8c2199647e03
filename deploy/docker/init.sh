# The `init` service of deploy/compose/docker-compose.yml (busybox sh, as uid 65532).
#
# 1. Certificates, once: a cluster CA and one certificate per node in /certs (a volume), by
#    `levee certs init` and `levee certs issue`; existing files are kept, so running this
#    again changes no certificate.
# 2. The admin token: $LEVEE_ADMIN_TOKEN if set, else one made once from /dev/urandom and
#    kept in /certs/admin-token (`docker-compose run --rm init token` prints it).
# 3. One configuration per node in /config (a volume): its [node] and [cluster] sections
#    (addresses from $LEVEE_SUBNET, see below) followed by the rules file mounted at
#    /rules/rules.toml. Each file is checked with `levee config check` and renamed into place
#    only if it changed, so running this again after editing the rules makes every node
#    reload them (nodes check their file every second).
#
# Addresses (the node needs IP addresses in [[cluster.node]] addr; names are not resolved):
# region r (eu = 1, us = 2, ap = 3), node k: $LEVEE_SUBNET.r.1k on the region's network and
# $LEVEE_SUBNET.0.rk on the network between regions (`wan`). A node reaches its region-mate on
# the region network and every other node on `wan`, so disconnecting a region's nodes from
# `wan` cuts the region off while its two nodes still see each other.
set -eu

P="${LEVEE_SUBNET:?LEVEE_SUBNET (e.g. 10.213) is required}"
RULES="${LEVEE_RULES:-/rules/rules.toml}"
NODES="eu-1 eu-2 us-1 us-2 ap-1 ap-2"
umask 077

region_index() {
  case "$1" in
    eu) echo 1 ;;
    us) echo 2 ;;
    ap) echo 3 ;;
    *) echo "init: unknown region $1" >&2; exit 1 ;;
  esac
}

if [ "${1:-}" = "token" ]; then
  if [ -n "${LEVEE_ADMIN_TOKEN:-}" ]; then echo "$LEVEE_ADMIN_TOKEN"; else cat /certs/admin-token; echo; fi
  exit 0
fi

[ -f /certs/ca.pem ] || /levee certs init --out /certs
for id in $NODES; do
  [ -f "/certs/$id.pem" ] || /levee certs issue --ca /certs --node "$id" --out /certs
done

if [ -n "${LEVEE_ADMIN_TOKEN:-}" ]; then
  token="$LEVEE_ADMIN_TOKEN"
else
  if [ ! -f /certs/admin-token ]; then
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > /certs/.admin-token
    mv /certs/.admin-token /certs/admin-token
  fi
  token="$(cat /certs/admin-token)"
fi

[ -f "$RULES" ] || { echo "init: no rules file at $RULES" >&2; exit 1; }

for id in $NODES; do
  region="${id%-*}"
  tmp="/config/.$id.toml"
  {
    echo "# Written by deploy/docker/init.sh from $RULES; edit the rules there and run init again."
    echo "[node]"
    echo "id = \"$id\""
    echo "region = \"$region\""
    echo "http = \"0.0.0.0:8750\""
    echo "gossip = \"0.0.0.0:8751\""
    echo "data_dir = \"/var/lib/levee\""
    echo
    echo "[api]"
    echo "admin_token = \"$token\""
    echo
    echo "[cluster]"
    echo "mode = \"${LEVEE_MODE:-strict}\""
    echo "suspect_after = \"${LEVEE_SUSPECT_AFTER:-1s}\""
    echo "regions = { eu = 1, us = 1, ap = 1 }"
    echo "tls = { ca = \"/certs/ca.pem\", cert = \"/certs/$id.pem\", key = \"/certs/$id.key\" }"
    for peer in $NODES; do
      pr="${peer%-*}"
      pk="${peer#*-}"
      pri="$(region_index "$pr")"
      if [ "$pr" = "$region" ]; then addr="$P.$pri.1$pk"; else addr="$P.0.$pri$pk"; fi
      echo
      echo "[[cluster.node]]"
      echo "id = \"$peer\""
      echo "region = \"$pr\""
      echo "addr = \"$addr:8751\""
    done
    echo
    cat "$RULES"
  } > "$tmp"

  if ! /levee config check "$tmp" > /dev/null; then
    rm -f /config/.*.toml
    echo "init: the configuration of $id is invalid (see above); nothing changed" >&2
    exit 1
  fi
done

# Every file is valid: only now replace what changed.
for id in $NODES; do
  tmp="/config/.$id.toml"
  if cmp -s "$tmp" "/config/$id.toml"; then
    rm -f "$tmp"
  else
    mv "$tmp" "/config/$id.toml"
    echo "init: wrote /config/$id.toml"
  fi
done
echo "init: certificates and configurations of $NODES are ready"
