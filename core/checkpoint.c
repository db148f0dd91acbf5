/* checkpoint.c: save and load distributed checkpoints with resharding (see checkpoint.h). */
#include "checkpoint.h"

#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_VERSION 1

typedef struct box {
    int ndim;
    int64_t off[CT_MAX_DIMS], len[CT_MAX_DIMS];
} box;

static int64_t box_numel(const box *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= b->len[d];
    return n;
}

/* The part of the global tensor this rank's storage holds (padding excluded): its tensor-parallel
 * block (a slice along tp_dim), then within it the dim-0 rows of the data-parallel shard (FSDP
 * shards the flattened tp-local block by whole rows); replicated parameters are whole. */
static void local_box(const ct_param_slot *sl, box *b) {
    const ct_tensor *p = sl->param; /* the tp-local block's shape */
    b->ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++) {
        b->off[d] = 0;
        b->len[d] = p->shape[d];
    }
    if (sl->tp_dim >= 0) b->off[sl->tp_dim] = (int64_t)sl->tp_index * p->shape[sl->tp_dim];
    if (sl->placement == CT_PLACE_NONE && p->ndim > 0) b->len[0] = 0; /* another pipeline stage writes it */
    if (sl->placement != CT_PLACE_SHARD || p->ndim == 0) return;
    int64_t rows = p->shape[0], row = rows ? sl->numel / rows : 1;
    int64_t start = row ? sl->offset / row : 0, n = row ? sl->local_numel / row : 0;
    if (start > rows) start = rows;
    if (start + n > rows) n = rows - start;
    b->off[0] += start;
    b->len[0] = n;
}

/* Whether this rank writes slot i: one copy of every element in the job. */
static int saves(const session *s, const ct_param_slot *sl) {
    if (!s->capi) return 1;
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        if (sl->placement == CT_PLACE_SHARD && a == sl->shard_axis) continue;
        if (sl->tp_dim >= 0 && a == CT_AXIS_TP) continue;
        if (a == CT_AXIS_PP) continue; /* each stage writes its own units (the others hold none here) */
        if (s->mesh.coord[a] != 0) return 0;
    }
    return 1;
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static int barrier(session *s) {
    if (!s->capi) return 0;
    void *world;
    s->capi->world(s->comm, &world);
    return s->capi->barrier(s->comm, world) == CT_OK ? 0 : -1;
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int write_file_synced(const char *path, const char *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0) return -1;
    int rc = ct_write_all(fd, data, n) || fsync(fd);
    rc |= close(fd);
    return rc ? -1 : 0;
}

static int rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= (int)sizeof p) continue;
        rm_rf(p);
    }
    closedir(d);
    return rmdir(path);
}

/* ---- save ---- */

/* The device memory of tensor `k` of slot i: -1 = the parameter, else optimizer state k. */
static const float *storage(session *s, int i, int k) {
    const ct_param_slot *sl = &s->rt.slots[i];
    if (k < 0) return sl->local_data;
    size_t off = (size_t)((const char *)sl->local_data - s->rt.param_mem);
    return (const float *)(s->opt_mem + (size_t)k * s->rt.param_bytes + off);
}

static void tensor_name(char *buf, size_t len, const char *fqn, int k) {
    if (k < 0) snprintf(buf, len, "%s", fqn);
    else snprintf(buf, len, "optimizer.%d.%s", k, fqn);
}

static json_t *box_json(const int64_t *v, int n) {
    json_t *a = json_array();
    for (int d = 0; d < n; d++) json_array_append_new(a, json_integer(v[d]));
    return a;
}

/* This rank's pieces, copied to host memory: what a save writes (possibly on another thread). */
typedef struct snap_piece {
    char name[512];
    box b;
    float *data;
    int64_t n;
} snap_piece;

struct ckpt_snapshot {
    snap_piece *p;
    int n;
    int rank;
};

void ckpt_snapshot_free(ckpt_snapshot *sn) {
    if (!sn) return;
    for (int i = 0; i < sn->n; i++) free(sn->p[i].data);
    free(sn->p);
    free(sn);
}

