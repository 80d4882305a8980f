"""The monitor: samples, kill counting and attribution, reports, escapes, recovery, systemd-oomd."""
