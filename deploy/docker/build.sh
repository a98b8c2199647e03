#!/usr/bin/env bash
# Builds the levee image (deploy/docker/Dockerfile) and the compose init image
# (Dockerfile.init) with no registry: the binary comes from this repository, busybox from
# Debian's busybox-static package.
#
#   deploy/docker/build.sh                    # static release binary -> levee:dev, levee-init:dev
#   deploy/docker/build.sh --tag levee:1.2    # other tag (the init image is <name>-init:<tag>)
#   deploy/docker/build.sh --binary PATH      # use this levee binary instead of building one
#                                             # (a dynamic one gets the libraries ldd lists)
#
# An image is rebuilt only when what goes into it changed: each carries the SHA-256 of its
# build context as the label org.levee.context, and a build whose context has the same hash
# as the image under the tag is skipped. A rebuild removes the image the tag pointed at
# before (by its id, only if no container uses it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

tag="levee:dev"
binary=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
name="${tag%%:*}"
version="${tag#*:}"
[ "$version" = "$tag" ] && version=latest
init_tag="$name-init:$version"

# Whether a binary needs no shared library (ldd: "not a dynamic executable", or
# "statically linked" for a static-pie).
is_static() {
  local out
  out="$(ldd "$1" 2>&1)" && ! grep -q 'statically linked' <<<"$out" && return 1
  return 0
}

busybox=""
for candidate in /bin/busybox /usr/bin/busybox "$(command -v busybox || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && is_static "$candidate"; then
    busybox="$candidate"
    break
  fi
done
if [ -z "$busybox" ]; then
  echo "build.sh: a static busybox is needed for the init image: apt-get install busybox-static" >&2
  exit 1
fi

if [ -z "$binary" ]; then
  target_dir="${CARGO_TARGET_DIR:-$repo/target}"
  echo "== building a static levee (release, x86_64-unknown-linux-gnu)" >&2
  (cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release \
    --target x86_64-unknown-linux-gnu -p levee --bin levee)
  binary="$target_dir/x86_64-unknown-linux-gnu/release/levee"
fi
[ -x "$binary" ] || { echo "build.sh: no executable at $binary" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/levee-image.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
ctx="$tmp/node"
mkdir -p "$ctx/rootfs/etc/levee" "$ctx/writable/var/lib/levee" "$ctx/writable/certs" \
  "$ctx/writable/config"
strip -o "$ctx/rootfs/levee" "$binary"
cp "$here/levee.toml" "$ctx/rootfs/etc/levee/levee.toml"
cp "$here/Dockerfile" "$ctx/Dockerfile"
# A dynamic binary: the libraries and the loader it names, at the same paths.
if ! is_static "$binary"; then
  ldd "$binary" | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    mkdir -p "$ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$ctx/rootfs$lib"
  done
fi

# The hash of a context: every file's path, mode and content.
context_hash() {
  (cd "$1" && find . -type f -o -type d | LC_ALL=C sort | while read -r f; do
     if [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f")"; else echo "$f/"; fi
   done) | sha256sum | cut -d' ' -f1
}

# build TAG CONTEXT [docker build args…]: builds unless the image under TAG has the same hash.
build() {
  local image="$1" dir="$2"; shift 2
  local hash old
  hash="$(context_hash "$dir")"
  old="$(docker image inspect -f '{{.Id}} {{index .Config.Labels "org.levee.context"}}' "$image" 2>/dev/null || true)"
  if [ "${old#* }" = "$hash" ]; then
    echo "== $image is up to date (${old%% *})" >&2
    return
  fi
  echo "== building $image" >&2
  # (The legacy builder warns that it is deprecated on every build: shown only on failure.)
  if ! docker build -q --label "org.levee.context=$hash" -t "$image" "$@" "$dir" \
      > "$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    return 1
  fi
  if [ -n "$old" ] && [ "${old%% *}" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
    docker rmi "${old%% *}" >/dev/null 2>&1 || true
  fi
}

build "$tag" "$ctx"
# The init image: its context holds the node image's id, so it follows every rebuild of it.
init_ctx="$tmp/init"
mkdir "$init_ctx"
cp "$busybox" "$init_ctx/busybox"
cp "$here/init.sh" "$here/Dockerfile.init" "$init_ctx/"
docker image inspect -f '{{.Id}}' "$tag" > "$init_ctx/base-id"
build "$init_tag" "$init_ctx" -f "$init_ctx/Dockerfile.init" --build-arg "BASE=$tag"

for image in "$tag" "$init_tag"; do
  echo "$image $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1 / 1e6}')"
done
