/* checkpoint.c: save and load distributed checkpoints with resharding (see checkpoint.h). */
#include "checkpoint/checkpoint.h"
#include "checkpoint/model_desc.h"
#include "engine/mesh.h"

#include "io/tensorfile.h"
#include "base/error.h"
#include "base/util.h"

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
/* Largest world_size, step and token counts a checkpoint may claim: far beyond any real run, far
 * below where the loop's int64 arithmetic (position + batch, tokens + batch x seq_len) overflows. */
#define CKPT_MAX_WORLD (1 << 20)
#define CKPT_MAX_COUNT ((int64_t)1 << 50)

typedef struct box {
    int ndim;
    int64_t off[CT_MAX_DIMS], len[CT_MAX_DIMS];
} box;

static int64_t box_numel(const box *b) {
    int64_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= b->len[d];
    return n;
}

/* The part of the global tensor this rank's storage holds (padding excluded): the block an axis
 * strategy split it into (a slice along split_dim), then within it the dim-0 rows of the
 * data-parallel shard (FSDP shards the flattened block by whole rows); replicated parameters are whole. */
static void local_box(const ct_param_slot *sl, box *b) {
    const ct_tensor *p = sl->param; /* the block's shape */
    b->ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++) {
        b->off[d] = 0;
        b->len[d] = p->shape[d];
    }
    if (sl->split_dim >= 0) b->off[sl->split_dim] = (int64_t)sl->split_index * p->shape[sl->split_dim];
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
    if (sl->copy_of >= 0) return 0; /* a shared parameter's other use: saved once, as the declared one */
    if (!s->capi) return 1;
    for (int a = 0; a < CT_MESH_NAXES; a++) {
        if (sl->placement == CT_PLACE_SHARD && (mesh_axis_bits(sl->shard_axis) & 1u << a)) continue;
        if (sl->split_dim >= 0 && (mesh_axis_bits(sl->split_axis) & 1u << a)) continue;
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
    ct_comm_group *world;
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
    float *data; /* n floats; bf16: n bf16 values packed at its start */
    int64_t n;
    int bf16;    /* checkpoint.export_dtype bfloat16: stored as 2-byte bf16 */
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

ckpt_snapshot *ckpt_snapshot_take(session *s, int what, int export_bf16) {
    ckpt_snapshot *sn = calloc(1, sizeof *sn);
    if (!sn) goto nomem;
    sn->rank = s->rank;
    int kmax = (what & CKPT_OPTIMIZER) ? s->n_state : 0;
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    sn->p = calloc((size_t)s->rt.n_params * (size_t)(kmax + 1) + (size_t)nb + 1, sizeof(snap_piece));
    if (!sn->p) goto nomem;
    for (int i = 0; i < nb && (what & CKPT_MODEL); i++) { /* the pack's buffers: whole, from their stage */
        if (!session_buffer_saved_here(s, &buf[i]) || buf[i].numel <= 0) continue;
        snap_piece *p = &sn->p[sn->n];
        if (!(p->data = malloc(sizeof(float) * (size_t)buf[i].numel))) goto nomem;
        sn->n++;
        p->b = (box){.ndim = 1, .len = {buf[i].numel}};
        p->n = buf[i].numel;
        snprintf(p->name, sizeof p->name, "%s", buf[i].name);
        memcpy(p->data, buf[i].data, sizeof(float) * (size_t)p->n);
    }
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
                ct_set_error("checkpoint: cannot copy %s from the device", sl->param->name);
                ckpt_snapshot_free(sn);
                return NULL;
            }
            if (export_bf16 && k < 0) { /* round to nearest even, stored as bf16 (in place: j never passes j) */
                uint16_t *h = (uint16_t *)p->data;
                for (int64_t j = 0; j < n; j++) {
                    uint32_t u;
                    memcpy(&u, &p->data[j], 4);
                    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
                    h[j] = (uint16_t)(u >> 16);
                }
                p->bf16 = 1;
            }
        }
    }
    return sn;
nomem:
    ct_set_error("checkpoint: out of memory for the snapshot");
    ckpt_snapshot_free(sn);
    return NULL;
}

/* Writes a snapshot's pieces and their index into dir (no collective: any thread). */
ct_status ckpt_snapshot_write(const ckpt_snapshot *sn, const char *dir) {
    char path[PATH_MAX], fname[64];
    snprintf(fname, sizeof fname, "rank-%05d.bin", sn->rank);
    if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path)
        return ct_fail(CT_ERR_INVALID, "checkpoint folder path too long");
    int fd = -1;
    ct_status rc = CT_ERR_IO;
    json_t *index = json_array();
    int64_t file_off = 0;
    for (int i = 0; i < sn->n; i++) {
        const snap_piece *p = &sn->p[i];
        if (fd < 0 && (fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644)) < 0) {
            ct_set_error("%s: cannot write: %s", path, strerror(errno));
            goto done;
        }
        size_t bytes = (p->bf16 ? 2 : sizeof(float)) * (size_t)p->n;
        if (ct_write_all(fd, p->data, bytes)) {
            ct_set_error("%s: write failed: %s", path, strerror(errno));
            goto done;
        }
        json_t *e = json_object();
        json_object_set_new(e, "tensor", json_string(p->name));
        json_object_set_new(e, "offsets", box_json(p->b.off, p->b.ndim));
        json_object_set_new(e, "sizes", box_json(p->b.len, p->b.ndim));
        json_object_set_new(e, "file", json_string(fname));
        json_object_set_new(e, "byte_offset", json_integer(file_off));
        json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
        if (p->bf16) json_object_set_new(e, "dtype", json_string("bf16"));
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
            ct_set_error("%s: cannot sync: %s", path, strerror(errno));
            goto done;
        }
    }
    char *text = json_dumps(index, JSON_COMPACT);
    if (!text || snprintf(path, sizeof path, "%s/rank-%05d.json", dir, sn->rank) >= (int)sizeof path ||
        write_file_synced(path, text, strlen(text))) {
        ct_set_error("%s: cannot write the index: %s", path, text ? strerror(errno) : "out of memory");
        free(text);
        goto done;
    }
    free(text);
    rc = CT_OK;
