/*
 * faultfs: an LD_PRELOAD shim that injects file-system faults into the
 * calls zarr_fused (and zarr's LocalStore, through CPython) make on chunk
 * files, for tests/test_io_faults.py and tests/test_crash_consistency.py.
 *
 * Only paths containing FAULTFS_MARKER are touched (descriptors opened on
 * such a path are remembered until closed); without the variable every call
 * passes straight through. Configuration, read at load:
 *
 *   FAULTFS_MARKER  substring of the targeted paths (required)
 *   FAULTFS_OPS     comma-separated call groups to act on:
 *                   open   (open/openat read-only)
 *                   create (open/openat for writing or with O_CREAT)
 *                   read   (read, pread, preadv, readv)
 *                   write  (write, writev, pwrite, pwritev)
 *                   rename (rename, renameat, renameat2)
 *                   close, fsync (fsync, fdatasync)
 *   FAULTFS_MODE    error: fail the call with FAULTFS_ERRNO (default);
 *                   short: move at most FAULTFS_SHORT bytes per read/write;
 *                   crash: SIGKILL the process at the triggering call (a
 *                   write first moves half of its bytes, like a crash in
 *                   the middle of it);
 *                   delay: sleep FAULTFS_DELAY_US microseconds, then make
 *                   the call (a network filesystem's round trip: see
 *                   asv_bench/latency_side_by_side.py);
 *                   eof: a triggered read returns 0 bytes, end of file, as
 *                   when another process truncated the file under the
 *                   reader (for the read group only)
 *   FAULTFS_ERRNO   EIO, EACCES, ENOSPC, EINTR, EROFS or a number (EIO)
 *   FAULTFS_SKIP    matching calls let through before the first fault (0)
 *   FAULTFS_EVERY   from then on, act on every k-th matching call (1): with
 *                   EINTR and 2, each failed call's retry goes through
 *   FAULTFS_COUNT   faults to inject, -1 for no limit (-1)
 *   FAULTFS_SHORT   byte limit of the short mode (1)
 *   FAULTFS_DELAY_US  microseconds each acted-on call waits in the delay
 *                   mode (1000); threads wait independently, so N calls in
 *                   flight take one delay, not N
 *   FAULTFS_LOG     file that gets one line per injected fault (or short
 *                   transfer), so a test can tell its fault happened
 *
 * `faultfs_reload()` (exported) reads the variables again and resets the
 * counters, for a long-lived child that runs one case after another.
 *
 * The test fixture compiles this file with `cc -shared -fPIC` into a
 * temporary directory; it is not part of the package.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { G_OPEN = 1, G_CREATE = 2, G_READ = 4, G_WRITE = 8, G_RENAME = 16, G_CLOSE = 32,
       G_FSYNC = 64 };
enum { M_ERROR, M_SHORT, M_CRASH, M_DELAY, M_EOF };
enum { MAX_FD = 1 << 16 };

static const char* marker = NULL;
static int groups = 0;
static int mode = M_ERROR;
static int fault_errno = EIO;
static long skip = 0;
static long count = -1;
static long every = 1;
static size_t short_limit = 1;
static long delay_us = 1000;
static int log_fd = -1;
static long seen = 0;
static long injected = 0;
static unsigned char marked[MAX_FD];

static int parse_errno(const char* s) {
    if (s == NULL || !*s) return EIO;
    if (!strcmp(s, "EIO")) return EIO;
    if (!strcmp(s, "EACCES")) return EACCES;
    if (!strcmp(s, "ENOSPC")) return ENOSPC;
    if (!strcmp(s, "EINTR")) return EINTR;
    if (!strcmp(s, "EROFS")) return EROFS;
    return atoi(s);
}

static int parse_groups(const char* s) {
    static const struct { const char* name; int bit; } names[] = {
        {"open", G_OPEN}, {"create", G_CREATE}, {"read", G_READ}, {"write", G_WRITE},
        {"rename", G_RENAME}, {"close", G_CLOSE}, {"fsync", G_FSYNC}};
    int bits = 0;
    char buf[256];
    if (s == NULL) return 0;
    snprintf(buf, sizeof(buf), "%s", s);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if (!strcmp(tok, names[i].name)) bits |= names[i].bit;
        }
    }
    return bits;
}

static char marker_buf[4096];

/* Reads the configuration from the environment and starts counting anew.
   Called at load and, by a test's long-lived child between two cases (no
   file IO running), through ctypes after it changed os.environ. */
