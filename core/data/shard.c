/* shard.c: token shard reader and atomic writer (format in shard.h). */
#include "data/shard.h"
#include "base/error.h"
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

static void header_encode(unsigned char *h, uint32_t version, uint64_t count, uint32_t checksum) {
    memcpy(h, SHARD_MAGIC, 8);
    put_le32(h + 8, version);
    put_le32(h + 12, 4);
    put_le64(h + 16, count);
    put_le64(h + 24, checksum);   /* CRC-32 in the low half, the high half 0 */
}

/* ---- writer -------------------------------------------------------------------------------------- */

struct shard_writer {
    char *path, *tmp;
    int fd;
    uint64_t count;
    uint32_t version;      /* SHARD_VERSION, SHARD_VERSION_MASKED or SHARD_VERSION_DOCS */
    uint32_t crc;          /* CRC-32 of the token bytes written so far */
    unsigned char buf[4 * BUF_TOKENS];
    size_t nbuf;           /* bytes in buf */
};

static shard_writer *writer_open(const char *path, uint32_t version) {
    shard_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n + 5))) {
        if (w) free(w->path);
        free(w);
        ct_set_error("%s: out of memory", path);
        return NULL;
    }
    w->fd = -1;
    w->version = version;
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    char *slash = strrchr(w->tmp, '/');
    if (slash && slash != w->tmp) {   /* the folder is made, like a run's dump folder */
        *slash = 0;
        int made = ct_mkdir_p(w->tmp);
        *slash = '/';
        if (made) {
            ct_set_error("%s: cannot create its folder: %s", w->tmp, strerror(errno));
            shard_writer_abort(w);
            return NULL;
        }
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    unsigned char h[SHARD_HEADER_BYTES];
    header_encode(h, version, 0, 0);   /* the count and checksum are patched on close */
    w->crc = (uint32_t)crc32(0, Z_NULL, 0);
    if (w->fd < 0 || ct_write_all(w->fd, h, sizeof h)) {
        ct_set_error("%s: cannot create: %s", w->tmp, strerror(errno));
        shard_writer_abort(w);
        return NULL;
    }
    return w;
}

shard_writer *shard_writer_open(const char *path) { return writer_open(path, SHARD_VERSION); }
shard_writer *shard_writer_open_masked(const char *path) { return writer_open(path, SHARD_VERSION_MASKED); }
shard_writer *shard_writer_open_docs(const char *path) { return writer_open(path, SHARD_VERSION_DOCS); }

static ct_status flush_buf(shard_writer *w) {
    if (w->nbuf && ct_write_all(w->fd, w->buf, w->nbuf))
        return ct_fail(CT_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    w->crc = (uint32_t)crc32_z(w->crc, w->buf, w->nbuf);
    w->nbuf = 0;
    return CT_OK;
}

ct_status shard_writer_append(shard_writer *w, const uint32_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (w->nbuf == sizeof w->buf && flush_buf(w) != CT_OK) return CT_ERR_IO;
        put_le32(w->buf + w->nbuf, tokens[i]);
        w->nbuf += 4;
    }
    w->count += n;
    return CT_OK;
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

ct_status shard_writer_close(shard_writer *w) {
    unsigned char h[SHARD_HEADER_BYTES];
    if (flush_buf(w) != CT_OK) goto fail;
    header_encode(h, w->version, w->count, w->crc);
    if (pwrite(w->fd, h, sizeof h, 0) != (ssize_t)sizeof h || fsync(w->fd)) {
        ct_set_error("%s: write failed: %s", w->tmp, strerror(errno));
        goto fail;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) || rename(w->tmp, w->path)) {
        ct_set_error("%s: cannot finish writing: %s", w->path, strerror(errno));
        unlink(w->tmp);
        goto fail;
    }
    free(w->path);
    free(w->tmp);
    free(w);
    return CT_OK;
fail:
    shard_writer_abort(w);
    return CT_ERR_IO;
}

ct_status shard_write(const char *path, const uint32_t *tokens, uint64_t n) {
    shard_writer *w = shard_writer_open(path);
    if (!w) return CT_ERR_IO;
    ct_status st = shard_writer_append(w, tokens, (size_t)n);
    if (st != CT_OK) {
        shard_writer_abort(w);
        return st;
    }
    return shard_writer_close(w);
}

