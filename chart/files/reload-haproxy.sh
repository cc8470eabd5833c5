#!/bin/sh
# Reloads HAProxy's master and waits until the reload has taken. The Dataplane API runs this
# (without a shell of its own) when it cannot reload through the master CLI, which is the case
# for HAProxy < 2.7; the pod shares its process namespace, so HAProxy's processes are in /proc.
#
# A signal alone returns before the master has re-executed: the old worker would go on taking
# runtime commands on the stats socket for a while, and a runtime change sent then would be
# lost for the new worker. So this waits until a new worker runs and every old one has let go
# of its listening sockets (HAProxy does so once the new worker is ready), and fails when the
# master has re-executed without starting one (a configuration this HAProxy cannot start, an
# address taken: the old workers resume and keep serving) or the new worker died.
set -u
master=$(cat '@RUN_DIR@/haproxy.pid') || exit 1
# How long a reload may take before it counts as failed. A configuration that does not start
# fails at once (its new worker exits, or none is started); this bounds only a reload still
# loading. HAProxy 2.6 loading 10,000 backends on a busy 2-core node took more than 10 s: a
# shorter bound called that reload failed while it took effect, and the Dataplane API then
# put the previous file back under the running configuration. RELOAD_TIMEOUT_SECONDS in the
# sidecar's environment sets it.
timeout_seconds=${RELOAD_TIMEOUT_SECONDS:-120}

workers() {
    for stat in /proc/[0-9]*/stat; do
        { read -r pid _ _ ppid _ < "$stat"; } 2>/dev/null || continue
        [ "$ppid" = "$master" ] && echo "$pid"
    done
}

# Inodes of the listening sockets (TCP in state 0A, unix sockets accepting connections).
listening_inodes() {
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" { print $10 }'
    awk '$4 == "00010000" && $6 == "01" { print $7 }' /proc/net/unix 2>/dev/null
}

# Whether process $1 holds one of the listening sockets.
holds_listener() {
    listening=$(listening_inodes)
    for fd in /proc/"$1"/fd/*; do
        target=$(readlink "$fd" 2>/dev/null) || continue
        case "$target" in
            socket:*)
                inode=${target#socket:[}
                inode=${inode%]}
                for candidate in $listening; do
                    [ "$candidate" = "$inode" ] && return 0
                done
                ;;
        esac
    done
    return 1
}

# While the master re-executes, its command line carries `-sf <old workers>`.
reexecuting() {
    tr '\0' ' ' < "/proc/$master/cmdline" 2>/dev/null | grep -q -- ' -sf '
}

# A reload that has just taken may still be finishing (the master re-executes once more after
# its new worker is ready): a signal now would be lost or taken for that one. Wait it out.
started=$(date +%s)
while reexecuting; do
    if [ $(( $(date +%s) - started )) -ge "$timeout_seconds" ]; then
        echo "HAProxy's master was still re-executing after ${timeout_seconds}s (see HAProxy's log)" >&2
        exit 1
    fi
    sleep 0.05
done

old=$(workers)
old_list=" $(echo $old) "
kill -USR2 "$master" || exit 1

started=$(date +%s)
seen_new=""
seen_reexec=""
while :; do
    # Whether the master had finished re-executing is read before its workers are: a worker
    # it forked before finishing is then in the list below (read the other way round, a
    # reload that took could look like one that started no worker).
    settled=1
    if reexecuting; then
        seen_reexec=1
        settled=""
    fi
    new=""
    for pid in $(workers); do
        case "$old_list" in
            *" $pid "*) ;;
            *) new="$pid" ;;
        esac
    done
    [ -n "$new" ] && seen_new="$new"
    if [ -n "$new" ]; then
        still_listening=""
        for pid in $old; do
            [ -d "/proc/$pid" ] && holds_listener "$pid" && still_listening="$pid"
        done
        [ -z "$still_listening" ] && exit 0
    elif [ -n "$seen_new" ]; then
        echo "HAProxy's new worker (pid $seen_new) exited during the reload: the configuration does not start on this pod (see HAProxy's log); the previous workers keep serving" >&2
        exit 1
    elif [ -n "$seen_reexec" ] && [ -n "$settled" ]; then
        echo "HAProxy's master re-executed without starting a new worker: the configuration does not start on this pod (an address taken? see HAProxy's log); the previous workers keep serving" >&2
        exit 1
    fi
    if [ $(( $(date +%s) - started )) -ge "$timeout_seconds" ]; then
        echo "HAProxy's reload did not complete within ${timeout_seconds}s (new worker: ${new:-none}; see HAProxy's log)" >&2
        exit 1
    fi
    sleep 0.05
done
