#!/usr/bin/env bash
# What the VM runner needs on the host (make demo, make integration, make test), checked before
# anything is downloaded. As root on Debian or Ubuntu the missing packages are installed
# (--no-install-recommends, said first); as a user the exact commands to run are printed
# (a user builds the images in a user namespace: uidmap and subordinate ids).
#   integration/host-deps.sh          check (and install as root)
#   integration/host-deps.sh --check  check only; exit 1 with the command when something is missing
set -euo pipefail
# mke2fs, debugfs and chroot live in /usr/sbin, which a Debian user's PATH lacks.
PATH=$PATH:/usr/sbin:/sbin
check_only=0
[ "${1:-}" = "--check" ] && check_only=1

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v debugfs >/dev/null || need+=(e2fsprogs)
command -v make >/dev/null || need+=(make)
# The wheel's compiled launch gate (native/build_gate.py), built static so that
# the host's build runs in every guest: a compiler and the C library's archive.
command -v cc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# mmdebstrap's default mode needs these to fetch and unpack Debian's packages.
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
command -v zstd >/dev/null || need+=(zstd)
mapfile -t need < <(printf '%s\n' "${need[@]}" | awk 'NF && !seen[$0]++')

if [ "$(id -u)" != 0 ]; then
    # As a user the images are built in a user namespace (mmdebstrap --mode=unshare):
    # newuidmap/newgidmap, and subordinate ids for this user.
    command -v newuidmap >/dev/null || need+=(uidmap)
    mapfile -t need < <(printf '%s\n' "${need[@]}" | awk 'NF && !seen[$0]++')
    me=$(id -un)
    ids_ok=1
    grep -q "^$me:" /etc/subuid 2>/dev/null && grep -q "^$me:" /etc/subgid 2>/dev/null || ids_ok=0
    ((${#need[@]})) || ((!ids_ok)) || exit 0
    echo "host-deps: not everything the VM runner needs is here; as root, run:" >&2
    if ((${#need[@]})); then
        echo "  sudo apt-get update" >&2
        echo "  sudo apt-get install --no-install-recommends ${need[*]}" >&2
    fi
    if ((!ids_ok)); then
        echo "  sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $me" >&2
        echo "  (subordinate ids for the user namespace the VM images are built in)" >&2
    fi
    echo "then run the same make command again (or run it as root, which installs these itself)." >&2
    exit 1
fi
((${#need[@]})) || exit 0
if ((check_only)) || ! command -v apt-get >/dev/null; then
    echo "host-deps: missing: ${need[*]}; install them with:" >&2
    echo "  apt-get install --no-install-recommends ${need[*]}" >&2
    exit 1
fi
echo "host-deps: installing ${need[*]} (apt-get, --no-install-recommends)" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
