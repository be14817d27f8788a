#!/usr/bin/env bash
# Replays the Dockerfile's build stage without a container engine: its COPY lines into an empty
# folder, then its RUN lines there. A file the build needs but the Dockerfile does not copy
# fails the build here as it would in `docker build`.
# Usage: tools/check-docker-build.sh [Dockerfile]  (CARGO_TARGET_DIR may point at a warm target
# directory: cargo only reuses what the copied files produce.)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=${1:-$repo/Dockerfile}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

# The build stage: from `FROM ... AS build` to the next FROM, continuation lines joined.
stage=$(awk '
  /^FROM .* [Aa][Ss] build$/ { inside = 1; next }
  /^FROM / { inside = 0 }
  inside { if (sub(/\\$/, "")) { line = line $0; next } print line $0; line = "" }
' "$dockerfile")
[ -n "$stage" ] || { echo "no build stage (FROM ... AS build) in $dockerfile" >&2; exit 1; }

workdir=/
while read -r instruction rest; do
  case "$instruction" in
    WORKDIR) workdir=$rest ;;
    COPY)
      case "$rest" in --from=*) continue ;; esac
      read -r -a parts <<<"$rest"
      dest=${parts[-1]}
      case "$dest" in /*) ;; *) dest=$workdir/$dest ;; esac
      # As COPY does: a directory's contents go into the destination; files go into it when
      # it ends in / (or there are several), else become it.
      for src in "${parts[@]:0:${#parts[@]}-1}"; do
        if [ -d "$repo/$src" ]; then
          mkdir -p "$context$dest"
          cp -a "$repo/$src/." "$context$dest/"
        elif [ "${dest: -1}" = / ] || [ "${#parts[@]}" -gt 2 ]; then
          mkdir -p "$context$dest"
          cp -a "$repo/$src" "$context$dest/"
        else
          mkdir -p "$(dirname "$context$dest")"
          cp -a "$repo/$src" "$context$dest"
        fi
      done
      ;;
    RUN)
      echo "+ (in the replayed context) $rest" >&2
      (cd "$context$workdir" && bash -euo pipefail -c "$rest")
      ;;
  esac
done <<<"$stage"
echo "the Dockerfile's build stage builds from the files it copies"
