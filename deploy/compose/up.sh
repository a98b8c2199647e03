#!/usr/bin/env bash
# One command from a checkout to a running 3-region cluster: builds the images if they are
# missing or stale (deploy/docker/build.sh; pass --binary PATH to use a levee you built), then
# `docker-compose up -d` under the project name $LEVEE_PROJECT (default levee), and waits
# until every node is healthy. Stop it with:
#   docker-compose -f deploy/compose/docker-compose.yml -p levee down      # keep the volumes
#   docker-compose -f deploy/compose/docker-compose.yml -p levee down -v   # and forget them
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="${LEVEE_PROJECT:-levee}"
"$here/../docker/build.sh" "$@"
compose=(docker-compose -f "$here/docker-compose.yml" -p "$project")
"${compose[@]}" up -d
services=(eu-1 eu-2 us-1 us-2 ap-1 ap-2)
for _ in $(seq 1 60); do
  healthy=0
  for s in "${services[@]}"; do
    id="$("${compose[@]}" ps -q "$s")"
    [ "$(docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null)" = healthy ] && healthy=$((healthy + 1))
  done
  if [ "$healthy" -eq "${#services[@]}" ]; then
    echo "== all ${#services[@]} nodes are healthy; their HTTP ports on this host:"
    for s in "${services[@]}"; do echo "  $s  http://$("${compose[@]}" port "$s" 8750)"; done
    exit 0
  fi
  sleep 2
done
echo "up.sh: not every node became healthy within 2 minutes; see: ${compose[*]} logs" >&2
exit 1
