#!/usr/bin/env bash
# What the VM runner needs on the host (make demo, make integration, make test), checked before
# anything is downloaded. As root on Debian or Ubuntu the missing packages are installed
# (--no-install-recommends, said first); otherwise the exact command to run is printed.
#   integration/host-deps.sh          check (and install as root)
#   integration/host-deps.sh --check  check only; exit 1 with the command when something is missing
set -euo pipefail
check_only=0
[ "${1:-}" = "--check" ] && check_only=1

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v debugfs >/dev/null || need+=(e2fsprogs)
command -v make >/dev/null || need+=(make)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# mmdebstrap's default mode needs these to fetch and unpack Debian's packages.
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
command -v zstd >/dev/null || need+=(zstd)
mapfile -t need < <(printf '%s\n' "${need[@]}" | awk 'NF && !seen[$0]++')

if [ "$(id -u)" != 0 ]; then
    echo "host-deps: the VM images are built with mmdebstrap, which needs root: run this as root" >&2
    echo "  (sudo make demo / sudo make test)" >&2
    if ((${#need[@]})); then
        echo "host-deps: missing: ${need[*]}; install them with:" >&2
        echo "  sudo apt-get install --no-install-recommends ${need[*]}" >&2
    fi
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