ckpt_snapshot *ckpt_snapshot_take(session *s, int what, int export_bf16, char *err, size_t errlen) {
    ckpt_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) goto nomem;
    sn->rank = s->rank;
    int kmax = (what & CKPT_OPTIMIZER) ? s->n_state : 0;
    sn->p = calloc((size_t)s->rt.n_params * (size_t)(kmax + 1) + 1, sizeof(snap_piece));
    if (!sn->p) goto nomem;
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_param_slot *sl = &s->rt.slots[i];
        if (!saves(s, sl)) continue;
        box b;
        local_box(sl, &b);
        int64_t n = box_numel(&b);
        if (n <= 0) continue;
        for (int k = (what & CKPT_MODEL) ? -1 : 0; k < kmax; k++) {
            snap_piece *p = &sn->p[sn->n];
            p->data = malloc(sizeof(float) * (size_t)n);
            if (!p->data) goto nomem;
            sn->n++;
            p->b = b;
            p->n = n;
            tensor_name(p->name, sizeof p->name, sl->param->name, k);
            /* the box is a prefix of the local storage: dim-0 rows, padding after */
            if (s->d->copy(s->dev, p->data, storage(s, i, k), sizeof(float) * (size_t)n, CT_COPY_D2H) != CT_OK) {
                ct_errf(err, errlen, "checkpoint: cannot copy %s from the device", sl->param->name);
                ckpt_snapshot_free(sn);
                return NULL;
            }
            if (export_bf16 && k < 0)
                for (int64_t j = 0; j < n; j++) { /* round to nearest even, kept as f32 */
                    uint32_t u;
                    memcpy(&u, &p->data[j], 4);
                    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
                    memcpy(&p->data[j], &u, 4);
                }
        }
    }
    return sn;
nomem:
    ct_errf(err, errlen, "checkpoint: out of memory for the snapshot");
    ckpt_snapshot_free(sn);
    return NULL;
}

/* Writes a snapshot's pieces and their index into dir (no collective: any thread). */
int ckpt_snapshot_write(const ckpt_snapshot *sn, const char *dir, char *err, size_t errlen) {
    char path[PATH_MAX], fname[64];
    snprintf(fname, sizeof fname, "rank-%05d.bin", sn->rank);
    if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path) {
        ct_errf(err, errlen, "checkpoint folder path too long");
        return -1;
    }
    int fd = -1, rc = -1;
    json_t *index = json_array();
    int64_t file_off = 0;
    for (int i = 0; i < sn->n; i++) {
        const snap_piece *p = &sn->p[i];
        if (fd < 0 && (fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644)) < 0) {
            ct_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
            goto done;
        }
        size_t bytes = sizeof(float) * (size_t)p->n;
        if (ct_write_all(fd, p->data, bytes)) {
            ct_errf(err, errlen, "%s: write failed: %s", path, strerror(errno));
            goto done;
        }
        json_t *e = json_object();
        json_object_set_new(e, "tensor", json_string(p->name));
        json_object_set_new(e, "offsets", box_json(p->b.off, p->b.ndim));
        json_object_set_new(e, "sizes", box_json(p->b.len, p->b.ndim));
        json_object_set_new(e, "file", json_string(fname));
        json_object_set_new(e, "byte_offset", json_integer(file_off));
        json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
        char sum[32];
        snprintf(sum, sizeof sum, "%016" PRIx64, fnv1a(p->data, bytes, 1469598103934665603ull));
        json_object_set_new(e, "fnv1a64", json_string(sum));
        json_array_append_new(index, e);
        file_off += (int64_t)bytes;
    }
    if (fd >= 0) {
        int bad = fsync(fd) != 0;
        bad |= close(fd) != 0;
        fd = -1;
        if (bad) {
            ct_errf(err, errlen, "%s: cannot sync: %s", path, strerror(errno));
            goto done;
        }
    }
    char *text = json_dumps(index, JSON_COMPACT);
    if (!text || snprintf(path, sizeof path, "%s/rank-%05d.json", dir, sn->rank) >= (int)sizeof path ||
        write_file_synced(path, text, strlen(text))) {
        free(text);
        ct_errf(err, errlen, "%s: cannot write the index", path);
        goto done;
    }
    free(text);
    rc = 0;
done:
    if (fd >= 0) close(fd);
    json_decref(index);
    return rc;
}