done:
    if (fd >= 0) close(fd);
    json_decref(index);
    return rc;
}

/* What a resume must match (checkpoint.allow_config_change lifts it): the data order (seed,
 * seq_len, the dataset and its mixture) and the model, under the config keys that set them, and with
 * `optimizer` (a save that holds the optimizer's states) the optimizer and its states per element.
 * Zeros are a pack that does not say. */
static json_t *run_config(session *s, int optimizer) {
    json_t *c = json_object();
    const ct_model_desc *d = &s->rt.desc;
    const engine_settings *es = &s->cfg; /* read when the session opened on s->mf */
    if (s->mf && es->has_seed) json_object_set_new(c, "training.seed", json_integer(es->seed));
    if (s->mf && es->has_dataset) /* another mixture: another sequence at each position */
        json_object_set_new(c, "training.dataset", json_string(es->dataset));
    if (s->mf && es->has_seq_len) json_object_set_new(c, "training.seq_len", json_integer(es->seq_len));
    if (s->mf && es->model_name) json_object_set_new(c, "model.name", json_string(es->model_name));
    if (s->mf && es->flavor) json_object_set_new(c, "model.flavor", json_string(es->flavor));
    /* the optimizer's states: another optimizer, or another layout of its states (AdamW's bf16 moments) */
    if (optimizer && s->optp) json_object_set_new(c, "optimizer.name", json_string(s->optp->info.name));
    if (optimizer && s->optp) json_object_set_new(c, "optimizer.states_per_element", json_integer(s->n_state));
    const struct { const char *key; int64_t v; } ints[] = {
        {"model.vocab_size", d->vocab_size}, {"model.dim", d->dim},           {"model.n_layers", d->n_layers},
        {"model.n_heads", d->n_heads},       {"model.n_kv_heads", d->n_kv_heads}, {"model.ffn_hidden", d->ffn_hidden}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (ints[i].v > 0) json_object_set_new(c, ints[i].key, json_integer(ints[i].v));
    if (d->rope_theta > 0) json_object_set_new(c, "model.rope_theta", json_real(d->rope_theta));
    if (d->norm_eps > 0) json_object_set_new(c, "model.norm_eps", json_real(d->norm_eps));
    /* Llama 3.1's RoPE scaling: other frequencies, another function of the same weights */
    json_object_set_new(c, "model.rope_scaling", json_string(d->rope_scaling_factor > 0 ? "llama3" : "none"));
    if (d->rope_scaling_factor > 0) {
        json_object_set_new(c, "model.rope_scaling_factor", json_real(d->rope_scaling_factor));
        json_object_set_new(c, "model.rope_low_freq_factor", json_real(d->rope_low_freq_factor));
        json_object_set_new(c, "model.rope_high_freq_factor", json_real(d->rope_high_freq_factor));
        json_object_set_new(c, "model.rope_original_max_position", json_integer(d->rope_original_max_position));
    }
    return c;
}

/* Rank 0: merges the rank indexes into metadata.json (the last file written). */
/* Every rank's index (dir/rank-NNNNN.json) appended to shards. */
static ct_status shards_gather(const session *s, const char *dir, json_t *shards) {
    for (int r = 0; r < s->world; r++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/rank-%05d.json", dir, r) >= (int)sizeof path)
            return ct_fail(CT_ERR_INVALID, "%s: path too long", dir);
        json_error_t je;
        json_t *idx = json_load_file(path, 0, &je);
        if (!idx || !json_is_array(idx)) {
            json_decref(idx);
            return ct_fail(CT_ERR_IO, "%s: missing or unreadable rank index", path);
        }
        size_t i;
        json_t *e;
        json_array_foreach(idx, i, e) json_array_append(shards, e);
        json_decref(idx);
    }
    return CT_OK;
}

/* The tensors this save holds, name -> dtype and global shape (a model-only save has no optimizer
 * state): those some shard names. */
static json_t *tensors_listed(const session *s, json_t *shards) {
    json_t *tensors = json_object();
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = s->rt.slots[i].param;
        for (int k = -1; k < s->n_state; k++) {
            char name[512];
            tensor_name(name, sizeof name, p->name, k);
            int present = 0, bf16 = 0;
            size_t j;
            json_t *e;
            json_array_foreach(shards, j, e) if (!strcmp(json_string_value(json_object_get(e, "tensor")), name)) {
                present = 1;
                bf16 = json_is_string(json_object_get(e, "dtype"));
                break;
            }
            if (!present) continue;
            json_t *t = json_object();
            json_object_set_new(t, "dtype", json_string(bf16 ? "bf16" : "f32"));
            json_object_set_new(t, "shape", box_json(s->rt.slots[i].global_shape, p->ndim));
            json_object_set_new(tensors, name, t);
        }
    }
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    for (int i = 0; i < nb; i++) {
        size_t j;
        json_t *e;
        json_array_foreach(shards, j, e) if (!strcmp(json_string_value(json_object_get(e, "tensor")), buf[i].name)) {
            json_t *t = json_object();
            json_object_set_new(t, "dtype", json_string("f32"));
            json_object_set_new(t, "shape", box_json(&buf[i].numel, 1));
            json_object_set_new(tensors, buf[i].name, t);
            break;
        }
    }
    return tensors;
}

