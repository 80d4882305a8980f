/*
 * agentscope-gate: the launch gate as a program (issue #31).
 *
 * The launcher (agentscope_systemd/_fleet/_spawn.py) starts this with
 * subprocess.Popen and no preexec_fn, so the fork of a threaded manager runs
 * no Python code: Popen may use vfork, and the child only execs this file.
 * Here, in a process of its own that runs nothing else, the gate does what
 * a preexec_fn did: it takes the agent's name, says it is ready, waits until
 * the launcher says go (the scope exists) or abort, sets oom_score_adj and
 * RLIMIT_NOFILE, and execs the agent with the argv and environment it was
 * given, searching the same paths, in the same order, that Popen would have.
 *
 *   agentscope-gate GO STATUS PARENT OOM SOFT HARD COMM N PATH... -- ARGV...
 *
 *   GO      descriptor to read one byte from: 'g' go, anything else abort
 *   STATUS  descriptor to report on: "r" once ready; "e<errno>" and exit 127
 *           if the exec (or a step before it) failed; closed by the exec
 *   PARENT  pidfd of the launcher: readable when it dies (then exit)
 *   OOM     oom_score_adj to set, or "-"
 *   SOFT HARD  RLIMIT_NOFILE to set (-1 is RLIM_INFINITY, as Python's
 *           resource module says it), or "-" "-"
 *   COMM    the name to take before the exec (what /proc/PID/comm shows)
 *   N PATH  the N files to try, in order (Popen's search of PATH)
 *
 * Exit codes before the exec: 0 aborted, 125 the launcher died, 126 bad
 * arguments (a bug in the launcher), 127 the exec failed (errno on STATUS).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

extern char **environ;

/* A whole decimal number in [lo, hi], ASCII digits only; -1 on anything else. */
static int number(const char *s, long lo, long hi, long *out) {
    char *end;
    if (s[0] == '\0' || (s[0] != '-' && (s[0] < '0' || s[0] > '9'))) return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int fd_arg(const char *s) {
    long v;
    return number(s, 3, INT_MAX, &v) ? -1 : (int)v;
}

static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        buf += n;
        len -= (size_t)n;
    }
}

static void fail(int status, int err) {
    char msg[32];
    int len = snprintf(msg, sizeof msg, "e%d", err);
    write_all(status, msg, (size_t)len);
    _exit(127);
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int err = errno;
    close(fd);
    if (n == (ssize_t)len) return 0;
    errno = n < 0 ? err : EIO;
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 11) _exit(126);
    int go = fd_arg(argv[1]), status = fd_arg(argv[2]), parent = fd_arg(argv[3]);
    long oom = 0, soft = 0, hard = 0, npaths = 0;
    int want_oom = strcmp(argv[4], "-") != 0;
    int want_nofile = strcmp(argv[5], "-") != 0;
    if (go < 0 || status < 0 || parent < 0) _exit(126);
    if (want_oom && number(argv[4], -1000, 1000, &oom)) _exit(126);
    if (want_nofile && (number(argv[5], -1, LONG_MAX, &soft) || number(argv[6], -1, LONG_MAX, &hard)))
        _exit(126);
    if (number(argv[8], 1, argc, &npaths) || 9 + npaths >= argc) _exit(126);
    char **paths = argv + 9;
    if (strcmp(argv[9 + npaths], "--") != 0 || 10 + npaths >= argc) _exit(126);
    char **target = argv + 10 + npaths;

    /* Named as the agent before anyone can see it: a monitor sampling the
     * scope while this waits must not record "agentscope-gate" for it. */
    (void)write_file("/proc/self/comm", argv[7]);
    write_all(status, "r", 1);

    struct pollfd fds[2] = {{.fd = go, .events = POLLIN}, {.fd = parent, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            fail(status, errno);
        }
        if (fds[0].revents) {
            char byte = 0;
            ssize_t n;
            do n = read(go, &byte, 1); while (n < 0 && errno == EINTR);
            if (n == 1 && byte == 'g') break;
            _exit(0); /* abort, or the launcher closed its end without a word */
        }
        if (fds[1].revents) _exit(125);
    }
    close(go);
    close(parent);

    if (want_oom) {
        char text[16];
        snprintf(text, sizeof text, "%ld", oom);
        if (write_file("/proc/self/oom_score_adj", text)) fail(status, errno);
    }
    if (want_nofile) {
        struct rlimit lim = {.rlim_cur = (rlim_t)soft, .rlim_max = (rlim_t)hard};
        if (setrlimit(RLIMIT_NOFILE, &lim)) fail(status, errno);
    }
    if (fcntl(status, F_SETFD, FD_CLOEXEC)) fail(status, errno);

    /* As CPython's _posixsubprocess: try each path; report the first error
     * that is not "no such file", else the last one. */
    int saved = 0;
    for (long i = 0; i < npaths; i++) {
        execve(paths[i], target, environ);
        if (errno != ENOENT && errno != ENOTDIR && saved == 0) saved = errno;
    }
    fail(status, saved ? saved : errno);
    return 127;
}
