"""The kernel's files, read: /proc, cgroupfs, memory sources, the kernel log, descriptor limits."""