static json_t *train_state_json(const ckpt_train_state *st) {
    json_t *t = json_object();
    json_object_set_new(t, "step", json_integer(st->step));
    json_object_set_new(t, "tokens_seen", json_integer(st->tokens_seen));
    json_object_set_new(t, "data_position", json_integer(st->data_position));
    json_object_set_new(t, "seed", json_integer(st->seed));
    json_object_set_new(t, "dp_size", json_integer(st->dp_size));
    return t;
}

/* root as dir/metadata.json: written to a temporary name, synced, renamed, the folder synced. */
static ct_status metadata_file_write(const char *dir, const json_t *root) {
    char *text = json_dumps(root, JSON_INDENT(1));
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    int long_path = snprintf(path, sizeof path, "%s/metadata.json", dir) >= (int)sizeof path;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!text || long_path || write_file_synced(tmp, text, strlen(text)) || rename(tmp, path) || fsync_path(dir)) {
        ct_set_error("%s: cannot write the metadata: %s", path, text ? strerror(errno) : "out of memory");
        free(text);
        unlink(tmp);
        return CT_ERR_IO;
    }
    free(text);
    return CT_OK;
}

static ct_status write_metadata(session *s, const char *dir, int64_t step, const ckpt_train_state *st) {
    json_t *root = json_object(), *shards = json_array();
    json_object_set_new(root, "format", json_string("ctitan-checkpoint"));
    json_object_set_new(root, "version", json_integer(CKPT_VERSION));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "world_size", json_integer(s->world));
    if (s->capi) { /* the layout it was written with (loading reshards to any other) */
        json_t *mesh = json_object();
        for (int a = 0; a < CT_MESH_NAXES; a++)
            json_object_set_new(mesh, mesh_axis_names[a], json_integer(s->mesh.degree[a] > 0 ? s->mesh.degree[a] : 1));
        json_object_set_new(root, "mesh", mesh);
    }
    json_object_set_new(root, "config", run_config(s, st != NULL));
    json_t *desc = mdesc_build(s); /* NULL (out of memory): left out, as an older ctitan's */
    if (desc) json_object_set_new(root, "model", desc);
    ct_status rc = shards_gather(s, dir, shards);
    if (rc != CT_OK) {
        json_decref(shards);
        json_decref(root);
        return rc;
    }
    json_object_set_new(root, "tensors", tensors_listed(s, shards));
    json_object_set_new(root, "shards", shards);
    if (st) json_object_set_new(root, "train_state", train_state_json(st));
    rc = metadata_file_write(dir, root);
    json_decref(root);
    return rc;
}

ct_status ckpt_prepare(session *s, const char *folder, int64_t step) {
    char tmpdir[PATH_MAX];
    snprintf(tmpdir, sizeof tmpdir, "%s/step-%" PRId64 ".tmp", folder, step);
    ct_status rc = CT_OK;
    if (s->rank == 0) {
        rm_rf(tmpdir);
        if (ct_mkdir_p(tmpdir) != 0) rc = ct_fail(CT_ERR_IO, "%s: cannot create: %s", tmpdir, strerror(errno));
    }
    if (barrier(s))
        return ct_fail(CT_ERR_INTERNAL, "checkpoint %s: a rank did not reach the save barrier: %s", tmpdir,
                       ct_last_error());
    return rc;
}

ct_status ckpt_commit(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int wrote_ok) {
    char dir[PATH_MAX], tmpdir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/step-%" PRId64, folder, step);
    snprintf(tmpdir, sizeof tmpdir, "%s.tmp", dir);
    /* every rank says whether its files are written; the folder is committed only if all are */
    double ok = wrote_ok ? 1 : 0;
    if (s->capi) {
        ct_comm_group *world;
        s->capi->world(s->comm, &world);
        if (s->capi->all_reduce(s->comm, world, &ok, &ok, 1, CT_F64, CT_REDUCE_MIN, NULL) != CT_OK)
            return ct_fail(CT_ERR_INTERNAL, "checkpoint %s: a rank did not reach the commit: %s", dir,
                           ct_last_error());
    }
    ct_status rc = CT_OK;
    /* a rank that failed has its own message set already (by the snapshot or its write), kept here */
    if (ok < 1 && !wrote_ok) rc = CT_ERR_IO;
    else if (ok < 1) rc = ct_fail(CT_ERR_IO, "checkpoint %s: another rank failed to write its files", dir);
    if (s->rank == 0 && rc == CT_OK) {
        rc = write_metadata(s, tmpdir, step, st);
        if (rc == CT_OK) {
            /* an older complete save of the same step (a rerun) steps aside as step-N.old until the new
             * one is in place, so a crash in between leaves one of them (ckpt_steps tidies up) */
            char old[PATH_MAX + 8];
            snprintf(old, sizeof old, "%s.old", dir);
            rm_rf(old);
            int had = access(dir, F_OK) == 0;
            if ((had && rename(dir, old) != 0) || rename(tmpdir, dir) != 0 || fsync_path(folder) != 0)
                rc = ct_fail(CT_ERR_IO, "%s: cannot commit: %s", dir, strerror(errno));
            else if (had) rm_rf(old);
        }
    }
    if (s->rank == 0 && rc != CT_OK) rm_rf(tmpdir); /* a failed save leaves nothing behind (and frees the disk) */
    if (barrier(s))
        return ct_fail(CT_ERR_INTERNAL, "checkpoint %s: a rank did not reach the save barrier: %s", dir,
                       ct_last_error());
    return rc;
}

