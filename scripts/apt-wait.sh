#!/usr/bin/env bash
# Wait until no other package manager holds apt's or dpkg's lock (fresh cloud machines run
# unattended-upgrades at boot), saying so, for at most $HERMES_SANDBOXES_APT_WAIT_S seconds
# (default 600). Exit 0 when the locks are free, 1 on timeout. The locks are only looked at
# (F_GETLK), never taken. $HERMES_SANDBOXES_APT_LOCKS overrides the lock files (tests).
set -euo pipefail
limit=${HERMES_SANDBOXES_APT_WAIT_S:-600}
locks=${HERMES_SANDBOXES_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}
holder() {  # "PID PATH" of the first lock someone holds, or nothing
  python3 - $locks <<'PY'
import fcntl, os, struct, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        continue
    try:
        kind, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(
            fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)))
    finally:
        os.close(fd)
    if kind != fcntl.F_UNLCK:
        print(pid, path)
        break
PY
}
start=$SECONDS
said=-1
while held=$(holder) && [ -n "$held" ]; do
  pid=${held%% *} path=${held#* }
  what=$(cat "/proc/$pid/comm" 2>/dev/null || echo "?")
  waited=$((SECONDS - start))
  if [ "$waited" -ge "$limit" ]; then
    echo "setup: gave up after ${limit}s: $what (pid $pid) still holds $path; let it finish (or stop it)" \
         "and run setup again (HERMES_SANDBOXES_APT_WAIT_S sets the wait)" >&2
    exit 1
  fi
  if [ "$said" -lt 0 ] || [ $((waited - said)) -ge 15 ]; then
    echo "setup: waiting for $what (pid $pid) to release $path (${waited}s so far, at most ${limit}s;" \
         "fresh machines often run unattended upgrades at boot)" >&2
    said=$waited
  fi
  sleep 1
done
