#!/usr/bin/env bash
# The suite leaves nothing in /dev/shm: ctest runs `baseline` before every test (the fixture
# shm_left_behind of tests/CMakeLists.txt) and `check` after the last. A segment that is new since
# the baseline and that no live process holds was left by a test (a killed rank's arena or
# flight-recorder ring: tests/support/job_shm.h and tests/python/conftest.py remove their jobs'):
# `check` names each, removes it and fails. One that a live process holds belongs to a job still
# running on this machine, not to the suite, and is left alone.
#   shm_leak_check.sh baseline FILE
#   shm_leak_check.sh check FILE TRAINGUARD_CLI
set -euo pipefail
mode="$1" file="$2"

segments() { (ls /dev/shm 2>/dev/null || true) | (grep '^trainguard\.' || true) | sort; }

case "$mode" in
  baseline)
    segments >"$file"
    echo "shm: $(wc -l <"$file") trainguard segment(s) in /dev/shm before the tests"
    ;;
  check)
    cli="$3"
    [ -f "$file" ] || { echo "shm: no baseline $file (the fixture's setup did not run)"; exit 1; }
    new="$(comm -13 "$file" <(segments))"
    if [ -z "$new" ]; then
      echo "shm: the tests left no trainguard segment in /dev/shm"
      exit 0
    fi
    # `trainguard shm list`: one segment per line, its holders (live pids, or -) in the last column.
    unheld="$("$cli" shm list | awk 'NR > 1 && $NF == "-" { print $1 }' | sort)"
    left="$(comm -12 <(echo "$new") <(echo "$unheld"))"
    if [ -z "$left" ]; then
      echo "shm: the tests left no trainguard segment in /dev/shm (new ones are held by live jobs)"
      exit 0
    fi
    echo "shm: the tests left $(echo "$left" | wc -l) segment(s) in /dev/shm that no process holds" \
         "(their job ids name the tests' jobs); removed now:"
    while read -r segment; do
      echo "  /dev/shm/$segment"
      rm -f "/dev/shm/$segment"
    done <<<"$left"
    exit 1
    ;;
  *)
    echo "usage: $0 baseline FILE | check FILE TRAINGUARD_CLI" >&2
    exit 2
    ;;
esac
