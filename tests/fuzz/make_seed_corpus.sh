#!/usr/bin/env bash
# Writes a seed corpus for the EROFS reader fuzz target into OUTDIR: small
# metadata images that mkfs.erofs builds from a tiny tree in every layout
# it can write (blob variants keep only the metadata image, as the target
# stands in for the blob itself).
#   tests/fuzz/make_seed_corpus.sh OUTDIR
set -euo pipefail
out=${1:?usage: make_seed_corpus.sh OUTDIR}
if ! command -v mkfs.erofs >/dev/null; then
  echo "make_seed_corpus: mkfs.erofs not found (Debian: erofs-utils), no generated seeds" >&2
  exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/src
mkdir -p "$src/dir/sub" "$src/wide"
printf 'hello\n' >"$src/small"
head -c 9000 /dev/zero | tr '\0' 'a' >"$src/two-blocks"
head -c 600 /dev/urandom >"$src/dir/random"
: >"$src/empty"
ln -s small "$src/link"
ln -s "$(printf 'x%.0s' $(seq 1 300))" "$src/long-link"
ln "$src/small" "$src/dir/hard"
mkfifo "$src/fifo"
# Enough entries to need a second directory block.
for i in $(seq 1 180); do : >"$src/wide/entry-number-$i"; done
if command -v python3 >/dev/null; then
  python3 - "$src" <<'PY' || true
import os, sys
root = sys.argv[1]
for name in ("small", "two-blocks", "dir/random", "empty"):
    os.setxattr(os.path.join(root, name), "user.shared", b"on every file")
os.setxattr(os.path.join(root, "small"), "user.inline", b"only here")
os.setxattr(os.path.join(root, "dir"), "user.on-dir", b"d")
try:
    os.setxattr(os.path.join(root, "dir"), "trusted.overlay.opaque", b"y")
except OSError:
    pass
PY
fi

build() {  # name, mkfs args...
  local name=$1; shift
  mkfs.erofs --quiet -T1700000000 -U 00000000-0000-0000-0000-000000000001 "$@" "$out/$name.erofs" "$src" \
    || echo "make_seed_corpus: mkfs.erofs $* failed" >&2
}
build inline
build plain -Enoinline_data
build compact -Eforce-inode-compact
build extended -Eforce-inode-extended
build chunk4k --chunksize=4096
build chunk4k-indexes --chunksize=4096 -Eforce-chunk-indexes
build chunk64k --chunksize=65536
: >"$work/blob"
build chunk4k-blob --chunksize=4096 --blobdev="$work/blob"
: >"$work/blob2"
build chunk1m-blob-extended --chunksize=1048576 -Eforce-inode-extended --blobdev="$work/blob2"
echo "make_seed_corpus: $(ls "$out" | wc -l) seeds in $out" >&2
