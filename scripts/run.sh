#!/usr/bin/env bash
# run.sh -- what `make run` does after installing deps and building: starts moatd on 127.0.0.1:7070
# with data in ./.moat (unless one already answers there), then runs a command in a fresh sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."
LISTEN=${MOAT_LISTEN:-127.0.0.1:7070}
DATA=./.moat
LOG=$DATA/moatd.log
URL=http://$LISTEN
export MOAT_API_URL=$URL

healthy() { curl -fsS --max-time 2 "$URL/healthz" >/dev/null 2>&1; }

mkdir -p "$DATA"
if healthy; then
  pid=$(cat "$DATA/moatd.pid" 2>/dev/null || echo "?")
  echo "moatd already answers on $URL (pid $pid); using it."
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: moatd needs root (namespaces, cgroups, mounts); run make run as root" >&2
    exit 1
  fi
  # Sandboxes get the internet through the host's IPv4 default route (moatd's default, --net-uplink
  # auto: masqueraded, forwarding on for that interface and moat's link only). MOAT_NET_UPLINK=none
  # gives them loopback only; MOAT_NET_UPLINK=IFNAME picks the interface.
  uplink=${MOAT_NET_UPLINK:-auto}
  net=(--net-uplink "$uplink")
  if [ "$uplink" = none ]; then
    echo "Sandboxes have loopback only (MOAT_NET_UPLINK=none)"
  else
    echo "Sandboxes reach the internet through uplink $uplink (moat's egress policy applies; MOAT_NET_UPLINK=none turns it off)"
  fi
  # /proc/meminfo, stat, uptime and loadavg of a sandbox are its own: moatd finds the machine's
  # lxcfs or starts one (--lxcfs auto, its default). MOAT_LXCFS=none: the machine's files.
  lx=(--lxcfs "${MOAT_LXCFS:-auto}")
  echo "Starting moatd on $LISTEN (data in $DATA, log in $LOG)"
  # setsid: moatd outlives this script and is not hit by a Ctrl-C in this terminal.
  setsid build/moatd --listen "$LISTEN" --data-dir "$DATA" "${net[@]}" "${lx[@]}" >>"$LOG" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$DATA/moatd.pid"
  for _ in $(seq 1 300); do
    healthy && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run.sh: moatd exited during start-up; the end of $LOG:" >&2
      tail -n 20 "$LOG" >&2
      exit 1
    fi
    sleep 0.1
  done
  if ! healthy; then
    echo "run.sh: moatd (pid $pid) does not answer $URL/healthz after 30 s; see $LOG" >&2
    exit 1
  fi
fi

state=$(build/moat template ls 2>/dev/null | awk '$1 == "base" { print $2 }' || true)
if [ "$state" != "ready" ]; then
  echo "First use: moatd builds the 'base' template now (debootstrap of Debian 12, about a minute;"
  echo "progress in $LOG). The sandbox create below waits for it."
fi

cmd='uname -a; grep PRETTY /etc/os-release; nproc; free -m'
echo "\$ build/moat run -- sh -c '$cmd'"
t0=$(date +%s.%N)
set +e
build/moat run -- sh -c "$cmd"
rc=$?
set -e
t1=$(date +%s.%N)
echo "(exit code $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s including create and kill)"
echo
pid=$(cat "$DATA/moatd.pid" 2>/dev/null || echo "?")
# the platform admin key (manages orgs and their quotas: moat org ..., moat quota ...), made once
if [ ! -s "$DATA/admin-key" ]; then
  (umask 077 && build/moatd key create --data-dir "$DATA" --admin --name platform 2>/dev/null >"$DATA/admin-key.tmp" &&
    mv "$DATA/admin-key.tmp" "$DATA/admin-key") || echo "run.sh: could not make the platform admin key" >&2
fi
cat <<MSG
moatd keeps running: pid $pid, API $URL, key in $DATA/api-key, log $LOG.
Org key (org "default"):   $(cat "$DATA/api-key" 2>/dev/null)
Platform admin key:        $(cat "$DATA/admin-key" 2>/dev/null)   (in $DATA/admin-key: MOAT_API_KEY=\$(cat $DATA/admin-key) build/moat org ls)
Try:  build/moat create            (prints an id)
      build/moat exec ID -- ls -la /
      build/moat ls
      build/moat rm ID
Stop it with:  kill $pid
MSG
if [ -f /run/moat/lxcfs.d/pid ] && mountpoint -q /run/moat/lxcfs.d/mnt; then
  echo "               kill $(cat /run/moat/lxcfs.d/pid)   (the lxcfs moatd started, once no moatd uses it)"
fi
exit $rc