/* Rank 0: merges the rank indexes into metadata.json (the last file written). */
static int write_metadata(session *s, const char *dir, int64_t step, const ckpt_train_state *st, char *err,
                          size_t errlen) {
    json_t *root = json_object(), *shards = json_array(), *tensors = json_object();
    int rc = -1;
    json_object_set_new(root, "format", json_string("ctitan-checkpoint"));
    json_object_set_new(root, "version", json_integer(CKPT_VERSION));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "world_size", json_integer(s->world));
    for (int r = 0; r < s->world; r++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/rank-%05d.json", dir, r) >= (int)sizeof path) goto done;
        json_error_t je;
        json_t *idx = json_load_file(path, 0, &je);
        if (!idx || !json_is_array(idx)) {
            json_decref(idx);
            ct_errf(err, errlen, "%s: missing or unreadable rank index", path);
            goto done;
        }
        size_t i;
        json_t *e;
        json_array_foreach(idx, i, e) json_array_append(shards, e);
        json_decref(idx);
    }
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = s->rt.slots[i].param;
        for (int k = -1; k < s->n_state; k++) {
            char name[512];
            tensor_name(name, sizeof name, p->name, k);
            int present = 0; /* list the tensors this save holds (a model-only save has no optimizer) */
            size_t j;
            json_t *e;
            json_array_foreach(shards, j, e) if (!strcmp(json_string_value(json_object_get(e, "tensor")), name)) {
                present = 1;
                break;
            }
            if (!present) continue;
            json_t *t = json_object();
            json_object_set_new(t, "dtype", json_string("f32"));
            json_object_set_new(t, "shape", box_json(s->rt.slots[i].global_shape, p->ndim));
            json_object_set_new(tensors, name, t);
        }
    }
    json_object_set_new(root, "tensors", tensors);
    tensors = NULL;
    json_object_set_new(root, "shards", shards);
    shards = NULL;
    if (st) {
        json_t *t = json_object();
        json_object_set_new(t, "step", json_integer(st->step));
        json_object_set_new(t, "tokens_seen", json_integer(st->tokens_seen));
        json_object_set_new(t, "data_position", json_integer(st->data_position));
        json_object_set_new(t, "seed", json_integer(st->seed));
        json_object_set_new(t, "dp_size", json_integer(st->dp_size));
        json_object_set_new(root, "train_state", t);
    }
    char *text = json_dumps(root, JSON_INDENT(1));
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    int long_path = snprintf(path, sizeof path, "%s/metadata.json", dir) >= (int)sizeof path;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!text || long_path || write_file_synced(tmp, text, strlen(text)) || rename(tmp, path) || fsync_path(dir)) {
        free(text);
        ct_errf(err, errlen, "%s: cannot write the metadata", path);
        goto done;
    }
    free(text);
    rc = 0;
done:
    json_decref(shards);
    json_decref(tensors);
    json_decref(root);
    return rc;
}

int ckpt_prepare(session *s, const char *folder, int64_t step, char *err, size_t errlen) {
    char tmpdir[PATH_MAX];
    snprintf(tmpdir, sizeof tmpdir, "%s/step-%" PRId64 ".tmp", folder, step);
    int bad = 0;
    if (s->rank == 0) {
        rm_rf(tmpdir);
        bad = ct_mkdir_p(tmpdir) != 0;
        if (bad) ct_errf(err, errlen, "%s: cannot create: %s", tmpdir, strerror(errno));
    }
    if (barrier(s)) {
        ct_errf(err, errlen, "checkpoint %s: a rank did not reach the save barrier: %s", tmpdir, ct_last_error());
        return -1;
    }
    return bad ? -1 : 0;
}

int ckpt_commit(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int wrote_ok, char *err,
                size_t errlen) {
    char dir[PATH_MAX], tmpdir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/step-%" PRId64, folder, step);
    snprintf(tmpdir, sizeof tmpdir, "%s.tmp", dir);
    /* every rank says whether its files are written; the folder is committed only if all are */
    double ok = wrote_ok ? 1 : 0;
    if (s->capi) {
        void *world;
        s->capi->world(s->comm, &world);
        if (s->capi->all_reduce(s->comm, world, &ok, &ok, 1, CT_F64, CT_REDUCE_MIN, NULL) != CT_OK) {
            ct_errf(err, errlen, "checkpoint %s: a rank did not reach the commit: %s", dir, ct_last_error());
            return -1;
        }
    }
    int bad = ok < 1;
    if (bad && wrote_ok) ct_errf(err, errlen, "checkpoint %s: another rank failed to write its files", dir);
    if (s->rank == 0 && !bad) {
        bad = write_metadata(s, tmpdir, step, st, err, errlen) != 0;
        if (!bad) {
            rm_rf(dir); /* an older complete save of the same step (a rerun) */
            bad = rename(tmpdir, dir) != 0 || fsync_path(folder) != 0;
            if (bad) ct_errf(err, errlen, "%s: cannot commit: %s", dir, strerror(errno));
        }
    }
    if (barrier(s)) {
        ct_errf(err, errlen, "checkpoint %s: a rank did not reach the save barrier: %s", dir, ct_last_error());
        return -1;
    }
    return bad ? -1 : 0;
}

