/* instream.c: plain, gzip and zstd input through one fixed buffer (see instream.h). */
#include "io/instream.h"
#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#define RAW_BYTES (1 << 17)   /* compressed (or plain) bytes read from the file at a time */

struct instream {
    char *name;
    int fd, own_fd;
    instream_format format;
    int64_t size;             /* -1: a pipe or a terminal */
    uint64_t offset;          /* bytes read from fd */
    unsigned char *raw;       /* RAW_BYTES; raw[pos, len) is read but not yet consumed */
    size_t pos, len;
    int eof, bad;
    /* a gzip member or a zstd frame is open: the input may not end here */
    int in_unit;
    uint64_t units;           /* members or frames begun */
    z_stream z;
    int z_ready;
    ZSTD_DStream *zs;
};

static uint64_t consumed(const instream *s) { return s->offset - (s->len - s->pos); }

/* Refills raw once raw[pos, len) is used up; sets eof at the end. */
static ct_status fill(instream *s) {
    if (s->pos < s->len || s->eof) return CT_OK;
    ssize_t r;
    do r = read(s->fd, s->raw, RAW_BYTES);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
        s->bad = 0;
        return ct_fail(CT_ERR_IO, "%s: read error at byte %llu: %s", s->name, (unsigned long long)s->offset,
                       strerror(errno));
    }
    s->pos = 0;
    s->len = (size_t)r;
    s->offset += (uint64_t)r;
    s->eof = r == 0;
    return CT_OK;
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* The format from the first bytes (raw holds up to 6 of them, fewer only at the end of the input);
 * what the name promises must match. */
static ct_status detect(instream *s) {
    const unsigned char *b = s->raw;
    size_t n = s->len;
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) s->format = INSTREAM_GZIP;
    else if (n >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) s->format = INSTREAM_ZSTD;
    else s->format = INSTREAM_PLAIN;
    s->bad = 1;
    if (n >= 6 && memcmp(b, "\xfd" "7zXZ\0", 6) == 0)
        return ct_fail(CT_ERR_INVALID, "%s: xz-compressed data is not read (gzip and zstd are): pipe it in, xz -dc "
                       "FILE | ctitan tokenize --input - ...", s->name);
    if (n >= 4 && memcmp(b, "BZh", 3) == 0 && b[3] >= '1' && b[3] <= '9')
        return ct_fail(CT_ERR_INVALID, "%s: bzip2-compressed data is not read (gzip and zstd are): pipe it in, bzip2 "
                       "-dc FILE | ctitan tokenize --input - ...", s->name);
    if (ends_with(s->name, ".gz") && s->format != INSTREAM_GZIP)
        return ct_fail(CT_ERR_INVALID, "%s: the name ends in .gz but the data is not gzip (%s; gzip starts with the "
                       "bytes 1f 8b)", s->name, n ? "it starts otherwise" : "the file is empty");
    if ((ends_with(s->name, ".zst") || ends_with(s->name, ".zstd")) && s->format != INSTREAM_ZSTD)
        return ct_fail(CT_ERR_INVALID, "%s: the name ends in .zst but the data is not zstd (%s; zstd starts with the "
                       "bytes 28 b5 2f fd)", s->name, n ? "it starts otherwise" : "the file is empty");
    s->bad = 0;
    if (s->format == INSTREAM_GZIP) {
        if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK)   /* 16 +: a gzip header and trailer */
            return ct_fail(CT_ERR_NOMEM, "%s: cannot start the gzip decoder (out of memory)", s->name);
        s->z_ready = 1;
    } else if (s->format == INSTREAM_ZSTD) {
        if (!(s->zs = ZSTD_createDStream()) || ZSTD_isError(ZSTD_initDStream(s->zs)))
            return ct_fail(CT_ERR_NOMEM, "%s: cannot start the zstd decoder (out of memory)", s->name);
    }
    return CT_OK;
}

instream *instream_open(const char *path, int *bad_input) {
    int stdin_ = strcmp(path, "-") == 0;
    instream *s = calloc(1, sizeof *s);
    if (bad_input) *bad_input = 0;
    if (!s || !(s->name = strdup(stdin_ ? "standard input" : path)) || !(s->raw = malloc(RAW_BYTES))) {
        ct_set_error("%s: out of memory", path);
        instream_close(s);
        return NULL;
    }
    s->fd = stdin_ ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    s->own_fd = !stdin_;
    struct stat st;
    if (s->fd < 0 || fstat(s->fd, &st)) {
        ct_set_error("%s: cannot open: %s", s->name, strerror(errno));
        s->bad = errno != ENOMEM && errno != EMFILE && errno != ENFILE;
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        ct_set_error("%s: a folder, not a file of documents", s->name);
        s->bad = 1;
        goto fail;
    }
    s->size = S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
    /* A pipe may deliver the magic bytes a few at a time. */
    while (s->len < 6 && !s->eof) {
        ssize_t r = read(s->fd, s->raw + s->len, RAW_BYTES - s->len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ct_set_error("%s: read error: %s", s->name, strerror(errno));
            goto fail;
        }
        s->len += (size_t)r;
        s->offset += (uint64_t)r;
        s->eof = r == 0;
    }
    if (detect(s) != CT_OK) goto fail;
    return s;
fail:
    if (bad_input) *bad_input = s->bad;
    instream_close(s);
    return NULL;
}

