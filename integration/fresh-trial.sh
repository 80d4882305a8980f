#!/usr/bin/env bash
# The README's promise, tried: a fresh Debian machine with only git and python3
# gets from `git clone` to a finished `make demo` with the README's commands alone.
#
# The "machine" is a container: a Debian bookworm minbase (mmdebstrap) with git,
# python3 and ca-certificates only, in its own mount namespace with pivot_root
# (user namespaces work inside it, which a chroot forbids). This checkout's HEAD
# goes in as a git bundle. Inside, as root: the README's apt-get line, then
# clone and `make demo`. As a user: clone and `make demo`, which must stop
# before any download and print the root commands to run; root runs exactly
# those; then `make demo` again as the user.
#
#   sudo integration/fresh-trial.sh [root|user]    (default: both, one after the other)
#
# Needs root, mmdebstrap and a few GB in /var/tmp; each trial boots the demo's
# VM (2-3 minutes under TCG with a warm image cache, longer the first time: the
# container starts with no cache). Not part of `make test`: it takes minutes.
# What the host's network setup needs to reach the package mirrors (a proxy's
# CA certificate, pip's configuration) is copied in when the host has it.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "fresh-trial: run as root (it builds a root filesystem)" >&2; exit 2; }
command -v mmdebstrap >/dev/null || { echo "fresh-trial: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
modes=(root user)
[ $# -eq 0 ] || modes=("$@")
for mode in "${modes[@]}"; do
    case $mode in root | user) ;; *) echo "fresh-trial: a mode is root or user, not $mode" >&2; exit 2 ;; esac
done
work=$(mktemp -d /var/tmp/fresh-trial.XXXXXX)
trap 'rm -rf "$work"' EXIT
git -C "$here" bundle create -q "$work/agentscope.bundle" HEAD
echo "fresh-trial: building a bookworm minbase with git and python3" >&2
mmdebstrap --quiet --variant=minbase --include=git,python3,ca-certificates bookworm "$work/rootfs"

for mode in "${modes[@]}"; do
    box=$work/box-$mode
    cp -a "$work/rootfs" "$box"
    cp /etc/resolv.conf "$box/etc/resolv.conf"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$box/usr/local/share/ca-certificates/"
        chroot "$box" update-ca-certificates >/dev/null 2>&1
    fi
    [ -e /etc/pip.conf ] && cp /etc/pip.conf "$box/etc/pip.conf"
    mkdir -p "$box/src"
    cp "$work/agentscope.bundle" "$box/src/"
    chmod 755 "$box/src"
    chmod 644 "$box/src/agentscope.bundle"
    cat >"$box/trial.sh" <<'INSIDE'
set -u
mode=$1
say() { echo "=== fresh-trial ($mode): $*"; }
say "root: apt-get update && apt-get install --no-install-recommends make (the README's line)"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make >/dev/null
if [ "$mode" = root ]; then
    cd /root && git clone -q /src/agentscope.bundle agentscope && cd agentscope
    t0=$(date +%s)
    make demo; rc=$?
    say "root: make demo exit $rc after $(($(date +%s) - t0))s"
    exit $rc
fi
useradd -m -s /bin/bash trial
su - trial -c 'git clone -q /src/agentscope.bundle agentscope && cd agentscope && make demo' >/tmp/first.log 2>&1
urc=$?
cat /tmp/first.log
say "user: the first make demo stopped with exit $urc (it must: root has to install first)"
grep '^  sudo ' /tmp/first.log | sed 's/^  sudo //; s/apt-get install/apt-get install -y/' >/tmp/todo.sh
say "root runs what it printed:"
cat /tmp/todo.sh
DEBIAN_FRONTEND=noninteractive bash -e /tmp/todo.sh >/dev/null 2>&1 || { say "the printed commands failed"; exit 1; }
t0=$(date +%s)
su - trial -c 'cd agentscope && make demo'
rc=$?
say "user: make demo exit $rc after $(($(date +%s) - t0))s"
exit $rc
INSIDE
    echo "fresh-trial: $mode" >&2
    box=$box mode=$mode unshare --mount --fork bash -c '
        set -e
        mount --make-rprivate /
        mount --bind "$box" "$box"
        mount -t proc proc "$box/proc"
        mount --rbind /dev "$box/dev"
        mount --rbind /sys "$box/sys"
        mount -t tmpfs tmpfs "$box/tmp"
        cd "$box"; mkdir -p old; pivot_root . old; umount -l /old
        exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb bash /trial.sh "$mode"
    '
done