int faultfs_reload(void) {
    const char* m = getenv("FAULTFS_MARKER");
    const char* v;
    marker = NULL;  /* until the end every call passes through */
    groups = 0;
    mode = M_ERROR;
    skip = 0;
    count = -1;
    every = 1;
    short_limit = 1;
    delay_us = 1000;
    __atomic_store_n(&seen, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&injected, 0, __ATOMIC_RELAXED);
    memset(marked, 0, sizeof(marked));
    if (log_fd >= 0) {
        syscall(SYS_close, log_fd);
        log_fd = -1;
    }
    if (m == NULL || !*m || strlen(m) >= sizeof(marker_buf)) return 0;
    snprintf(marker_buf, sizeof(marker_buf), "%s", m);
    groups = parse_groups(getenv("FAULTFS_OPS"));
    v = getenv("FAULTFS_MODE");
    if (v && !strcmp(v, "short")) mode = M_SHORT;
    if (v && !strcmp(v, "crash")) mode = M_CRASH;
    if (v && !strcmp(v, "delay")) mode = M_DELAY;
    if (v && !strcmp(v, "eof")) mode = M_EOF;
    fault_errno = parse_errno(getenv("FAULTFS_ERRNO"));
    if ((v = getenv("FAULTFS_SKIP"))) skip = atol(v);
    if ((v = getenv("FAULTFS_COUNT"))) count = atol(v);
    if ((v = getenv("FAULTFS_EVERY")) && atol(v) > 0) every = atol(v);
    if ((v = getenv("FAULTFS_SHORT")) && atol(v) > 0) short_limit = (size_t)atol(v);
    if ((v = getenv("FAULTFS_DELAY_US")) && atol(v) >= 0) delay_us = atol(v);
    if ((v = getenv("FAULTFS_LOG")) && *v) {
        log_fd = (int)syscall(SYS_openat, AT_FDCWD, v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                              0644);
    }
    __atomic_store_n(&marker, marker_buf, __ATOMIC_RELEASE);
    return 1;
}

__attribute__((constructor)) static void faultfs_init(void) { faultfs_reload(); }

#define REAL(name) \
    static __typeof__(&name) real_##name = NULL; \
    if (real_##name == NULL) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static int path_marked(const char* path) {
    const char* m = __atomic_load_n(&marker, __ATOMIC_ACQUIRE);
    return m != NULL && path != NULL && strstr(path, m) != NULL;
}

static int fd_marked(int fd) {
    return marker != NULL && fd >= 0 && fd < MAX_FD && __atomic_load_n(&marked[fd], __ATOMIC_RELAXED);
}

static void remember(int fd, int on) {
    if (fd >= 0 && fd < MAX_FD) __atomic_store_n(&marked[fd], (unsigned char)on, __ATOMIC_RELAXED);
}