ct_status ckpt_save(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int what,
                    int export_bf16) {
    char tmpdir[PATH_MAX];
    snprintf(tmpdir, sizeof tmpdir, "%s/step-%" PRId64 ".tmp", folder, step);
    ct_status rc = ckpt_prepare(s, folder, step);
    if (rc != CT_OK) return rc;
    ckpt_snapshot *sn = ckpt_snapshot_take(s, what, export_bf16);
    int ok = sn && ckpt_snapshot_write(sn, tmpdir) == CT_OK;
    ckpt_snapshot_free(sn);
    return ckpt_commit(s, folder, step, st, ok);
}

/* N for "step-N"; *tmp = 1 for the leftovers "step-N.tmp" (a save in progress) and "step-N.old" (a
 * complete save being replaced). -1 for any other name. */
static int64_t step_of(const char *name, int *tmp) {
    if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return -1;
    char *end;
    errno = 0;
    long long v = strtoll(name + 5, &end, 10);
    if (errno || v < 0) return -1;
    *tmp = !strcmp(end, ".tmp") ? 1 : !strcmp(end, ".old") ? 2 : 0;
    return *end && !*tmp ? -1 : v;
}

/* Whether dir holds any rank-R.bin or rank-R.json piece. */
static int has_pieces(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) found = !strncmp(e->d_name, "rank-", 5);
    closedir(d);
    return found;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

ct_status ckpt_steps(const char *folder, int clean, int64_t **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(folder);
    if (!d) return CT_OK;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    ct_status rc = CT_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp = 0;
        int64_t v = step_of(e->d_name, &tmp);
        if (v < 0) continue;
        char p[PATH_MAX], meta[PATH_MAX + 16];
        if (snprintf(p, sizeof p, "%s/%s", folder, e->d_name) >= (int)sizeof p) continue;
        if (tmp == 1 && clean) rm_rf(p); /* an interrupted save */
        if (tmp == 2 && clean) {          /* a replaced save: gone once its successor is complete */
            char live[PATH_MAX];
            snprintf(live, sizeof live, "%s/step-%" PRId64 "/metadata.json", folder, v);
            if (access(live, F_OK) == 0) rm_rf(p);
            else {
                snprintf(live, sizeof live, "%s/step-%" PRId64, folder, v);
                rm_rf(live);
                if (rename(p, live) == 0 && n < INT_MAX) goto counted;
            }
        }
        if (tmp) continue;
        snprintf(meta, sizeof meta, "%s/metadata.json", p);
        if (access(meta, F_OK) != 0) {
            if (!has_pieces(p)) continue; /* an empty or foreign folder */
            rc = ct_fail(CT_ERR_INVALID, "%s holds rank pieces but no metadata.json (deleted, or not a finished save): "
                         "delete that folder, or set checkpoint.load_step to another step", p);
            break;
        }
    counted:
        if (n == cap) {
            int64_t *g = realloc(steps, sizeof *g * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", folder);
                break;
            }
            steps = g;
        }
        steps[n++] = v;
    }
    closedir(d);
    if (rc != CT_OK) {
        free(steps);
        return rc;
    }
    if (n) qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    *out = steps;
    *count = n;
    return CT_OK;
}

/* Whether a step folder's metadata.json has a train state (a full save, not a model-only one). */
static int full_state(const char *dir) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/metadata.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    int full = json_is_object(json_object_get(root, "train_state"));
    json_decref(root);
    return full;
}

int64_t ckpt_latest_full(const char *folder, int64_t below) {
    int64_t *steps, found = -1;
    int n;
    if (ckpt_steps(folder, 0, &steps, &n) != CT_OK) ct_clear_error(); /* no full save found; not an error here */
    for (int i = 0; i < n && found < 0; i++) {
        char dir[PATH_MAX];
        if (steps[i] >= below) continue;
        snprintf(dir, sizeof dir, "%s/step-%" PRId64, folder, steps[i]);
        if (full_state(dir)) found = steps[i];
    }
    free(steps);
    return found;
}

