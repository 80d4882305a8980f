# What the in-VM suite and benchmarks may do as root, and nothing else: the
# lingering user's runs ask for it through guest.sh's FIFO (roothelper.py),
# root's runs call this directly. Each command checks its arguments.
#   lru_gen ENABLED TTL   set MGLRU's enabled mask and min_ttl_ms (a test that
#                         needs the kernel's fast OOM; it restores the old pair)
#   earlyoom start|stop   Debian's own earlyoom.service, masked in the images so
#                         it never acts in a test; unmasked for one benchmark round
#   earlyoom log SINCE    its journal since SINCE (seconds since the epoch)
#   journal_reader add|remove   the test user in (out of) systemd-journal, the group
#                         Debian's journald lets read the system journal, for the one
#                         test of victims named from it (test_recovery.py); it removes it
#   journal_reader run SCRIPT   run integration/tests/SCRIPT as the test user, with the
#                         groups of a new login (the suite's own process predates them)
set -u
. /payload/env 2>/dev/null || true
lru=/sys/kernel/mm/lru_gen
case "${1:-}" in
lru_gen)
    case "${2:-}" in y|n|0x[0-9a-f][0-9a-f][0-9a-f][0-9a-f]) ;; *) echo "bad mask: ${2:-}"; exit 2 ;; esac
    case "${3:-}" in ''|*[!0-9]*) echo "bad min_ttl_ms: ${3:-}"; exit 2 ;; esac
    [ -w "$lru/min_ttl_ms" ] || { echo "no $lru/min_ttl_ms on this kernel"; exit 3; }
    echo "$2" >"$lru/enabled" && echo "$3" >"$lru/min_ttl_ms" || exit 1
    echo "enabled $(cat $lru/enabled) min_ttl_ms $(cat $lru/min_ttl_ms)"
    ;;
earlyoom)
    case "${2:-}" in
    start) systemctl unmask earlyoom.service && systemctl start earlyoom.service \
        && systemctl is-active earlyoom.service ;;
    stop) systemctl stop earlyoom.service; systemctl mask earlyoom.service ;;
    log)
        case "${3:-}" in ''|*[!0-9]*) echo "bad time: ${3:-}"; exit 2 ;; esac
        journalctl -u earlyoom.service -o short-unix --no-pager --since "@$3" ;;
    *) echo "earlyoom: start, stop or log"; exit 2 ;;
    esac
    ;;
journal_reader)
    user=${TEST_USER:?no test user}
    case "${2:-}" in
    add) gpasswd -a "$user" systemd-journal ;;
    remove) gpasswd -d "$user" systemd-journal ;;
    run)
        case "${3:-}" in ''|*[!a-z_]*) echo "bad script: ${3:-}"; exit 2 ;; esac
        script=/tmp/it/tests/$3.py
        [ -f "$script" ] || { echo "no $script"; exit 2; }
        uid=$(id -u "$user")
        cd /tmp/it && runuser -u "$user" -- env -i HOME="/home/$user" USER="$user" \
            LOGNAME="$user" PATH="$PATH" XDG_RUNTIME_DIR="/run/user/$uid" \
            DBUS_SESSION_BUS_ADDRESS="unix:path=/run/user/$uid/bus" \
            PYTHONDONTWRITEBYTECODE=1 python "$script" ;;
    *) echo "journal_reader: add, remove or run SCRIPT"; exit 2 ;;
    esac
    ;;
*) echo "unknown request: ${1:-}"; exit 2 ;;
esac
