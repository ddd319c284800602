#!/usr/bin/env bash
# tools/timed.sh NAME CMD...: run CMD, then print how long it took, so a CI
# log shows where its time went ("ci step NAME: 123 s (exit 0)").
set -uo pipefail
name=$1
shift
start=$(date +%s)
"$@"
status=$?
printf 'ci step %s: %d s (exit %d)\n' "$name" "$(($(date +%s) - start))" "$status" >&2
exit $status