static void log_line(const char* what, const char* path) {
    char line[4352];
    int n;
    if (log_fd < 0) return;
    n = snprintf(line, sizeof(line), "%d %s %s\n", (int)getpid(), what, path ? path : "-");
    if (n > 0) syscall(SYS_write, log_fd, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
}

/* Whether this matching call of `group` is the one to act on. */
static int trigger(int group, const char* what, const char* path) {
    long nth, done;
    if (!(groups & group)) return 0;
    nth = __atomic_fetch_add(&seen, 1, __ATOMIC_RELAXED);
    if (nth < skip || (nth - skip) % every != 0) return 0;
    done = __atomic_fetch_add(&injected, 1, __ATOMIC_RELAXED);
    if (count >= 0 && done >= count) return 0;
    log_line(what, path);
    return 1;
}

/* The delay mode's wait: nanosleep, resumed after a signal, so the call
   always waits its full delay (a signal does not shorten a round trip). */
static void pause_for_delay(void) {
    struct timespec left = {delay_us / 1000000, (delay_us % 1000000) * 1000};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

/* Acts on a triggered call in the delay mode: waits, keeps errno, and
   tells the caller to make the real call (0). */
static int delayed(void) {
    int saved = errno;
    pause_for_delay();
    errno = saved;
    return 0;
}

static void crash(void) {
    kill(getpid(), SIGKILL);
    for (;;) pause();
}

static int open_group(int flags) {
    return (flags & (O_WRONLY | O_RDWR | O_CREAT)) ? G_CREATE : G_OPEN;
}

static int opened(int fd, const char* path) {
    if (fd >= 0) remember(fd, path_marked(path));
    return fd;
}

static int open_fault(int flags, const char* what, const char* path) {
    if (!path_marked(path) || !trigger(open_group(flags), what, path)) return 0;
    if (mode == M_DELAY) return delayed();
    if (mode == M_CRASH) crash();
    return mode == M_ERROR;
}

/* Whether open's third argument is there (glibc's __OPEN_NEEDS_MODE). */
#ifdef __O_TMPFILE
#define NEEDS_MODE(flags) (((flags) & O_CREAT) || ((flags) & __O_TMPFILE) == __O_TMPFILE)
#else
#define NEEDS_MODE(flags) ((flags) & O_CREAT)
#endif

#define OPEN_MODE(flags, mode_var) \
    mode_t mode_var = 0; \
    if (NEEDS_MODE(flags)) { \
        va_list ap; \
        va_start(ap, flags); \
        mode_var = (mode_t)va_arg(ap, int); \
        va_end(ap); \
    }

int open(const char* path, int flags, ...) {
    OPEN_MODE(flags, m);
    REAL(open);
    if (open_fault(flags, "open", path)) { errno = fault_errno; return -1; }
    return opened(real_open(path, flags, m), path);
}

int open64(const char* path, int flags, ...) {
    OPEN_MODE(flags, m);
    REAL(open64);
    if (open_fault(flags, "open64", path)) { errno = fault_errno; return -1; }
    return opened(real_open64(path, flags, m), path);
}

int openat(int dirfd, const char* path, int flags, ...) {
    OPEN_MODE(flags, m);
    REAL(openat);
    if (open_fault(flags, "openat", path)) { errno = fault_errno; return -1; }
    return opened(real_openat(dirfd, path, flags, m), path);
}

int openat64(int dirfd, const char* path, int flags, ...) {
    OPEN_MODE(flags, m);
    REAL(openat64);
    if (open_fault(flags, "openat64", path)) { errno = fault_errno; return -1; }
    return opened(real_openat64(dirfd, path, flags, m), path);
}

/* What a read or write on fd should do: 0 pass through, 1 fail, 2 short,
   3 crash after half. */
static int io_action(int group, int fd, const char* what) {
    if (!fd_marked(fd)) return 0;
    if (mode == M_SHORT) {
        if (!(groups & group)) return 0;
        log_line(what, "fd");
        return 2;
    }
    if (!trigger(group, what, "fd")) return 0;
    if (mode == M_DELAY) return delayed();
    if (mode == M_EOF) return group == G_READ ? 4 : 0;
    return mode == M_CRASH ? 3 : 1;
}

static size_t clamp(size_t n, int action) {
    if (action == 2) return n < short_limit ? n : short_limit;
    if (action == 3) return n / 2;
    if (action == 4) return 0;
    return n;
}

/* Trims an iovec array in place to `limit` bytes; returns the new count. */
static int trim_iov(struct iovec* iov, int cnt, size_t limit) {
    size_t left = limit;
    for (int i = 0; i < cnt; i++) {
        if (iov[i].iov_len >= left) {
            iov[i].iov_len = left;
            return i + 1;
        }
        left -= iov[i].iov_len;
    }
    return cnt;
}

static size_t iov_total(const struct iovec* iov, int cnt) {
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

#define IO_BODY(group, name, call_real) \
    int action = io_action(group, fd, name); \
    ssize_t r; \
    if (action == 1) { errno = fault_errno; return -1; } \
    r = call_real; \
    if (action == 3) crash(); \
    return r

ssize_t read(int fd, void* buf, size_t n) {
    REAL(read);
    IO_BODY(G_READ, "read", real_read(fd, buf, clamp(n, action)));
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
    REAL(pread);
    IO_BODY(G_READ, "pread", real_pread(fd, buf, clamp(n, action), off));
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
    REAL(pread64);
    IO_BODY(G_READ, "pread64", real_pread64(fd, buf, clamp(n, action), off));
}

ssize_t write(int fd, const void* buf, size_t n) {
    REAL(write);
    IO_BODY(G_WRITE, "write", real_write(fd, buf, clamp(n, action)));
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
    REAL(pwrite);
    IO_BODY(G_WRITE, "pwrite", real_pwrite(fd, buf, clamp(n, action), off));
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
    REAL(pwrite64);
    IO_BODY(G_WRITE, "pwrite64", real_pwrite64(fd, buf, clamp(n, action), off));
}

/* Vectored calls: a short or half transfer goes through a trimmed copy of
   the iovec array (at most IOV_MAX entries, as the kernel allows). */
#define IOV_BODY(group, name, call_real) \
    int action = io_action(group, fd, name); \
    struct iovec copy[1024]; \
    const struct iovec* use = iov; \
    int use_cnt = cnt; \
    ssize_t r; \
    if (action == 1) { errno = fault_errno; return -1; } \
    if ((action == 2 || action == 3 || action == 4) && cnt > 0 && cnt <= 1024) { \
        memcpy(copy, iov, sizeof(struct iovec) * (size_t)cnt); \
        use_cnt = trim_iov(copy, cnt, clamp(iov_total(iov, cnt), action)); \
        use = copy; \
    } \
    r = call_real; \
    if (action == 3) crash(); \
    return r

ssize_t readv(int fd, const struct iovec* iov, int cnt) {
    REAL(readv);
    IOV_BODY(G_READ, "readv", real_readv(fd, use, use_cnt));
}

ssize_t preadv(int fd, const struct iovec* iov, int cnt, off_t off) {
    REAL(preadv);
    IOV_BODY(G_READ, "preadv", real_preadv(fd, use, use_cnt, off));
}

ssize_t preadv64(int fd, const struct iovec* iov, int cnt, off_t off) {
    REAL(preadv64);
    IOV_BODY(G_READ, "preadv64", real_preadv64(fd, use, use_cnt, off));
}

ssize_t writev(int fd, const struct iovec* iov, int cnt) {
    REAL(writev);
    IOV_BODY(G_WRITE, "writev", real_writev(fd, use, use_cnt));
}

ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
    REAL(pwritev);
    IOV_BODY(G_WRITE, "pwritev", real_pwritev(fd, use, use_cnt, off));
}

static int rename_fault(const char* what, const char* old, const char* new) {
    const char* hit = path_marked(old) ? old : (path_marked(new) ? new : NULL);
    if (hit == NULL || mode == M_SHORT || !trigger(G_RENAME, what, hit)) return 0;
    if (mode == M_DELAY) return delayed();
    if (mode == M_CRASH) crash();
    return 1;
}

int rename(const char* old, const char* new) {
    REAL(rename);
    if (rename_fault("rename", old, new)) { errno = fault_errno; return -1; }
    return real_rename(old, new);
}

int renameat(int olddir, const char* old, int newdir, const char* new) {
    REAL(renameat);
    if (rename_fault("renameat", old, new)) { errno = fault_errno; return -1; }
    return real_renameat(olddir, old, newdir, new);
}

int renameat2(int olddir, const char* old, int newdir, const char* new, unsigned int flags) {
    REAL(renameat2);
    if (rename_fault("renameat2", old, new)) { errno = fault_errno; return -1; }
    return real_renameat2(olddir, old, newdir, new, flags);
}

int close(int fd) {
    int was = fd_marked(fd);
    int r;
    REAL(close);
    r = real_close(fd);  /* the descriptor is released even when close reports an error */
    remember(fd, 0);
    if (was && mode != M_SHORT && trigger(G_CLOSE, "close", "fd")) {
        if (mode == M_DELAY) { delayed(); return r; }
        if (mode == M_CRASH) crash();
        errno = fault_errno;
        return -1;
    }
    return r;
}

int fsync(int fd) {
    REAL(fsync);
    if (fd_marked(fd) && mode != M_SHORT && trigger(G_FSYNC, "fsync", "fd")) {
        if (mode == M_DELAY) { delayed(); return real_fsync(fd); }
        if (mode == M_CRASH) crash();
        errno = fault_errno;
        return -1;
    }
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (fd_marked(fd) && mode != M_SHORT && trigger(G_FSYNC, "fdatasync", "fd")) {
        if (mode == M_DELAY) { delayed(); return real_fdatasync(fd); }
        if (mode == M_CRASH) crash();
        errno = fault_errno;
        return -1;
    }
    return real_fdatasync(fd);
}
