#!/usr/bin/env bash
# Entry point of the GPU image. `<script> [args]` runs examples/scripts/<script>.sh (the .sh may be
# left out); anything else runs as a command (`ray start --head`, `bash`, `python -m evaluation`);
# `--help` (the default) lists the scripts.
set -euo pipefail
scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")/../examples/scripts" && pwd)

if [[ $# == 0 || $1 == --help || $1 == -h || $1 == help ]]; then
  echo "usage: docker run [options] IMAGE <script> [arguments]   or   IMAGE <command> [arguments]"
  echo "scripts (settings are environment variables: docker run -e MODEL=... -e NUM_GPUS=...):"
  for path in "$scripts"/*.sh; do
    name=$(basename "$path" .sh)
    [[ $name == common ]] || echo "  $name"
  done
  exit 0
fi
name=${1%.sh}
if [[ $name != common && $name != */* && -f $scripts/$name.sh ]]; then
  shift
  exec bash "$scripts/$name.sh" "$@"
fi
exec "$@"
