#!/usr/bin/env bash
# Makes the cluster's certificates with `levee certs` and prints the Secret levee-tls of every
# region's namespace (ca.pem and the certificates and keys of its two pods) as YAML:
#
#   deploy/kubernetes/make-secrets.sh ./levee-ca | kubectl apply -f -
#
# DIR keeps the CA (ca.pem, ca.key) and every node's files; keep it safe and out of the
# cluster: it issues certificates. Run again with the same DIR, it reuses what is there
# (`levee certs` never overwrites a key). LEVEE names the levee binary (default: levee).
set -euo pipefail
dir="${1:?usage: make-secrets.sh DIR}"
levee="${LEVEE:-levee}"
regions=(eu us ap)
mkdir -p "$dir"
[ -f "$dir/ca.pem" ] || "$levee" certs init --out "$dir" >&2
for r in "${regions[@]}"; do
  for k in 0 1; do
    [ -f "$dir/levee-$r-$k.pem" ] || "$levee" certs issue --ca "$dir" --node "levee-$r-$k" --out "$dir" >&2
  done
done
b64() { base64 -w0 < "$1"; }
for r in "${regions[@]}"; do
  cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: levee-tls
  namespace: levee-$r
  labels: { app.kubernetes.io/name: levee, levee.dev/region: $r }
type: Opaque
data:
  ca.pem: $(b64 "$dir/ca.pem")
YAML
  for k in 0 1; do
    echo "  levee-$r-$k.pem: $(b64 "$dir/levee-$r-$k.pem")"
    echo "  levee-$r-$k.key: $(b64 "$dir/levee-$r-$k.key")"
  done
done
