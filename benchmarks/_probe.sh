ms() { s=$(date +%s%N); "$@" >/dev/null 2>&1; echo $(( ($(date +%s%N) - s) / 1000000 )); }
P=/opt/agentscope/bin/python
for r in 1 2; do
echo "probe: sys-py $(ms /usr/bin/python3 -c pass) sys-py-S $(ms /usr/bin/python3 -S -c pass) venv-py $(ms $P -c pass) venv-py-S $(ms $P -S -c pass) venv-I $(ms $P -I -c pass)"
echo "probe: asyncio $(ms $P -c 'import asyncio') dbus_fast $(ms $P -c 'import dbus_fast') lib $(ms $P -c 'import agentscope_systemd') sqlite3 $(ms $P -c 'import sqlite3') psutil $(ms $P -c 'import psutil')"
echo "probe: cli-version $(ms agentscope --version) cli-ls $(ms agentscope --json ls) cli-events $(ms agentscope --json events) cli-help $(ms agentscope --help) sleep $(ms sleep 0) true $(ms /bin/true) sh $(ms sh -c :) systemctl $(ms systemctl --version) systemd-run $(ms systemd-run --scope true)"
done
$P -X importtime -c 'import agentscope_systemd._cli.main' 2>&1 | sort -t'|' -k2 -n | tail -12
ls /opt/agentscope/lib/python3*/site-packages/*.pth
