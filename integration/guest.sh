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
# Thrashing protection (MGLRU min_ttl_ms, Documentation/admin-guide/mm/multigen_lru.rst):
# when the working set of the last few seconds cannot stay in memory, kswapd
# OOM-kills at once instead of reclaiming page cache for minutes. Measured on
# trixie's 6.12 under TCG with 1000 ms: a global OOM of one 600 MB allocation
# 48 s -> 2.6 s, of 16 MB chunks ~140 s -> 9 s; 5000 ms because a TCG guest
# starved of host CPU ages its pages in slow motion.
if [ -w /sys/kernel/mm/lru_gen/min_ttl_ms ]; then
    echo y > /sys/kernel/mm/lru_gen/enabled && echo 5000 > /sys/kernel/mm/lru_gen/min_ttl_ms
fi
echo "guest: lru_gen min_ttl_ms $(cat /sys/kernel/mm/lru_gen/min_ttl_ms 2>/dev/null || echo absent)"
# A command run for show (make demo) may read the kernel log as the lingering
# user, so its monitor names a global OOM's victim from the kernel's own line;
# the test suites keep Debian's dmesg_restrict=1, the harder case.
[ -n "$RUN" ] && echo 0 > /proc/sys/kernel/dmesg_restrict
# A copy the test user can read and pytest can write its caches next to.
rm -rf /tmp/it && cp -r /payload/integration /tmp/it && chmod -R a+rwX /tmp/it
[ -d /payload/benchmarks ] && cp -r /payload/benchmarks /tmp/it/benchmarks
status=""
for manager in $MANAGERS; do
    eval "set -- $PYTEST_ARGS"
    echo "==== $DISTRO (systemd $SYSTEMD) $manager manager ===="
    common="AGENTSCOPE_TEST_MANAGER=$manager AGENTSCOPE_TEST_SYSTEMD=$SYSTEMD AGENTSCOPE_TEST_DISTRO=$DISTRO PYTHONDONTWRITEBYTECODE=1"
    if [ -n "$RUN" ]; then
        set -- sh -c "$RUN"
        common="$common $RUN_ENV"
    elif [ -n "$BENCH" ]; then
        set -- python benchmarks/"$BENCH"
    else
        set -- python -m pytest -c /tmp/it/pytest.ini "$@" tests
    fi
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
    status="$status $manager=$?"
done
echo "@@AGENTSCOPE-STATUS$status@@"
