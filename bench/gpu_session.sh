#!/usr/bin/env bash
# One device session's phases of bench/gpu_suite.sh, in order, each logged to $SESSION_OUT/session-<phase>.log
# (a failed build or unpack stops the rest; any other failure is logged and the next phase runs). Meant to run
# detached, so that no device time is lost between calls:
#   SESSION_OUT=/root/session bench/device_job.sh start session bash bench/gpu_session.sh build reference test engines
#   bench/device_job.sh wait session 560 /root/session     (every call until it ends; packs /root/session into the call's $OUT as session.tgz)
# SESSION_OUT is the results folder on the device (the phases' OUT); it outlives each call's own $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${SESSION_OUT:?set SESSION_OUT to the results folder on the device}"
# The device tool empties the call's $OUT before each call: a session writing there loses its logs at the
# next call (2026-12-05: the test and seeds logs were lost that way).
if [ -n "${OUT:-}" ] && [ "$(realpath -m "$OUT")" = "$(realpath -m "$SESSION_OUT")" ]; then
  echo "gpu_session.sh: SESSION_OUT must not be the call's \$OUT ($OUT), which the next call empties" >&2
  exit 2
fi
export OUT=$SESSION_OUT
mkdir -p "$OUT"
for phase in "$@"; do
  log="$OUT/session-${phase// /-}.log"
  echo "=== $(date -u +%H:%M:%S) $phase"
  # shellcheck disable=SC2086  # a phase is the suite's words: "seeds 1 2"
  bash bench/gpu_suite.sh $phase >"$log" 2>&1
  status=$?
  echo "=== $(date -u +%H:%M:%S) $phase: status $status; $(grep -cE '^FAILED' "$log") FAILED lines; $(tail -n 2 "$log" | tr '\n' ' ')"
  if { [ "$phase" = build ] || [ "$phase" = unpack ]; } && [ $status -ne 0 ]; then tail -n 30 "$log"; exit 1; fi
done