/* ---- reader -------------------------------------------------------------------------------------- */

/* An open shard whose header agrees with its size. */
typedef struct checked {
    int fd;
    uint32_t version;
    uint64_t count;
    uint32_t checksum;   /* version 2: as stored */
} checked;

/* Opens path and validates its header against its size; the open fd in c->fd. */
static ct_status open_checked(const char *path, checked *c) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ct_fail(CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    unsigned char h[SHARD_HEADER_BYTES];
    ct_status rc = CT_ERR_INVALID;
    if (fstat(fd, &st)) {
        rc = ct_fail(CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        ct_set_error("%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < SHARD_HEADER_BYTES) {
        ct_set_error("%s: %llu bytes, too short for the %d-byte token shard header", path, (unsigned long long)size,
                     SHARD_HEADER_BYTES);
        goto fail;
    }
    if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        rc = ct_fail(CT_ERR_IO, "%s: cannot read the header: %s", path, strerror(errno));
        goto fail;
    }
    if (memcmp(h, SHARD_MAGIC, 8) != 0) {
        ct_set_error("%s: bad magic (expected \"%s\"; not a token shard)", path, SHARD_MAGIC);
        goto fail;
    }
    uint32_t version = get_le32(h + 8), bpt = get_le32(h + 12);
    uint64_t n = get_le64(h + 16), sum = get_le64(h + 24);
    if (version < 1 || version > SHARD_VERSION_DOCS) {
        ct_set_error("%s: token shard version %u, this build reads versions 1, 2, 3 and 4", path, version);
        goto fail;
    }
    if (bpt != 4) {
        ct_set_error("%s: %u bytes per token, expected 4", path, bpt);
        goto fail;
    }
    if (version == 1 && sum != 0) {
        ct_set_error("%s: version 1's reserved header field is %llu, expected 0", path, (unsigned long long)sum);
        goto fail;
    }
    if (sum >> 32) {
        ct_set_error("%s: the checksum field is 0x%016llx, its high 32 bits should be 0 (the low 32 are the CRC-32)",
                     path, (unsigned long long)sum);
        goto fail;
    }
    if (n > (size - SHARD_HEADER_BYTES) / 4 || SHARD_HEADER_BYTES + 4 * n != size) {
        if (n > (UINT64_MAX - SHARD_HEADER_BYTES) / 4)
            ct_set_error("%s: header says %llu tokens, file has %llu bytes", path, (unsigned long long)n,
                         (unsigned long long)size);
        else
            ct_set_error("%s: %s: header says %llu tokens (%llu bytes), file has %llu bytes", path,
                         SHARD_HEADER_BYTES + 4 * n > size ? "truncated" : "trailing bytes", (unsigned long long)n,
                         (unsigned long long)(SHARD_HEADER_BYTES + 4 * n), (unsigned long long)size);
        goto fail;
    }
    *c = (checked){.fd = fd, .version = version, .count = n, .checksum = (uint32_t)sum};
    return CT_OK;
fail:
    close(fd);
    return rc;
}

/* Reads n bytes at the file offset off into p. */
static ct_status read_at(const char *path, int fd, unsigned char *p, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ct_fail(CT_ERR_IO, "%s: read failed at byte %llu: %s", path, (unsigned long long)(off + got),
                           r < 0 ? strerror(errno) : "unexpected end of file");
        got += (size_t)r;
    }
    return CT_OK;
}

/* Version 2 and 3: the tokens' CRC-32 against the header's. */
static ct_status checksum_check(const char *path, const checked *c, uint32_t crc) {
    if (c->version < 2 || crc == c->checksum) return CT_OK;
    return ct_fail(CT_ERR_INVALID, "%s: checksum mismatch: the header says 0x%08x, the tokens give 0x%08x; the file "
                   "is corrupt", path, c->checksum, crc);
}

/* Versions 3 and 4: some target must count (counted: whether a token after the first is unmasked). */
static ct_status mask_check(const char *path, const checked *c, int counted) {
    if (c->version < SHARD_VERSION_MASKED || counted) return CT_OK;
    return ct_fail(CT_ERR_INVALID, "%s: a masked (version %u) shard of %llu tokens whose every target is masked; "
                   "expected at least one unmasked token after the first", path, c->version, (unsigned long long)c->count);
}