static ct_status read_plain(instream *s, void *buf, size_t cap, size_t *got) {
    ct_status st = fill(s);
    if (st != CT_OK) return st;
    size_t k = s->len - s->pos < cap ? s->len - s->pos : cap;
    memcpy(buf, s->raw + s->pos, k);
    s->pos += k;
    *got = k;
    return CT_OK;
}

static ct_status read_gzip(instream *s, void *buf, size_t cap, size_t *got_out) {
    for (;;) {
        ct_status st = fill(s);
        if (st != CT_OK) return st;
        if (s->pos == s->len && !s->in_unit) return CT_OK;   /* the end, between members */
        if (!s->in_unit) {
            s->in_unit = 1;
            s->units++;
        }
        s->z.next_in = s->raw + s->pos;
        s->z.avail_in = (uInt)(s->len - s->pos);
        s->z.next_out = buf;
        s->z.avail_out = (uInt)cap;
        int r = inflate(&s->z, Z_NO_FLUSH);
        s->pos = s->len - s->z.avail_in;
        size_t got = cap - s->z.avail_out;
        if (r == Z_STREAM_END) {
            inflateReset(&s->z);
            s->in_unit = 0;
        } else if (r == Z_MEM_ERROR) {
            return ct_fail(CT_ERR_NOMEM, "%s: out of memory in the gzip decoder", s->name);
        } else if (r != Z_OK && r != Z_BUF_ERROR) {
            s->bad = 1;
            if (s->units > 1 && s->z.total_in <= 2)
                return ct_fail(CT_ERR_INVALID, "%s: the bytes after gzip member %llu (from compressed byte %llu) "
                               "are not gzip data", s->name, (unsigned long long)(s->units - 1),
                               (unsigned long long)(consumed(s) - s->z.total_in));
            return ct_fail(CT_ERR_INVALID, "%s: corrupt gzip data in member %llu near compressed byte %llu: %s",
                           s->name, (unsigned long long)s->units, (unsigned long long)consumed(s),
                           r == Z_NEED_DICT ? "it needs a preset dictionary" : s->z.msg ? s->z.msg : "invalid data");
        }
        if (got) {
            *got_out = got;
            return CT_OK;
        }
        if (s->eof && s->pos == s->len && s->in_unit) {
            s->bad = 1;
            return ct_fail(CT_ERR_INVALID, "%s: truncated gzip data: the input ends inside member %llu (at "
                           "compressed byte %llu)", s->name, (unsigned long long)s->units,
                           (unsigned long long)s->offset);
        }
    }
}

static ct_status read_zstd(instream *s, void *buf, size_t cap, size_t *got) {
    for (;;) {
        ct_status st = fill(s);
        if (st != CT_OK) return st;
        if (s->pos == s->len && !s->in_unit) return CT_OK;   /* the end, between frames */
        if (!s->in_unit) {
            s->in_unit = 1;
            s->units++;
        }
        ZSTD_inBuffer in = {s->raw, s->len, s->pos};
        ZSTD_outBuffer out = {buf, cap, 0};
        size_t r = ZSTD_decompressStream(s->zs, &out, &in);
        s->pos = in.pos;
        if (ZSTD_isError(r)) {
            s->bad = ZSTD_getErrorCode(r) != ZSTD_error_memory_allocation;
            /* zstd buffers its input, so the place is known only to within what was read */
            return ct_fail(s->bad ? CT_ERR_INVALID : CT_ERR_NOMEM, "%s: corrupt zstd data in frame %llu (within "
                           "the first %llu compressed bytes): %s", s->name, (unsigned long long)s->units,
                           (unsigned long long)s->offset, ZSTD_getErrorName(r));
        }
        if (r == 0) s->in_unit = 0;   /* a frame is decoded and flushed */
        if (out.pos) {
            *got = out.pos;
            return CT_OK;
        }
        if (s->eof && s->pos == s->len && s->in_unit) {
            s->bad = 1;
            return ct_fail(CT_ERR_INVALID, "%s: truncated zstd data: the input ends inside frame %llu (at "
                           "compressed byte %llu)", s->name, (unsigned long long)s->units,
                           (unsigned long long)s->offset);
        }
    }
}

ct_status instream_read(instream *s, void *buf, size_t cap, size_t *got) {
    *got = 0;
    if (cap > (1u << 30)) cap = 1u << 30;   /* zlib counts in uInt */
    if (cap == 0) return CT_OK;
    s->bad = 0;
    switch (s->format) {
    case INSTREAM_GZIP: return read_gzip(s, buf, cap, got);
    case INSTREAM_ZSTD: return read_zstd(s, buf, cap, got);
    default: return read_plain(s, buf, cap, got);
    }
}

const char *instream_name(const instream *s) { return s->name; }
uint64_t instream_offset(const instream *s) { return consumed(s); }
int64_t instream_size(const instream *s) { return s->size; }
int instream_bad_input(const instream *s) { return s->bad; }

void instream_close(instream *s) {
    if (!s) return;
    if (s->own_fd && s->fd >= 0) close(s->fd);
    if (s->z_ready) inflateEnd(&s->z);
    ZSTD_freeDStream(s->zs);
    free(s->raw);
    free(s->name);
    free(s);
}