int ckpt_save(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int what, int export_bf16,
              char *err, size_t errlen) {
    char tmpdir[PATH_MAX];
    snprintf(tmpdir, sizeof tmpdir, "%s/step-%" PRId64 ".tmp", folder, step);
    if (ckpt_prepare(s, folder, step, err, errlen)) return -1;
    ckpt_snapshot *sn = ckpt_snapshot_take(s, what, export_bf16, err, errlen);
    int ok = sn && ckpt_snapshot_write(sn, tmpdir, err, errlen) == 0;
    ckpt_snapshot_free(sn);
    return ckpt_commit(s, folder, step, st, ok, err, errlen);
}

static int64_t step_of(const char *name, int *tmp) {
    if (strncmp(name, "step-", 5)) return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    if (end == name + 5 || v < 0) return -1;
    *tmp = strcmp(end, ".tmp") == 0;
    return *end && !*tmp ? -1 : v;
}

int64_t ckpt_latest(const char *folder, int clean) {
    DIR *d = opendir(folder);
    if (!d) return -1;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp = 0;
        int64_t v = step_of(e->d_name, &tmp);
        if (v < 0) continue;
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", folder, e->d_name) >= (int)sizeof p) continue;
        if (tmp) {
            if (clean) rm_rf(p); /* an interrupted save */
            continue;
        }
        char meta[PATH_MAX + 16];
        snprintf(meta, sizeof meta, "%s/metadata.json", p);
        if (access(meta, R_OK) == 0 && v > best) best = v;
    }
    closedir(d);
    return best;
}

void ckpt_purge(const char *folder, int64_t keep) {
    if (keep <= 0) return;
    for (;;) {
        DIR *d = opendir(folder);
        if (!d) return;
        int64_t count = 0, oldest = -1;
        struct dirent *e;
        while ((e = readdir(d))) {
            int tmp = 0;
            int64_t v = step_of(e->d_name, &tmp);
            if (v < 0 || tmp) continue;
            count++;
            if (oldest < 0 || v < oldest) oldest = v;
        }
        closedir(d);
        if (count <= keep) return;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/step-%" PRId64, folder, oldest);
        if (rm_rf(p)) return;
    }
}

/* ---- load ---- */

typedef struct piece {
    const char *tensor, *file;
    box b;
    int64_t byte_offset, bytes;
    uint64_t sum;
    int verified;
} piece;

/* A list of at most CT_MAX_DIMS non-negative integers whose product stays below 2^48. */
static int parse_box(json_t *a, int64_t *v, int *n) {
    if (!json_is_array(a) || json_array_size(a) > CT_MAX_DIMS) return -1;
    *n = (int)json_array_size(a);
    for (int d = 0; d < *n; d++) {
        json_t *x = json_array_get(a, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((int64_t)1 << 48)) return -1;
        v[d] = json_integer_value(x);
    }
    return 0;
}

static int box_numel_ok(const box *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) {
        if (b->len[d] && n > ((int64_t)1 << 48) / b->len[d]) return 0;
        n *= b->len[d];
    }
    return 1;
}