void ckpt_purge(const char *folder, int64_t keep) {
    if (keep <= 0) return;
    /* the newest k, and the newest save with the full training state whatever k says: after a
     * model-only final save that is what an extended run resumes from */
    int64_t full = ckpt_latest_full(folder, INT64_MAX), *steps = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(folder);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp = 0;
        int64_t v = step_of(e->d_name, &tmp);
        if (v < 0 || tmp) continue;
        if (n == cap) {
            int64_t *g = realloc(steps, sizeof *g * (cap = cap ? 2 * cap : 16));
            if (!g) break;
            steps = g;
        }
        steps[n++] = v;
    }
    closedir(d);
    if (n) qsort(steps, n, sizeof *steps, cmp_desc);
    for (size_t i = (size_t)keep; i < n; i++) {
        if (steps[i] == full) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/step-%" PRId64, folder, steps[i]);
        /* renamed first: a process killed while deleting leaves a step-N.tmp, which the next start
         * clears as an interrupted save, never a step-N missing its metadata.json */
        char gone[PATH_MAX + 8];
        snprintf(gone, sizeof gone, "%s.tmp", p);
        rm_rf(gone);
        rm_rf(rename(p, gone) == 0 ? gone : p);
    }
    free(steps);
}

/* ---- load ---- */

typedef struct piece {
    const char *tensor, *file;
    box b;
    int64_t byte_offset, bytes;
    uint64_t sum;
    int verified;
    int bf16; /* its tensor's dtype is bf16 (checkpoint.export_dtype): 2 bytes per element */
} piece;

/* R for a file name "rank-RRRRR<ext>" (five or more digits, as the writer names them), else -1. */
static int64_t rank_file(const char *name, const char *ext) {
    if (strncmp(name, "rank-", 5)) return -1;
    int64_t r = 0;
    const char *p = name + 5;
    for (; *p >= '0' && *p <= '9' && r < CKPT_MAX_WORLD; p++) r = r * 10 + (*p - '0');
    return p - name >= 10 && !strcmp(p, ext) ? r : -1;
}

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

/* An integer member of o in [lo, hi]: CT_OK and *v; else CT_ERR_INVALID and "path: field must be ...". */
static ct_status get_int(json_t *o, const char *key, const char *field, int64_t lo, int64_t hi, int64_t *v,
                         const char *path) {
    json_t *x = json_object_get(o, key);
    if (json_is_integer(x) && json_integer_value(x) >= lo && json_integer_value(x) <= hi) {
        *v = json_integer_value(x);
        return CT_OK;
    }
    char got[48] = "missing";
    if (x) {
        char *t = json_dumps(x, JSON_ENCODE_ANY);
        snprintf(got, sizeof got, "%.40s", t ? t : "?");
        free(t);
    }
    return ct_fail(CT_ERR_INVALID, "%s: %s must be an integer from %" PRId64 " to %" PRId64 ", got %s", path, field, lo,
                   hi, got);
}

/* The fields besides the pieces: format, step, world_size and mesh, train_state, every tensor's dtype
 * (all checked for type and range: metadata.json is input like any other file). */
static ct_status check_fields(json_t *root, const char *path) {
    json_t *fmt = json_object_get(root, "format"), *ts = json_object_get(root, "train_state");
    json_t *mesh = json_object_get(root, "mesh"), *cfg = json_object_get(root, "config");
    int64_t step, world, v;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "ctitan-checkpoint"))
        return ct_fail(CT_ERR_INVALID, "%s: format must be \"ctitan-checkpoint\"", path);
    if (get_int(root, "step", "step", 0, CKPT_MAX_COUNT, &step, path) ||
        get_int(root, "world_size", "world_size", 1, CKPT_MAX_WORLD, &world, path))
        return CT_ERR_INVALID;
    if ((ts && !json_is_object(ts)) || (mesh && !json_is_object(mesh)) || (cfg && !json_is_object(cfg)))
        return ct_fail(CT_ERR_INVALID, "%s: %s must be an object", path,
                       ts && !json_is_object(ts) ? "train_state" : mesh && !json_is_object(mesh) ? "mesh" : "config");
    int64_t dp = 0;
    if (mesh) {
        int64_t prod = 1, deg[CT_MESH_NAXES];
        for (int a = 0; a < CT_MESH_NAXES; a++) {
            char field[32];
            snprintf(field, sizeof field, "mesh.%s", mesh_axis_names[a]);
            if (get_int(mesh, mesh_axis_names[a], field, 1, CKPT_MAX_WORLD, &deg[a], path)) return CT_ERR_INVALID;
            prod *= deg[a];
            if (prod > CKPT_MAX_WORLD) break;
        }
        if (prod != world)
            return ct_fail(CT_ERR_INVALID, "%s: mesh degrees multiply to %" PRId64 ", not world_size %" PRId64, path,
                           prod, world);
        dp = deg[CT_AXIS_DP_REPLICATE] * deg[CT_AXIS_DP_SHARD];
    }
    if (ts) {
        int64_t ts_step;
        if (get_int(ts, "step", "train_state.step", 0, CKPT_MAX_COUNT, &ts_step, path) ||
            get_int(ts, "tokens_seen", "train_state.tokens_seen", 0, CKPT_MAX_COUNT, &v, path) ||
            get_int(ts, "data_position", "train_state.data_position", 0, CKPT_MAX_COUNT, &v, path) ||
            get_int(ts, "seed", "train_state.seed", INT64_MIN, INT64_MAX, &v, path) ||
            get_int(ts, "dp_size", "train_state.dp_size", 1, world, &v, path))
            return CT_ERR_INVALID;
        if (ts_step != step)
            return ct_fail(CT_ERR_INVALID, "%s: train_state.step %" PRId64 " is not the checkpoint's step %" PRId64,
                           path, ts_step, step);
        if (world % v || (dp && v != dp))
            return ct_fail(CT_ERR_INVALID, "%s: train_state.dp_size %" PRId64 " does not fit world_size %" PRId64 "%s",
                           path, v, world, dp ? " and the mesh's dp_replicate x dp_shard" : " (it must divide it)");
    }
    const char *name;
    json_t *t;
    json_object_foreach(json_object_get(root, "tensors"), name, t) {
        json_t *dt = json_object_get(t, "dtype");
        if (!json_is_object(t) || !json_is_string(dt) ||
            (strcmp(json_string_value(dt), "f32") && strcmp(json_string_value(dt), "bf16"))) {
            char shown[201]; /* the name as it can be printed on one line */
            size_t k = 0;
            for (; name[k] && k < 200; k++) shown[k] = (unsigned char)name[k] < 0x20 ? '?' : name[k];
            shown[k] = 0;
            return ct_fail(CT_ERR_INVALID, "%s: tensors.%s.dtype must be \"f32\" or \"bf16\"", path, shown);
        }
    }
    return CT_OK;
}

