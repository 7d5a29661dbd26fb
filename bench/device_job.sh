#!/usr/bin/env bash
# Long runs on the GPU machine across device calls: a call may last 10 minutes and a machine left idle for
# 30 s is given back, so a build or a suite longer than one call runs detached, and each call waits on it.
#   bench/device_job.sh start NAME CMD...   run CMD detached (setsid), its output in /root/jobs/NAME.log
#   bench/device_job.sh wait NAME SECONDS [DIR]  wait up to SECONDS for it to end; print its log's tail and
#                                           copy the log, and DIR (e.g. the job's own results folder) packed
#                                           as DIR.tgz, to $OUT (if set); exit with its status, or 124 while it runs
# The device tool empties $OUT before every call and brings back at most 8 files: DIR must be a folder of
# its own (never $OUT itself), and it comes back as one archive, whole at every call.
# The job inherits the environment of the call that starts it (source .deps/unpack.sh first).
set -uo pipefail
dir=/root/jobs
mkdir -p "$dir"
case "${1:-}" in
  start)
    name=$2
    shift 2
    rm -f "$dir/$name.rc"
    setsid nohup bash -c '"$@" >"$0.log" 2>&1; echo $? >"$0.rc"' "$dir/$name" "$@" </dev/null >/dev/null 2>&1 &
    echo "started $name (pid $!): $*"
    ;;
  wait)
    name=$2
    end=$((SECONDS + $3))
    while [ ! -f "$dir/$name.rc" ] && [ $SECONDS -lt $end ]; do sleep 2; done
    tail -n 25 "$dir/$name.log"
    if [ -n "${OUT:-}" ]; then
      cp "$dir/$name.log" "$OUT/"
      [ -n "${4:-}" ] && [ -d "$4" ] && tar czf "$OUT/$(basename "$4").tgz" -C "$4" .
    fi
    if [ -f "$dir/$name.rc" ]; then
      echo "$name: ended with status $(cat "$dir/$name.rc")"
      exit "$(cat "$dir/$name.rc")"
    fi
    echo "$name: still running"
    exit 124
    ;;
  *)
    echo "usage: device_job.sh start NAME CMD... | wait NAME SECONDS" >&2
    exit 2
    ;;
esac
