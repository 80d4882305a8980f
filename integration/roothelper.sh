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
#   profile ubuntu|fedora|debian   the host as users have it (issue #25), for the tests
#                         that need one (test_hosts.py), which go back to debian after:
#                         ubuntu: a swap file as large as memory, systemd-oomd with
#                         Ubuntu's drop-ins (user@.service ManagedOOMMemoryPressure=kill
#                         at 50 %, -.slice ManagedOOMSwap=kill, 20 s pressure duration);
#                         fedora: zram swap as large as memory (zram-generator's
#                         min(ram, 8G), priority 100), systemd-oomd with Fedora's
#                         systemd-oomd-defaults (-.slice ManagedOOMSwap=kill, every
#                         slice of system.slice and of each user manager at 80 %, 20 s);
#                         debian: none of it (Debian's default: no swap, no oomd).
#   oomd start|stop       the profile's systemd-oomd, for a benchmark round without it
#   oomd log SINCE        its journal since SINCE (seconds since the epoch)
#   swap empty            every swapped page back in RAM (swapoff, then swapon of the
#                         same devices at their priorities): a benchmark's rounds each
#                         start as its first did, not with the last round's pages out
#   memory compact        the kernel compacts all memory (vm.compact_memory): with
#                         bench_squeeze.py --compact, a round starts with free memory
#                         in one piece, not as the last round's squeeze left it
#                         The distributions' drop-ins go where they put them, /usr/lib.
set -u
. /payload/env 2>/dev/null || true
lru=/sys/kernel/mm/lru_gen
# swapoff pulls every swapped page back into RAM: with less memory available
# than swap used it would run the VM out of memory. Wait (up to 60 s) for room.
swap_room() {
    for _ in $(seq 60); do
        awk '/^MemAvailable:/ {a=$2} /^SwapTotal:/ {t=$2} /^SwapFree:/ {f=$2}
             END {exit !(a > t - f + 65536)}' /proc/meminfo && return 0
        sleep 1
    done
}
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
oomd)
    case "${2:-}" in
    start) systemctl start systemd-oomd.service && systemctl is-active systemd-oomd.service ;;
    stop) systemctl stop systemd-oomd.service systemd-oomd.socket ;;
    log)
        case "${3:-}" in ''|*[!0-9]*) echo "bad time: ${3:-}"; exit 2 ;; esac
        journalctl -u systemd-oomd.service -o short-unix --no-pager --since "@$3" ;;
    *) echo "oomd: start, stop or log"; exit 2 ;;
    esac
    ;;
swap)
    [ "${2:-}" = empty ] || { echo "swap: empty"; exit 2; }
    on=$(swapon --show=NAME,PRIO --noheadings --raw)
    [ -n "$on" ] || { echo "no swap"; exit 0; }
    swap_room
    swapoff -a || { echo "swapoff failed"; exit 1; }
    # The loop runs in a subshell: its failure is the pipeline's status.
    echo "$on" | while read -r name prio; do swapon -p "$prio" "$name" || exit 1; done \
        || { echo "swapon failed: swap left off"; exit 1; }
    echo "swap emptied: $(swapon --show=NAME,USED --noheadings | tr -s ' \n' ' ')"
    ;;
memory)
    [ "${2:-}" = compact ] || { echo "memory: compact"; exit 2; }
    before=$(awk '$1 == "pgmigrate_success" {print $2}' /proc/vmstat)
    echo 1 >/proc/sys/vm/compact_memory || { echo "compact_memory failed"; exit 1; }
    after=$(awk '$1 == "pgmigrate_success" {print $2}' /proc/vmstat)
    echo "memory compacted: $((after - before)) pages migrated"
    ;;
profile)
    lib=/usr/lib/systemd
    uid=$(id -u "${TEST_USER:?no test user}")
    reload() {
        systemctl daemon-reload
        runuser -u "$TEST_USER" -- env XDG_RUNTIME_DIR="/run/user/$uid" systemctl --user daemon-reload
    }
    mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    case "${2:-}" in
    ubuntu|fedora)
        swapon --show=NAME --noheadings | grep -q . && { echo "swap is on already"; exit 3; }
        mkdir -p "$lib/system/-.slice.d" "$lib/oomd.conf.d"
        printf '[Slice]\nManagedOOMSwap=kill\n' >"$lib/system/-.slice.d/10-oomd-root-slice-defaults.conf"
        printf '[OOM]\nDefaultMemoryPressureDurationSec=20s\n' >"$lib/oomd.conf.d/10-oomd-defaults.conf"
        if [ "$2" = ubuntu ]; then
            fallocate -l "${mem_kb}K" /swapfile && chmod 600 /swapfile && mkswap -q /swapfile \
                && swapon /swapfile || exit 1
            mkdir -p "$lib/system/user@.service.d"
            printf '[Service]\nManagedOOMMemoryPressure=kill\nManagedOOMMemoryPressureLimit=50%%\n' \
                >"$lib/system/user@.service.d/10-oomd-user-service-defaults.conf"
        else
            # zramctl resets the device it finds first: udev may still hold the one
            # the last profile let go ("failed to reset: busy", sid, CI): settle, retry.
            modprobe zram || exit 1
            dev=
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                udevadm settle --timeout=10 2>/dev/null
                dev=$(zramctl --find --size "${mem_kb}K") && break
                dev=
                sleep 1
            done
            [ -n "$dev" ] && mkswap -q "$dev" && swapon -p 100 "$dev" || exit 1
            mkdir -p "$lib/system/system.slice.d" "$lib/user/slice.d"
            for f in "$lib/system/system.slice.d" "$lib/user/slice.d"; do
                printf '[Slice]\nManagedOOMMemoryPressure=kill\nManagedOOMMemoryPressureLimit=80%%\n' \
                    >"$f/10-oomd-per-slice-defaults.conf"
            done
        fi
        reload
        systemctl unmask systemd-oomd.socket systemd-oomd.service >/dev/null 2>&1
        systemctl start systemd-oomd.service || exit 1
        echo "profile $2: $(swapon --show=NAME,TYPE,SIZE --noheadings | tr '\n' ' ')"
        oomctl 2>&1 | head -n 40
        ;;
    debian)
        systemctl stop systemd-oomd.service systemd-oomd.socket 2>/dev/null
        systemctl mask systemd-oomd.service systemd-oomd.socket >/dev/null 2>&1
        rm -f "$lib/system/-.slice.d/10-oomd-root-slice-defaults.conf" \
            "$lib/oomd.conf.d/10-oomd-defaults.conf" \
            "$lib/system/user@.service.d/10-oomd-user-service-defaults.conf" \
            "$lib/system/system.slice.d/10-oomd-per-slice-defaults.conf" \
            "$lib/user/slice.d/10-oomd-per-slice-defaults.conf"
        swap_room
        swapoff -a || { echo "swapoff failed: $(grep -E 'MemAvailable|Swap' /proc/meminfo | tr -s ' \n' ' ')"; exit 1; }
        rm -f /swapfile
        # udev may still hold a device it just saw go: a moment, then once more.
        for z in /dev/zram*; do
            [ -b "$z" ] || continue
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                udevadm settle --timeout=10 2>/dev/null
                zramctl --reset "$z" 2>/dev/null && break
                sleep 1
            done
        done
        modprobe -r zram 2>/dev/null
        reload
        echo "profile debian: swap '$(swapon --show --noheadings)'"
        ;;
    *) echo "profile: ubuntu, fedora or debian"; exit 2 ;;
    esac
    ;;
*) echo "unknown request: ${1:-}"; exit 2 ;;
esac