/* Validates metadata.json's structure and every piece against its tensor's shape. */
static int parse_pieces(json_t *root, const char *path, piece **out, size_t *count, char *err, size_t errlen) {
    json_t *ver = json_object_get(root, "version"), *shards = json_object_get(root, "shards");
    json_t *tensors = json_object_get(root, "tensors"), *ts = json_object_get(root, "train_state");
    *out = NULL;
    *count = 0;
    if (!json_is_object(root) || !json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION ||
        !json_is_array(shards) || !json_is_object(tensors) || (ts && !json_is_object(ts))) {
        ct_errf(err, errlen, "%s: not a ctitan checkpoint of version %d", path, CKPT_VERSION);
        return -1;
    }
    if (ts) {
        static const char *keys[] = {"step", "tokens_seen", "data_position", "seed", "dp_size"};
        for (size_t k = 0; k < 5; k++) {
            json_t *v = json_object_get(ts, keys[k]);
            if (!json_is_integer(v) || (k != 3 && json_integer_value(v) < 0)) {
                ct_errf(err, errlen, "%s: train_state.%s must be a non-negative integer", path, keys[k]);
                return -1;
            }
        }
    }
    size_t np = json_array_size(shards);
    piece *pieces = calloc(np + 1, sizeof *pieces);
    if (!pieces) {
        ct_errf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < np; i++) {
        json_t *e = json_array_get(shards, i);
        piece *p = &pieces[i];
        int n1 = 0, n2 = 0, ns = 0;
        int64_t shape[CT_MAX_DIMS];
        json_t *t = json_object_get(e, "tensor"), *f = json_object_get(e, "file"), *sum = json_object_get(e, "fnv1a64");
        json_t *bo = json_object_get(e, "byte_offset"), *by = json_object_get(e, "bytes");
        json_t *tt = json_is_string(t) ? json_object_get(tensors, json_string_value(t)) : NULL;
        int ok = json_is_object(e) && json_is_string(t) && json_is_string(f) && json_is_string(sum) &&
                 json_is_integer(bo) && json_is_integer(by) && json_is_object(tt) &&
                 !parse_box(json_object_get(tt, "shape"), shape, &ns) &&
                 !parse_box(json_object_get(e, "offsets"), p->b.off, &n1) &&
                 !parse_box(json_object_get(e, "sizes"), p->b.len, &n2) && n1 == n2 && n1 == ns &&
                 !strchr(json_string_value(f), '/') && strcmp(json_string_value(f), "..") &&
                 json_integer_value(bo) >= 0 && json_integer_value(bo) < ((int64_t)1 << 50);
        if (ok) {
            p->b.ndim = n1;
            ok = box_numel_ok(&p->b) && json_integer_value(by) == (json_int_t)(box_numel(&p->b) * 4);
            for (int d = 0; ok && d < n1; d++) ok = p->b.off[d] + p->b.len[d] <= shape[d];
        }
        if (!ok) {
            ct_errf(err, errlen, "%s: shard %zu is malformed (tensor, file, offsets/sizes within the shape, bytes, "
                                 "fnv1a64 expected)", path, i);
            free(pieces);
            return -1;
        }
        p->tensor = json_string_value(t);
        p->file = json_string_value(f);
        p->byte_offset = json_integer_value(bo);
        p->bytes = json_integer_value(by);
        p->sum = strtoull(json_string_value(sum), NULL, 16);
    }
    *out = pieces;
    *count = np;
    return 0;
}

int ckpt_check_metadata(const char *text, size_t len, const char *label, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) {
        ct_errf(err, errlen, "%s:%d: not JSON (%s)", label, je.line, je.text);
        return -1;
    }
    piece *pieces;
    size_t n;
    int rc = parse_pieces(root, label, &pieces, &n, err, errlen);
    if (!rc) free(pieces);
    json_decref(root);
    return rc;
}

/* Copies the intersection of piece p (data src, laid out as p->b) into dst (laid out as want). */
static int64_t copy_intersection(const piece *p, const float *src, const box *want, float *dst) {
    box x;
    x.ndim = want->ndim;
    for (int d = 0; d < want->ndim; d++) {
        int64_t lo = p->b.off[d] > want->off[d] ? p->b.off[d] : want->off[d];
        int64_t hi_p = p->b.off[d] + p->b.len[d], hi_w = want->off[d] + want->len[d];
        int64_t hi = hi_p < hi_w ? hi_p : hi_w;
        if (hi <= lo) return 0;
        x.off[d] = lo;
        x.len[d] = hi - lo;
    }
    int64_t n = box_numel(&x);
    int64_t inner = want->ndim ? x.len[want->ndim - 1] : 1, rows = inner ? n / inner : 0;
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t r = 0; r < rows; r++) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < want->ndim; d++) {
            int64_t g = x.off[d] + idx[d];
            so = so * p->b.len[d] + (g - p->b.off[d]);
            dof = dof * want->len[d] + (g - want->off[d]);
        }
        memcpy(dst + dof, src + so, sizeof(float) * (size_t)inner);
        for (int d = want->ndim - 2; d >= 0; d--) { /* next row of the intersection */
            if (++idx[d] < x.len[d]) break;
            idx[d] = 0;
        }
    }
    return n;
}

