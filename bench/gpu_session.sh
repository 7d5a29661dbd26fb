#!/usr/bin/env bash
# One device session's phases of bench/gpu_suite.sh, in order, each logged to $SESSION_OUT/session-<phase>.log
# (a failed build stops the rest; any other failure is logged and the next phase runs). Meant to run
# detached, so that no device time is lost between calls:
#   SESSION_OUT=/root/out bench/device_job.sh start session bash bench/gpu_session.sh build reference test engines
#   bench/device_job.sh wait session 560 /root/out     (every call until it ends; copies /root/out to the call's $OUT)
# SESSION_OUT is the results folder on the device (the phases' OUT); it outlives each call's own $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${SESSION_OUT:?set SESSION_OUT to the results folder on the device}"
export OUT=$SESSION_OUT
mkdir -p "$OUT"
for phase in "$@"; do
  log="$OUT/session-${phase// /-}.log"
  echo "=== $(date -u +%H:%M:%S) $phase"
  # shellcheck disable=SC2086  # a phase is the suite's words: "seeds 1 2"
  bash bench/gpu_suite.sh $phase >"$log" 2>&1
  status=$?
  echo "=== $(date -u +%H:%M:%S) $phase: status $status; $(grep -cE '^FAILED' "$log") FAILED lines; $(tail -n 2 "$log" | tr '\n' ' ')"
  if [ "$phase" = build ] && [ $status -ne 0 ]; then tail -n 30 "$log"; exit 1; fi
done