/* Validates metadata.json's structure and every piece against its tensor's shape. */
static ct_status parse_pieces(json_t *root, const char *path, piece **out, size_t *count) {
    json_t *ver = json_object_get(root, "version"), *shards = json_object_get(root, "shards");
    json_t *tensors = json_object_get(root, "tensors"), *ts = json_object_get(root, "train_state");
    *out = NULL;
    *count = 0;
    if (!json_is_object(root) || !json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION ||
        !json_is_array(shards) || !json_is_object(tensors) || (ts && !json_is_object(ts)))
        return ct_fail(CT_ERR_INVALID, "%s: not a ctitan checkpoint of version %d", path, CKPT_VERSION);
    (void)ts;
    if (check_fields(root, path)) return CT_ERR_INVALID;
    int64_t world = json_integer_value(json_object_get(root, "world_size"));
    size_t np = json_array_size(shards);
    piece *pieces = calloc(np + 1, sizeof *pieces);
    if (!pieces) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
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
                 rank_file(json_string_value(f), ".bin") >= 0 && rank_file(json_string_value(f), ".bin") < world &&
                 json_integer_value(bo) >= 0 && json_integer_value(bo) < ((int64_t)1 << 50);
        if (ok) {
            p->b.ndim = n1;
            p->bf16 = !strcmp(json_string_value(json_object_get(tt, "dtype")), "bf16");
            ok = box_numel_ok(&p->b) && json_integer_value(by) == (json_int_t)(box_numel(&p->b) * (p->bf16 ? 2 : 4));
            for (int d = 0; ok && d < n1; d++) ok = p->b.off[d] + p->b.len[d] <= shape[d];
        }
        if (!ok) {
            free(pieces);
            return ct_fail(CT_ERR_INVALID, "%s: shard %zu is malformed (tensor, file rank-R.bin with R below "
                           "world_size, offsets/sizes within the shape, bytes, fnv1a64 expected)", path, i);
        }
        p->tensor = json_string_value(t);
        p->file = json_string_value(f);
        p->byte_offset = json_integer_value(bo);
        p->bytes = json_integer_value(by);
        p->sum = strtoull(json_string_value(sum), NULL, 16);
    }
    *out = pieces;
    *count = np;
    return CT_OK;
}

ct_status ckpt_check_metadata(const char *text, size_t len, const char *label) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return ct_fail(CT_ERR_INVALID, "%s:%d: not JSON (%s)", label, je.line, je.text);
    piece *pieces;
    size_t n;
    ct_status rc = parse_pieces(root, label, &pieces, &n);
    if (rc == CT_OK) free(pieces);
    json_decref(root);
    return rc;
}

/* A step folder against its metadata: a folder named step-N holds step N, and the rank indexes
 * (rank-R.json, one per rank that saved) are exactly those of world_size ranks. */
static ct_status check_folder(json_t *root, const char *dir, const char *path) {
    int64_t step = json_integer_value(json_object_get(root, "step"));
    int64_t world = json_integer_value(json_object_get(root, "world_size"));
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    int tmp = 0;
    int64_t named = step_of(base, &tmp);
    if (named >= 0 && !tmp && named != step)
        return ct_fail(CT_ERR_INVALID, "%s: step is %" PRId64 " but the folder is %s", path, step, base);
    DIR *d = opendir(dir);
    if (!d) return ct_fail(CT_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    int64_t count = 0, stray = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t r = rank_file(e->d_name, ".json");
        if (r < 0) continue;
        count++;
        if (r >= world) stray = r;
    }
    closedir(d);
    if (stray >= 0 || count != world)
        return ct_fail(CT_ERR_INVALID, "%s: world_size is %" PRId64 " but the folder holds the rank indexes "
                       "(rank-R.json) of %" PRId64 " rank%s%s", path, world, count, count == 1 ? "" : "s",
                       stray >= 0 ? ", one beyond it" : "");
    return CT_OK;
}

/* "training.seed 0; this run has 1": the first setting of this run (run_config) that the checkpoint
 * recorded otherwise; "" when none. resume: all of them, else the model's only. */