int ckpt_load(session *s, const char *step_dir, int what, ckpt_train_state *st, int *has_state, char *err,
              size_t errlen) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/metadata.json", step_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    piece *pieces = NULL;
    float *buf = NULL, *local = NULL;
    int rc = -1;
    *has_state = 0;
    if (!root) {
        ct_errf(err, errlen, "%s:%d: not a checkpoint (%s)", path, je.line, je.text);
        return -1;
    }
    json_t *tensors = json_object_get(root, "tensors");
    size_t np = 0;
    if (parse_pieces(root, path, &pieces, &np, err, errlen)) goto done;
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_param_slot *sl = &s->rt.slots[i];
        box want;
        local_box(sl, &want);
        int64_t n = box_numel(&want);
        float *grown = realloc(local, sizeof(float) * (size_t)(sl->local_numel > 0 ? sl->local_numel : 1));
        if (!grown) goto done;
        local = grown;
        for (int k = (what & CKPT_MODEL) ? -1 : 0; k < ((what & CKPT_OPTIMIZER) ? s->n_state : 0); k++) {
            char name[512];
            tensor_name(name, sizeof name, sl->param->name, k);
            json_t *t = json_object_get(tensors, name);
            int64_t shape[CT_MAX_DIMS];
            int nd = 0;
            if (!t || parse_box(json_object_get(t, "shape"), shape, &nd) || nd != sl->param->ndim ||
                memcmp(shape, sl->global_shape, sizeof(int64_t) * (size_t)nd)) {
                ct_errf(err, errlen, "%s: %s is missing or has another shape than the model's", path, name);
                goto done;
            }
            memset(local, 0, sizeof(float) * (size_t)sl->local_numel);
            int64_t covered = 0;
            for (size_t j = 0; j < np && n > 0; j++) {
                piece *p = &pieces[j];
                if (strcmp(p->tensor, name) || p->b.ndim != want.ndim) continue;
                float *g = realloc(buf, (size_t)p->bytes + 4);
                if (!g) goto done;
                buf = g;
                char fpath[PATH_MAX];
                snprintf(fpath, sizeof fpath, "%s/%s", step_dir, p->file);
                int fd = open(fpath, O_RDONLY);
                ssize_t got = fd >= 0 ? pread(fd, buf, (size_t)p->bytes, p->byte_offset) : -1;
                if (fd >= 0) close(fd);
                if (got != p->bytes) {
                    ct_errf(err, errlen, "%s: %s is truncated or missing (needed %" PRId64 " bytes at %" PRId64 ")",
                            fpath, name, p->bytes, p->byte_offset);
                    goto done;
                }
                if (fnv1a(buf, (size_t)p->bytes, 1469598103934665603ull) != p->sum) {
                    ct_errf(err, errlen, "%s: checksum mismatch in %s: the checkpoint is corrupt", fpath, name);
                    goto done;
                }
                covered += copy_intersection(p, buf, &want, local);
            }
            if (covered != n) {
                ct_errf(err, errlen, "%s: the pieces of %s cover %" PRId64 " of the %" PRId64 " elements this rank needs",
                        path, name, covered, n);
                goto done;
            }
            float *dst = (float *)storage(s, i, k);
            if (s->d->copy(s->dev, dst, local, sizeof(float) * (size_t)sl->local_numel, CT_COPY_H2D) != CT_OK) {
                ct_errf(err, errlen, "checkpoint: cannot copy %s to the device", name);
                goto done;
            }
        }
    }
    json_t *ts = json_object_get(root, "train_state");
    if (st && json_is_object(ts)) {
        st->step = json_integer_value(json_object_get(ts, "step"));
        st->tokens_seen = json_integer_value(json_object_get(ts, "tokens_seen"));
        st->data_position = json_integer_value(json_object_get(ts, "data_position"));
        st->seed = json_integer_value(json_object_get(ts, "seed"));
        st->dp_size = json_integer_value(json_object_get(ts, "dp_size"));
        *has_state = 1;
    }
    rc = 0;
done:
    if (rc && !err[0]) ct_errf(err, errlen, "%s: out of memory", path);
    free(pieces);
    free(buf);
    free(local);
    json_decref(root);
    return rc;
}
