#!/bin/sh
# The test bed's own speed under TCG (issue #29, CI's time): what the suites
# do most, timed in the guest, three rounds. Run it under two CPU models at
# once and compare (vm.py's AGENTSCOPE_VM_TCG_CPU), e.g.:
#   AGENTSCOPE_VM_TCG_CPU=max python integration/vm.py -d trixie -m system \
#       --run "sh benchmarks/bed_speed.sh" &
#   python integration/vm.py -d trixie -m system --run "sh benchmarks/bed_speed.sh"
# Under TCG only the ratio between two runs at the same time means anything
# (docs/benchmarks.md, "The test bed's speed").
ms() { s=$(date +%s%N); "$@" >/dev/null 2>&1; echo $(( ($(date +%s%N) - s) / 1000000 )); }
for r in 1 2 3; do
    a=$(ms sh -c 'for i in $(seq 10); do python3 -c pass; done')
    b=$(ms sh -c 'for i in $(seq 3); do agentscope --help; done')
    c=$(ms sh -c 'for i in $(seq 200); do /bin/true; done')
    d=$(ms python3 -c 'b = bytearray(300 << 20); b[::4096] = b"x" * len(b[::4096])')
    e=$(ms python3 -c 'sum(i*i for i in range(2000000))')
    echo "bed_speed: round $r: python -c pass x10 ${a} ms; agentscope --help x3 ${b} ms;" \
        "/bin/true x200 ${c} ms; touch 300 MiB ${d} ms; a Python loop ${e} ms"
done
echo "bed_speed: CPU flags: $(grep -o -w 'avx2\|erms\|fsrm\|sse4_2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "bed_speed: spectre_v2: $(cat /sys/devices/system/cpu/vulnerabilities/spectre_v2)"