static void config_diff(session *s, json_t *root, int resume, char *out, size_t len) {
    json_t *stored = json_object_get(root, "config"), *now = run_config(s, 1), *v;
    const char *key;
    out[0] = 0;
    json_object_foreach(now, key, v) {
        json_t *was = json_object_get(stored, key);
        if (!stored && !strcmp(key, "training.seed")) /* older checkpoints: the train state's seed */
            was = json_object_get(json_object_get(root, "train_state"), "seed");
        /* loading only the model (generate, initial loads) needs the same weights, not the same preset */
        if (!resume && (strncmp(key, "model.", 6) || !strcmp(key, "model.flavor"))) continue;
        if (!was || json_equal(was, v)) continue;
        char *a = json_dumps(was, JSON_ENCODE_ANY), *b = json_dumps(v, JSON_ENCODE_ANY);
        snprintf(out, len, "%s %.110s; this run has %.110s", key, a ? a : "?", b ? b : "?");
        free(a);
        free(b);
        break;
    }
    json_decref(now);
}

ct_status ckpt_inspect(session *s, const char *step_dir, int resume, ckpt_info *info) {
    char path[PATH_MAX];
    memset(info, 0, sizeof *info);
    snprintf(path, sizeof path, "%s/metadata.json", step_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return ct_fail(CT_ERR_INVALID, "%s:%d: not a checkpoint (%s)", path, je.line, je.text);
    piece *pieces = NULL;
    size_t np;
    ct_status rc = parse_pieces(root, path, &pieces, &np);
    if (rc == CT_OK) rc = check_folder(root, step_dir, path);
    if (rc != CT_OK) goto done;
    json_t *ts = json_object_get(root, "train_state"), *t;
    info->step = json_integer_value(json_object_get(root, "step"));
    info->world_size = (int)json_integer_value(json_object_get(root, "world_size"));
    info->has_state = json_is_object(ts);
    info->has_config = json_is_object(json_object_get(root, "config"));
    const char *name;
    json_object_foreach(json_object_get(root, "tensors"), name, t) if (!strncmp(name, "optimizer.", 10))
        info->has_optimizer = 1;
    if (info->has_state) {
        info->state.step = json_integer_value(json_object_get(ts, "step"));
        info->state.tokens_seen = json_integer_value(json_object_get(ts, "tokens_seen"));
        info->state.data_position = json_integer_value(json_object_get(ts, "data_position"));
        info->state.seed = json_integer_value(json_object_get(ts, "seed"));
        info->state.dp_size = json_integer_value(json_object_get(ts, "dp_size"));
    }
    config_diff(s, root, resume, info->config_diff, sizeof info->config_diff);
done:
    free(pieces);
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

/* What ckpt_load reads from: the step folder, its metadata and pieces, and buffers reused across
 * tensors. */
typedef struct ckpt_reader {
    const char *step_dir;
    const char *path; /* its metadata.json */
    json_t *tensors;  /* the metadata's tensor list */
    piece *pieces;
    size_t np;
    float *buf;   /* one piece's bytes */
    float *local; /* this rank's part of one tensor */
} ckpt_reader;

/* Piece p of tensor `name` into r->buf, its size, checksum and values checked. */
static ct_status piece_read(ckpt_reader *r, const piece *p, const char *name) {
    float *g = realloc(r->buf, (size_t)p->bytes + 4);
    if (!g) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", r->path);
    r->buf = g;
    char fpath[PATH_MAX];
    snprintf(fpath, sizeof fpath, "%s/%s", r->step_dir, p->file);
    int fd = open(fpath, O_RDONLY);
    ssize_t got = fd >= 0 ? pread(fd, r->buf, (size_t)p->bytes, p->byte_offset) : -1;
    if (fd >= 0) close(fd);
    if (got != p->bytes)
        return ct_fail(CT_ERR_INVALID, "%s: %s is truncated or missing (needed %" PRId64 " bytes at %" PRId64 ")",
                       fpath, name, p->bytes, p->byte_offset);
    if (fnv1a(r->buf, (size_t)p->bytes, 1469598103934665603ull) != p->sum)
        return ct_fail(CT_ERR_INVALID, "%s: checksum mismatch in %s: the checkpoint is corrupt", fpath, name);
    if (p->bf16) { /* widened to f32 in place, from the last element down (the f32s outgrow the bf16s) */
        int64_t n = p->bytes / 2;
        float *grown = realloc(r->buf, sizeof(float) * (size_t)(n ? n : 1));
        if (!grown) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", r->path);
        r->buf = grown;
        const uint16_t *h = (const uint16_t *)r->buf;
        for (int64_t j = n - 1; j >= 0; j--) {
            uint32_t u = (uint32_t)h[j] << 16;
            memcpy(&r->buf[j], &u, 4);
        }
        return tf_check_finite_data(r->buf, n, fpath, name) != CT_OK ? CT_ERR_INVALID : CT_OK;
    }
    if (tf_check_finite_data(r->buf, p->bytes / 4, fpath, name) != CT_OK) return CT_ERR_INVALID;
    return CT_OK;
}

/* Parameter i's tensor k (-1: the weights, else optimizer state k): this rank's box want of it,
 * gathered from every piece that overlaps it, onto the device. */
static ct_status tensor_load(session *s, ckpt_reader *r, int i, int k, const box *want) {
    const ct_param_slot *sl = &s->rt.slots[i];
    int64_t n = box_numel(want);
    char name[512];
    tensor_name(name, sizeof name, runtime_param_key(&s->rt, i), k); /* a shared use loads the declared one */
    json_t *t = json_object_get(r->tensors, name);
    int64_t shape[CT_MAX_DIMS];
    int nd = 0;
    if (!t || parse_box(json_object_get(t, "shape"), shape, &nd) || nd != sl->param->ndim ||
        memcmp(shape, sl->global_shape, sizeof(int64_t) * (size_t)nd))
        return ct_fail(CT_ERR_INVALID, "%s: %s is missing or has another shape than the model's", r->path, name);
    memset(r->local, 0, sizeof(float) * (size_t)sl->local_numel);
    int64_t covered = 0;
    for (size_t j = 0; j < r->np && n > 0; j++) {
        piece *p = &r->pieces[j];
        if (strcmp(p->tensor, name) || p->b.ndim != want->ndim) continue;
        ct_status st = piece_read(r, p, name);
        if (st != CT_OK) return st;
        covered += copy_intersection(p, r->buf, want, r->local);
    }
    if (covered != n)
        return ct_fail(CT_ERR_INVALID, "%s: the pieces of %s cover %" PRId64 " of the %" PRId64 " elements this rank "
                       "needs", r->path, name, covered, n);
    float *dst = (float *)storage(s, i, k);
    if (s->d->copy(s->dev, dst, r->local, sizeof(float) * (size_t)sl->local_numel, CT_COPY_H2D) != CT_OK)
        return ct_fail(CT_ERR_INTERNAL, "checkpoint: cannot copy %s to the device", name);
    return CT_OK;
}

/* Buffer b (the pack's, ABI 2.20), whole, from its pieces into the pack's memory. */
static ct_status buffer_load(ckpt_reader *r, const ct_model_buffer *b) {
    json_t *t = json_object_get(r->tensors, b->name);
    int64_t shape[CT_MAX_DIMS];
    int nd = 0;
    if (!t || parse_box(json_object_get(t, "shape"), shape, &nd) || nd != 1 || shape[0] != b->numel)
        return ct_fail(CT_ERR_INVALID, "%s: %s is missing or has another shape than the model's", r->path, b->name);
    float *grown = realloc(r->local, sizeof(float) * (size_t)(b->numel > 0 ? b->numel : 1));
    if (!grown) return ct_fail(CT_ERR_NOMEM, "%s: out of memory", r->path);
    r->local = grown;
    box want = {.ndim = 1, .len = {b->numel}};
    int64_t covered = 0;
    for (size_t j = 0; j < r->np; j++) {
        piece *p = &r->pieces[j];
        if (strcmp(p->tensor, b->name) || p->b.ndim != 1) continue;
        ct_status st = piece_read(r, p, b->name);
        if (st != CT_OK) return st;
        covered += copy_intersection(p, r->buf, &want, r->local);
    }
    if (covered != b->numel)
        return ct_fail(CT_ERR_INVALID, "%s: the pieces of %s cover %" PRId64 " of its %" PRId64 " elements", r->path,
                       b->name, covered, b->numel);
    memcpy(b->data, r->local, sizeof(float) * (size_t)b->numel);
    return CT_OK;
}

ct_status ckpt_load(session *s, const char *step_dir, int what, ckpt_train_state *st, int *has_state) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/metadata.json", step_dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    ckpt_reader r = {.step_dir = step_dir, .path = path};
    *has_state = 0;
    if (!root) return ct_fail(CT_ERR_INVALID, "%s:%d: not a checkpoint (%s)", path, je.line, je.text);
    r.tensors = json_object_get(root, "tensors");
    ct_status rc = parse_pieces(root, path, &r.pieces, &r.np);
    if (rc == CT_OK) rc = check_folder(root, step_dir, path);
    if (rc != CT_OK) goto done;
    if ((what & CKPT_OPTIMIZER) && s->rt.n_params > 0) { /* a state this run's optimizer has not: another layout */
        char name[600];
        tensor_name(name, sizeof name, runtime_param_key(&s->rt, 0), s->n_state);
        if (json_object_get(r.tensors, name)) {
            rc = ct_fail(CT_ERR_INVALID, "%s: holds more optimizer states per element than this run's optimizer keeps "
                         "(%d; %s is one more): another optimizer or optimizer.implementation wrote it; resume with "
                         "checkpoint.exclude_from_loading: optimizer", path, s->n_state, name);
            goto done;
        }
    }
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_param_slot *sl = &s->rt.slots[i];
        box want;
        local_box(sl, &want);
        float *grown = realloc(r.local, sizeof(float) * (size_t)(sl->local_numel > 0 ? sl->local_numel : 1));
        if (!grown) {
            rc = ct_fail(CT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        r.local = grown;
        for (int k = (what & CKPT_MODEL) ? -1 : 0; k < ((what & CKPT_OPTIMIZER) ? s->n_state : 0); k++)
            if ((rc = tensor_load(s, &r, i, k, &want)) != CT_OK) goto done;
    }
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    for (int i = 0; i < nb && (what & CKPT_MODEL); i++)
        if ((rc = buffer_load(&r, &buf[i])) != CT_OK) goto done;
    json_t *ts = json_object_get(root, "train_state");
    if (st && json_is_object(ts)) {
        st->step = json_integer_value(json_object_get(ts, "step"));
        st->tokens_seen = json_integer_value(json_object_get(ts, "tokens_seen"));
        st->data_position = json_integer_value(json_object_get(ts, "data_position"));
        st->seed = json_integer_value(json_object_get(ts, "seed"));
        st->dp_size = json_integer_value(json_object_get(ts, "dp_size"));
        *has_state = 1;
    }
done:
    free(r.pieces);
    free(r.buf);
    free(r.local);
    json_decref(root);
    return rc;
}
