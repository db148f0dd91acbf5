/* shard.c: token shard reader and atomic writer (format in shard.h). */
#include "data/shard.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define BUF_TOKENS 65536

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_le64(const unsigned char *p) {
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static void header_encode(unsigned char *h, uint64_t count, uint32_t checksum) {
    memcpy(h, SHARD_MAGIC, 8);
    put_le32(h + 8, SHARD_VERSION);
    put_le32(h + 12, 4);
    put_le64(h + 16, count);
    put_le64(h + 24, checksum);   /* CRC-32 in the low half, the high half 0 */
}

/* ---- writer -------------------------------------------------------------------------------------- */

struct shard_writer {
    char *path, *tmp;
    int fd;
    uint64_t count;
    uint32_t crc;          /* CRC-32 of the token bytes written so far */
    unsigned char buf[4 * BUF_TOKENS];
    size_t nbuf;           /* bytes in buf */
};

shard_writer *shard_writer_open(const char *path, char *err, size_t errlen) {
    shard_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n + 5))) {
        if (w) free(w->path);
        free(w);
        ct_errf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    w->fd = -1;
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    char *slash = strrchr(w->tmp, '/');
    if (slash && slash != w->tmp) {   /* the folder is made, like a run's dump folder */
        *slash = 0;
        int made = ct_mkdir_p(w->tmp);
        *slash = '/';
        if (made) {
            ct_errf(err, errlen, "%s: cannot create its folder: %s", w->tmp, strerror(errno));
            shard_writer_abort(w);
            return NULL;
        }
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    unsigned char h[SHARD_HEADER_BYTES];
    header_encode(h, 0, 0);   /* the count and checksum are patched on close */
    w->crc = (uint32_t)crc32(0, Z_NULL, 0);
    if (w->fd < 0 || ct_write_all(w->fd, h, sizeof h)) {
        ct_errf(err, errlen, "%s: cannot create: %s", w->tmp, strerror(errno));
        shard_writer_abort(w);
        return NULL;
    }
    return w;
}

static int flush_buf(shard_writer *w, char *err, size_t errlen) {
    if (w->nbuf && ct_write_all(w->fd, w->buf, w->nbuf)) {
        ct_errf(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        return -1;
    }
    w->crc = (uint32_t)crc32_z(w->crc, w->buf, w->nbuf);
    w->nbuf = 0;
    return 0;
}

int shard_writer_append(shard_writer *w, const uint32_t *tokens, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        if (w->nbuf == sizeof w->buf && flush_buf(w, err, errlen)) return -1;
        put_le32(w->buf + w->nbuf, tokens[i]);
        w->nbuf += 4;
    }
    w->count += n;
    return 0;
}

uint64_t shard_writer_count(const shard_writer *w) { return w->count; }

void shard_writer_abort(shard_writer *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    free(w->path);
    free(w->tmp);
    free(w);
}

int shard_writer_close(shard_writer *w, char *err, size_t errlen) {
    unsigned char h[SHARD_HEADER_BYTES];
    if (flush_buf(w, err, errlen)) goto fail;
    header_encode(h, w->count, w->crc);
    if (pwrite(w->fd, h, sizeof h, 0) != (ssize_t)sizeof h || fsync(w->fd)) {
        ct_errf(err, errlen, "%s: write failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) || rename(w->tmp, w->path)) {
        ct_errf(err, errlen, "%s: cannot finish writing: %s", w->path, strerror(errno));
        unlink(w->tmp);
        goto fail;
    }
    free(w->path);
    free(w->tmp);
    free(w);
    return 0;
fail:
    shard_writer_abort(w);
    return -1;
}

int shard_write(const char *path, const uint32_t *tokens, uint64_t n, char *err, size_t errlen) {
    shard_writer *w = shard_writer_open(path, err, errlen);
    if (!w) return -1;
    if (shard_writer_append(w, tokens, (size_t)n, err, errlen)) {
        shard_writer_abort(w);
        return -1;
    }
    return shard_writer_close(w, err, errlen);
}

/* ---- reader -------------------------------------------------------------------------------------- */

/* An open shard whose header agrees with its size. */
typedef struct checked {
    int fd;
    uint32_t version;
    uint64_t count;
    uint32_t checksum;   /* version 2: as stored */
} checked;

/* Opens path and validates its header against its size; returns the fd (in c), or -1. */
static int open_checked(const char *path, checked *c, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ct_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    unsigned char h[SHARD_HEADER_BYTES];
    if (fstat(fd, &st)) {
        ct_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        ct_errf(err, errlen, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < SHARD_HEADER_BYTES) {
        ct_errf(err, errlen, "%s: %llu bytes, too short for the %d-byte token shard header", path,
                (unsigned long long)size, SHARD_HEADER_BYTES);
        goto fail;
    }
    if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        ct_errf(err, errlen, "%s: cannot read the header: %s", path, strerror(errno));
        goto fail;
    }
    if (memcmp(h, SHARD_MAGIC, 8) != 0) {
        ct_errf(err, errlen, "%s: bad magic (expected \"%s\"; not a token shard)", path, SHARD_MAGIC);
        goto fail;
    }
    uint32_t version = get_le32(h + 8), bpt = get_le32(h + 12);
    uint64_t n = get_le64(h + 16), sum = get_le64(h + 24);
    if (version != 1 && version != 2) {
        ct_errf(err, errlen, "%s: token shard version %u, this build reads versions 1 and 2", path, version);
        goto fail;
    }
    if (bpt != 4) {
        ct_errf(err, errlen, "%s: %u bytes per token, expected 4", path, bpt);
        goto fail;
    }
    if (version == 1 && sum != 0) {
        ct_errf(err, errlen, "%s: version 1's reserved header field is %llu, expected 0", path,
                (unsigned long long)sum);
        goto fail;
    }
    if (sum >> 32) {
        ct_errf(err, errlen, "%s: the checksum field is 0x%016llx, its high 32 bits should be 0 (the low "
                "32 are the CRC-32)", path, (unsigned long long)sum);
        goto fail;
    }
    if (n > (size - SHARD_HEADER_BYTES) / 4 || SHARD_HEADER_BYTES + 4 * n != size) {
        if (n > (UINT64_MAX - SHARD_HEADER_BYTES) / 4)
            ct_errf(err, errlen, "%s: header says %llu tokens, file has %llu bytes", path,
                    (unsigned long long)n, (unsigned long long)size);
        else
            ct_errf(err, errlen, "%s: %s: header says %llu tokens (%llu bytes), file has %llu bytes",
                    path, SHARD_HEADER_BYTES + 4 * n > size ? "truncated" : "trailing bytes",
                    (unsigned long long)n, (unsigned long long)(SHARD_HEADER_BYTES + 4 * n),
                    (unsigned long long)size);
        goto fail;
    }
    *c = (checked){.fd = fd, .version = version, .count = n, .checksum = (uint32_t)sum};
    return fd;
fail:
    close(fd);
    return -1;
}

/* Reads n bytes at the file offset off into p. */
static int read_at(const char *path, int fd, unsigned char *p, size_t n, uint64_t off, char *err,
                   size_t errlen) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ct_errf(err, errlen, "%s: read failed at byte %llu: %s", path, (unsigned long long)(off + got),
                    r < 0 ? strerror(errno) : "unexpected end of file");
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* Version 2: the tokens' CRC-32 against the header's. */
static int checksum_check(const char *path, const checked *c, uint32_t crc, char *err, size_t errlen) {
    if (c->version < 2 || crc == c->checksum) return 0;
    ct_errf(err, errlen, "%s: checksum mismatch: the header says 0x%08x, the tokens give 0x%08x; the file "
            "is corrupt", path, c->checksum, crc);
    return -1;
}

int shard_count(const char *path, uint64_t *n, char *err, size_t errlen) {
    checked c;
    if (open_checked(path, &c, err, errlen) < 0) return -1;
    close(c.fd);
    *n = c.count;
    return 0;
}

int shard_verify(const char *path, shard_info *info, char *err, size_t errlen) {
    checked c;
    if (open_checked(path, &c, err, errlen) < 0) return -1;
    unsigned char *buf = malloc(4 * BUF_TOKENS);
    uint32_t crc = (uint32_t)crc32(0, Z_NULL, 0);
    int rc = -1;
    if (!buf) {
        ct_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (uint64_t off = 0; off < 4 * c.count;) {
        size_t k = 4 * c.count - off < 4 * BUF_TOKENS ? (size_t)(4 * c.count - off) : 4 * BUF_TOKENS;
        if (read_at(path, c.fd, buf, k, SHARD_HEADER_BYTES + off, err, errlen)) goto done;
        crc = (uint32_t)crc32_z(crc, buf, k);
        off += k;
    }
    if (checksum_check(path, &c, crc, err, errlen)) goto done;
    if (info) *info = (shard_info){.version = c.version, .count = c.count, .checksum = crc};
    rc = 0;
done:
    free(buf);
    close(c.fd);
    return rc;
}

int shard_read(const char *path, uint32_t **tokens, uint64_t *n, char *err, size_t errlen) {
    *tokens = NULL;
    *n = 0;
    checked c;
    if (open_checked(path, &c, err, errlen) < 0) return -1;
    uint32_t *t = NULL;
    if (c.count > SIZE_MAX / 4) {
        ct_errf(err, errlen, "%s: %llu tokens do not fit in memory", path, (unsigned long long)c.count);
        goto fail;
    }
    if (c.count == 0) {
        /* nothing to allocate; the CRC-32 of no bytes is 0 */
        if (checksum_check(path, &c, 0, err, errlen)) goto fail;
        close(c.fd);
        return 0;
    }
    t = malloc((size_t)c.count * 4);
    if (!t) {
        ct_errf(err, errlen, "%s: out of memory for %llu tokens", path, (unsigned long long)c.count);
        goto fail;
    }
    unsigned char *p = (unsigned char *)t;
    if (read_at(path, c.fd, p, (size_t)c.count * 4, SHARD_HEADER_BYTES, err, errlen)) goto fail;
    if (checksum_check(path, &c, (uint32_t)crc32_z(0, p, (size_t)c.count * 4), err, errlen)) goto fail;
    close(c.fd);
    for (size_t i = 0; i < (size_t)c.count; i++) t[i] = get_le32(p + 4 * i);   /* no-op on LE hosts */
    *tokens = t;
    *n = c.count;
    return 0;
fail:
    free(t);
    close(c.fd);
    return -1;
}

void shard_free(uint32_t *tokens) { free(tokens); }
