# Runs inside the VM as root (from agentscope-guest.service), output on the
# second serial port. Installs the wheel, then runs the in-VM suite once per
# manager and prints one status line the host runner parses.
set -u
. /payload/env
export PATH=/opt/agentscope/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "guest: $(uname -r), $(systemctl --version | head -n 1), $(python3 --version)"
t0=$(date +%s)
# Compiled at install, as pip does by default: the CLI's start-up is measured
# and tested here, and compiling every module on each start costs seconds
# under TCG.
pip install --quiet --no-index --no-deps --disable-pip-version-check /payload/agentscope-*.whl \
    || { echo "@@AGENTSCOPE-STATUS install=failed@@"; exit 1; }
echo "guest: agentscope installed in $(( $(date +%s) - t0 ))s"
# A copy the test user can read and pytest can write its caches next to.
rm -rf /tmp/it && cp -r /payload/integration /tmp/it && chmod -R a+rwX /tmp/it
[ -d /payload/benchmarks ] && cp -r /payload/benchmarks /tmp/it/benchmarks
status=""
for manager in $MANAGERS; do
    eval "set -- $PYTEST_ARGS"
    echo "==== $DISTRO (systemd $SYSTEMD) $manager manager ===="
    common="AGENTSCOPE_TEST_MANAGER=$manager AGENTSCOPE_TEST_SYSTEMD=$SYSTEMD AGENTSCOPE_TEST_DISTRO=$DISTRO PYTHONDONTWRITEBYTECODE=1"
    if [ -n "$BENCH" ]; then
        set -- benchmarks/"$BENCH"
    else
        set -- -m pytest -c /tmp/it/pytest.ini "$@" tests
    fi
    if [ "$manager" = system ]; then
        (cd /tmp/it && env $common python "$@")
    else
        bus=/run/user/$TEST_UID/bus
        for _ in $(seq 60); do [ -S "$bus" ] && break; sleep 0.5; done
        (cd /tmp/it && runuser -u "$TEST_USER" -- env -i \
            HOME=/home/$TEST_USER USER=$TEST_USER LOGNAME=$TEST_USER PATH="$PATH" \
            XDG_RUNTIME_DIR=/run/user/$TEST_UID DBUS_SESSION_BUS_ADDRESS=unix:path=$bus \
            $common python "$@")
    fi
    status="$status $manager=$?"
done
echo "@@AGENTSCOPE-STATUS$status@@"