/* Whether one of the n little-endian words at p, the first being word `first` of the file, is an
 * unmasked token after word 0. */
static int any_counted(const unsigned char *p, size_t n, uint64_t first) {
    for (size_t i = first ? 0 : 1; i < n; i++)
        if (!(p[4 * i + 3] & 0x80)) return 1;
    return 0;
}

ct_status shard_count(const char *path, uint64_t *n) {
    checked c;
    ct_status st = open_checked(path, &c);
    if (st != CT_OK) return st;
    close(c.fd);
    *n = c.count;
    return CT_OK;
}

ct_status shard_verify(const char *path, shard_info *info) {
    checked c;
    ct_status rc = open_checked(path, &c);
    if (rc != CT_OK) return rc;
    unsigned char *buf = malloc(4 * BUF_TOKENS);
    uint32_t crc = (uint32_t)crc32(0, Z_NULL, 0);
    int counted = 0;
    uint64_t docs = 0;
    if (!buf) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (uint64_t off = 0; off < 4 * c.count;) {
        size_t k = 4 * c.count - off < 4 * BUF_TOKENS ? (size_t)(4 * c.count - off) : 4 * BUF_TOKENS;
        if ((rc = read_at(path, c.fd, buf, k, SHARD_HEADER_BYTES + off)) != CT_OK) goto done;
        crc = (uint32_t)crc32_z(crc, buf, k);
        if (c.version >= SHARD_VERSION_MASKED && !counted) counted = any_counted(buf, k / 4, off / 4);
        if (c.version == SHARD_VERSION_DOCS)
            for (size_t i = 0; i < k / 4; i++) docs += (buf[4 * i + 3] & 0x40) != 0;
        off += k;
    }
    if ((rc = checksum_check(path, &c, crc)) != CT_OK) goto done;
    if ((rc = mask_check(path, &c, counted)) != CT_OK) goto done;
    if (info) *info = (shard_info){.version = c.version, .count = c.count, .checksum = crc, .documents = docs};
done:
    free(buf);
    close(c.fd);
    return rc;
}

ct_status shard_read(const char *path, uint32_t **tokens, uint64_t *n) {
    return shard_read_info(path, tokens, n, NULL);
}

ct_status shard_read_info(const char *path, uint32_t **tokens, uint64_t *n, shard_info *info) {
    *tokens = NULL;
    *n = 0;
    checked c;
    ct_status rc = open_checked(path, &c);
    if (rc != CT_OK) return rc;
    uint32_t *t = NULL;
    if (c.count > SIZE_MAX / 4) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: %llu tokens do not fit in memory", path, (unsigned long long)c.count);
        goto fail;
    }
    if (c.count == 0) {
        /* nothing to allocate; the CRC-32 of no bytes is 0 */
        if ((rc = checksum_check(path, &c, 0)) != CT_OK || (rc = mask_check(path, &c, 0)) != CT_OK) goto fail;
        close(c.fd);
        if (info) *info = (shard_info){.version = c.version, .count = 0, .checksum = 0};
        return CT_OK;
    }
    t = malloc((size_t)c.count * 4);
    if (!t) {
        rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory for %llu tokens", path, (unsigned long long)c.count);
        goto fail;
    }
    unsigned char *p = (unsigned char *)t;
    if ((rc = read_at(path, c.fd, p, (size_t)c.count * 4, SHARD_HEADER_BYTES)) != CT_OK) goto fail;
    uint32_t crc = (uint32_t)crc32_z(0, p, (size_t)c.count * 4);
    if ((rc = checksum_check(path, &c, crc)) != CT_OK) goto fail;
    if (c.version >= SHARD_VERSION_MASKED && (rc = mask_check(path, &c, any_counted(p, (size_t)c.count, 0))) != CT_OK)
        goto fail;
    close(c.fd);
    if (info) *info = (shard_info){.version = c.version, .count = c.count, .checksum = crc};
    for (size_t i = 0; i < (size_t)c.count; i++) t[i] = get_le32(p + 4 * i);   /* no-op on LE hosts */
    *tokens = t;
    *n = c.count;
    return CT_OK;
fail:
    free(t);
    close(c.fd);
    return rc;
}

void shard_free(uint32_t *tokens) { free(tokens); }
