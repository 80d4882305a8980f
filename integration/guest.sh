# Runs inside the VM as root (from agentscope-guest.service), output on the
# second serial port. Installs the wheel, then runs the in-VM suite (or a
# benchmark, or the command in $RUN) once per manager and prints one status
# line the host runner parses.
set -u
. /payload/env
export PATH=/opt/agentscope/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "guest: $(uname -r), $(systemctl --version | head -n 1), $(python3 --version)"
t0=$(date +%s)
# Compiled at install, as pip does by default: the CLI's start-up is measured
# and tested here, and compiling every module on each start costs seconds
# under TCG.
pip install --quiet --no-index --no-deps --disable-pip-version-check /payload/agentscope_systemd-*.whl \
    || { echo "@@AGENTSCOPE-STATUS install=failed@@"; exit 1; }
echo "guest: agentscope installed in $(( $(date +%s) - t0 ))s"
# The kernel as Debian ships it: no MGLRU min_ttl_ms, dmesg_restrict=1. A test
# that needs something else (the kernel's fast OOM) asks the root helper
# below for it, says why, and restores it.
echo "guest: lru_gen enabled $(cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null || echo absent)," \
    "min_ttl_ms $(cat /sys/kernel/mm/lru_gen/min_ttl_ms 2>/dev/null || echo absent)," \
    "dmesg_restrict $(cat /proc/sys/kernel/dmesg_restrict)," \
    "earlyoom $(systemctl is-enabled earlyoom.service 2>/dev/null)"
# The root helper: the lingering user's suite and benchmarks have no sudo;
# they write one request a line to this FIFO (integration/roothelper.py) and
# read the answer from the file it names. It does only what roothelper.sh
# allows; root's own runs call roothelper.sh directly.
help=/run/agentscope-test
mkdir -p "$help" && rm -f "$help/requests" && mkfifo -m 0622 "$help/requests"
install -o root -g root -m 0755 /payload/integration/roothelper.sh "$help/roothelper.sh"
(
    while :; do
        while read -r id cmd args; do
            case $id in ''|*[!0-9a-f]*) continue ;; esac
            sh "$help/roothelper.sh" "$cmd" $args >"$help/.answer-$id" 2>&1
            echo "rc=$?" >>"$help/.answer-$id"
            mv "$help/.answer-$id" "$help/answer-$id"
        done <"$help/requests"
    done
) &
helper=$!
# A copy the test user can read and pytest can write its caches next to.
rm -rf /tmp/it && cp -r /payload/integration /tmp/it && chmod -R a+rwX /tmp/it
[ -d /payload/benchmarks ] && cp -r /payload/benchmarks /tmp/it/benchmarks
[ -d /payload/docs ] && cp -r /payload/docs/. /tmp/it/  # README.md and docs/
[ -d /payload/clients ] && cp -r /payload/clients /tmp/it/clients  # test_node.py
status=""
for manager in $MANAGERS; do
    eval "set -- $PYTEST_ARGS"
    echo "==== $DISTRO (systemd $SYSTEMD) $manager manager ===="
    common="AGENTSCOPE_TEST_MANAGER=$manager AGENTSCOPE_TEST_SYSTEMD=$SYSTEMD AGENTSCOPE_TEST_DISTRO=$DISTRO AGENTSCOPE_TEST_EVERYWHERE=${EVERYWHERE:-} PYTHONDONTWRITEBYTECODE=1"
    # A boot after a guest kernel panic: the tests that had ended are not run again (vm.py).
    [ -f "/tmp/it/deselect-$manager" ] && common="$common AGENTSCOPE_TEST_DESELECT=/tmp/it/deselect-$manager"
    if [ -n "$RUN" ]; then
        set -- sh -c "$RUN"
        common="$common $RUN_ENV"
    elif [ -n "$BENCH" ]; then
        set -- python benchmarks/"$BENCH"
    else
        # CI=true for pytest only: it then keeps a FAILED line's message whole
        # (else cut to 80 columns, and dropped where the test's id is wider),
        # and vm.py's matrix table at the end of the log can say why.
        set -- env CI=true python -m pytest -c /tmp/it/pytest.ini "$@" tests
    fi
    # How busy the guest's vCPUs were during the suite (a suite that waits
    # leaves room for another VM on the host's cores: make test's JOBS).
    cpu0=$(head -n 1 /proc/stat) t1=$(date +%s)
    if [ "$manager" = system ]; then
        (cd /tmp/it && env $common "$@")
    else
        bus=/run/user/$TEST_UID/bus
        for _ in $(seq 60); do [ -S "$bus" ] && break; sleep 0.5; done
        (cd /tmp/it && runuser -u "$TEST_USER" -- env -i \
            HOME=/home/$TEST_USER USER=$TEST_USER LOGNAME=$TEST_USER PATH="$PATH" \
            XDG_RUNTIME_DIR=/run/user/$TEST_UID DBUS_SESSION_BUS_ADDRESS=unix:path=$bus \
            $common "$@")
    fi
    rc=$?
    echo "$cpu0" "$(head -n 1 /proc/stat)" | awk -v m="$manager" -v s="$(($(date +%s) - t1))" -v n="$(nproc)" '{
        busy0 = $2 + $3 + $4 + $7 + $8; all0 = busy0 + $5 + $6
        busy1 = $13 + $14 + $15 + $18 + $19; all1 = busy1 + $16 + $17
        if (all1 > all0) printf "guest: the %s suite took %d s; its %d vCPUs were busy %.0f%% of it\n", m, s, n, 100 * (busy1 - busy0) / (all1 - all0)
    }'
    status="$status $manager=$rc"
done
kill "$helper" 2>/dev/null
# Where the guest's CPU went since boot (issue #29, CI's time: under TCG the
# suites are CPU-bound): the top-level cgroups and system.slice's largest.
for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/system.slice/*/ /sys/fs/cgroup/user.slice/*/; do
    u=$(sed -n 's/^usage_usec //p' "$d/cpu.stat" 2>/dev/null) && [ -n "$u" ] && echo "$((u / 1000000)) ${d#/sys/fs/cgroup/}"
done | sort -rn | head -n 8 | awk '{printf "%s%s %d s", (NR > 1 ? ", " : "guest: CPU since boot by cgroup: "), $2, $1} END {print ""}'
echo "@@AGENTSCOPE-STATUS$status@@"
