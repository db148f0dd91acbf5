/* ckpt_run.c: checkpoints in the training loop: resume at start, periodic and final saves,
 * async_mode (files written by a background thread while training goes on), keep_latest_k. */
#include "checkpoint/checkpoint.h"
#include "checkpoint/settings.h"

#include "io/hf_export.h"
#include "base/error.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int excluded(const char *list, const char *what) {
    size_t n = strlen(what);
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ",");
        size_t l = len;
        while (l && p[l - 1] == ' ') l--;
        if (l == n && !strncmp(p, what, n)) return 1;
        p += len;
    }
    return 0;
}

/* A step folder, or a checkpoint folder whose newest step is taken; the error set if neither. */
static ct_status resolve_step_dir(const char *path, char *out, size_t len) {
    char meta[PATH_MAX];
    snprintf(meta, sizeof meta, "%s/metadata.json", path);
    if (access(meta, R_OK) == 0)
        return snprintf(out, len, "%s", path) < (int)len ? CT_OK : ct_fail(CT_ERR_INVALID, "%s: path too long", path);
    int64_t *steps;
    int n;
    ct_status st = ckpt_steps(path, 0, &steps, &n);
    if (st != CT_OK) return st;
    int found = n > 0 && snprintf(out, len, "%s/step-%" PRId64, path, steps[0]) < (int)len;
    free(steps);
    if (!found)
        return ct_fail(CT_ERR_INVALID, "%s: no complete checkpoint here (a step-N folder with metadata.json)", path);
    return CT_OK;
}

/* The model of a checkpoint made for this model: its recorded model settings must match the run's. */
static ct_status load_model_checked(session *s, const char *dir, int allow) {
    ckpt_info info;
    ct_status rc = ckpt_inspect(s, dir, 0, &info);
    if (rc != CT_OK) return rc;
    if (info.config_diff[0]) {
        if (!allow)
            return ct_fail(CT_ERR_INVALID, "checkpoint %s was written with %s (set checkpoint.allow_config_change: "
                           "true to load it anyway)", dir, info.config_diff);
        printf("checkpoint: %s was written with %s (allowed by checkpoint.allow_config_change)\n", dir, info.config_diff);
    }
    ckpt_train_state st;
    int has;
    return ckpt_load(s, dir, CKPT_MODEL, &st, &has);
}

ct_status ckpt_load_model_from(session *s, const char *path) {
    char dir[PATH_MAX];
    ct_status rc = resolve_step_dir(path, dir, sizeof dir);
    if (rc != CT_OK) return rc;
    ckpt_settings cs; /* the command's one reading of the section (NULL manifest: all off) */
    ckpt_settings_read(s->mf, &cs);
    return load_model_checked(s, dir, cs.allow_config_change);
}

/* CT_OK when the model scales RoPE as config.json says (the frequency bands of ct_model_desc.rope_*,
 * or plain); else CT_ERR_INVALID and the model options that would match: the same weights with other
 * frequencies give other logits. */
static ct_status same_rope_scaling(const ct_model_desc *d, const hf_rope *c, const char *dir) {
    if (d->rope_scaling_factor == c->factor &&
        (c->factor == 0 || (d->rope_low_freq_factor == c->low && d->rope_high_freq_factor == c->high &&
                            d->rope_original_max_position == c->orig)))
        return CT_OK;
    if (c->factor == 0)
        return ct_fail(CT_ERR_INVALID, "%s/config.json has plain RoPE but the model scales it (%s, factor %g): set "
                       "model.rope_scaling: none", dir, HF_ROPE_BANDS, d->rope_scaling_factor);
    return ct_fail(CT_ERR_INVALID, "%s/config.json scales RoPE (rope_type %s) and the model does not, or not the "
                   "same way: set model.rope_scaling: %s, model.rope_scaling_factor: %g, "
                   "model.rope_low_freq_factor: %g, model.rope_high_freq_factor: %g, "
                   "model.rope_original_max_position: %lld (or model.flavor: from_checkpoint, which takes every "
                   "setting from config.json)", dir, HF_ROPE_BANDS, HF_ROPE_BANDS, c->factor, c->low, c->high,
                   (long long)c->orig);
}

/* The pack's own Hugging Face form (ABI 2.12) into *x; an error naming the pack when it has none or
 * cannot give it. */
static ct_status pack_export(session *s, ct_hf_export *x) {
    const char *name = s->modelp->info.name;
    if (!CT_HAS_FIELD(s->m, ct_model_api, hf_export) || !s->m->hf_export)
        return ct_fail(CT_ERR_UNSUPPORTED, "model %s has no Hugging Face form (its pack gives no hf_export table, "
                       "ABI 2.12)", name);
    memset(x, 0, sizeof *x);
    x->struct_size = sizeof *x;
    if (s->m->hf_export(s->model, x) != CT_OK)
        return ct_fail(CT_ERR_INVALID, "model %s cannot describe its Hugging Face form: %s", name, ct_last_error());
    return CT_OK;
}

/* 1 when x checks config.json's key `top` (or a key nested in it) itself. */
static int table_checks(const ct_hf_export *x, const char *top) {
    size_t n = strlen(top);
    for (const ct_hf_field *f = x->fields; f && f->key; f++)
        if ((f->flags & CT_HF_CHECKED) && !strncmp(f->key, top, n) && (!f->key[n] || f->key[n] == '.')) return 1;
    return 0;
}

/* The model's parameters as shapes (no data), a shared one (a tied head) left out, then the pack's buffers. */
static tf_file *param_shapes(session *s) {
    tf_file *w = calloc(1, sizeof *w);
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    if (!w || !(w->entries = calloc((size_t)(s->rt.n_params + nb + 1), sizeof(tf_entry)))) {
        free(w);
        ct_set_error("out of memory");
        return NULL;
    }
    for (int i = 0; i < s->rt.n_params; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        if (runtime_param_copy_of(&s->rt, i) >= 0) continue;
        tf_entry *t = &w->entries[w->count++];
        *t = (tf_entry){.name = (char *)p->name, .dtype = TF_F32, .ndim = p->ndim, .numel = 1};
        memcpy(t->shape, runtime_global_shape(&s->rt, i), sizeof(int64_t) * (size_t)p->ndim);
        for (int d = 0; d < p->ndim; d++) t->numel *= t->shape[d];
    }
    for (int i = 0; i < nb; i++)
        w->entries[w->count++] = (tf_entry){.name = (char *)buf[i].name, .dtype = TF_F32, .ndim = 1,
                                            .shape = {buf[i].numel}, .numel = buf[i].numel};
    return w;
}

static void free_shapes(tf_file *w) {
    if (w) free(w->entries);
    free(w);
}

/* Loads a Hugging Face folder into the model by the pack's table (each rank takes its shard). A table
 * that does not check rope_scaling itself has config.json's RoPE scaling checked against the model's
 * description. */
static ct_status load_hf(session *s, const char *dir) {
    ct_hf_export x;
    tf_file *w = NULL;
    ct_status rc = pack_export(s, &x);
    if (rc != CT_OK) return rc;
    if (!table_checks(&x, "rope_scaling")) {
        hf_rope r;
        if ((rc = hf_read_rope(dir, &r)) != CT_OK || (rc = same_rope_scaling(&s->rt.desc, &r, dir)) != CT_OK)
            return rc;
    }
    tf_file *want = param_shapes(s);
    if (!want) return CT_ERR_NOMEM;
    rc = hf_import_load(dir, &x, want, s->rt.desc.head_dim, s->modelp->info.name, &w);
    free_shapes(want);
    if (rc != CT_OK) return rc;
    for (int i = 0; i < s->rt.n_params && rc == CT_OK; i++) {
        const ct_tensor *p = &s->rt.params[i]->t;
        const tf_entry *e =
            tf_expect(w, dir, runtime_param_key(&s->rt, i), 1, p->ndim, runtime_global_shape(&s->rt, i));
        if (!e || tf_check_finite_data(e->data, e->numel, dir, p->name) != CT_OK)
            rc = CT_ERR_INVALID;
        else if (runtime_param_set(&s->rt, i, e->data) != CT_OK)
            rc = CT_ERR_INTERNAL;
    }
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    for (int i = 0; i < nb && rc == CT_OK; i++) { /* the pack's buffers (e_score_correction_bias) */
        const tf_entry *e = tf_expect(w, dir, buf[i].name, 1, 1, &buf[i].numel);
        if (!e || tf_check_finite_data(e->data, e->numel, dir, buf[i].name) != CT_OK) rc = CT_ERR_INVALID;
        else memcpy(buf[i].data, e->data, sizeof(float) * (size_t)buf[i].numel);
    }
    tf_free(w);
    return rc;
}

ct_status ckpt_hf_export_check(session *s, const char *who) {
    const ct_model_desc *d = &s->rt.desc;
    ct_hf_export x;
    if (pack_export(s, &x) != CT_OK) return ct_fail(CT_ERR_INVALID, "%s: %s", who, ct_last_error());
    tf_file *w = param_shapes(s); /* shapes only: the check reads no data */
    if (!w) return CT_ERR_NOMEM;
    ct_status rc = CT_OK;
    if (hf_export_check(&x, w, d->head_dim, s->modelp->info.name) != CT_OK)
        rc = ct_fail(CT_ERR_INVALID, "%s: model %s cannot be exported to Hugging Face: %s", who,
                     s->modelp->info.name, ct_last_error());
    free_shapes(w);
    return rc;
}

/* Writes the model (gathered from every rank) as a Hugging Face folder by the pack's table (rank 0
 * writes). */
static ct_status save_hf(session *s, const char *dir, int bf16) {
    const ct_model_desc *d = &s->rt.desc;
    int n = 0;
    ct_status rc = CT_OK;
    const ct_model_buffer *buf;
    int nb = session_buffers(s, &buf);
    tf_entry *e = calloc((size_t)(s->rt.n_params + nb + 1), sizeof *e);
    if (!e) return ct_fail(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->rt.n_params; i++) { /* every rank gathers: a collective for sharded parameters */
        const ct_tensor *p = &s->rt.params[i]->t;
        if (runtime_param_copy_of(&s->rt, i) >= 0) continue; /* a shared parameter is written once */
        tf_entry *t = &e[n++];
        *t = (tf_entry){.name = (char *)p->name, .dtype = 1, .ndim = p->ndim, .numel = 1};
        memcpy(t->shape, runtime_global_shape(&s->rt, i), sizeof(int64_t) * (size_t)p->ndim);
        for (int d = 0; d < p->ndim; d++) t->numel *= t->shape[d];
        t->data = malloc(sizeof(float) * (size_t)t->numel);
        if (!t->data || runtime_param_get(&s->rt, i, t->data, 0) != CT_OK) {
            rc = ct_fail(CT_ERR_INTERNAL, "cannot gather %s", p->name);
            goto done;
        }
    }
    for (int i = 0; i < nb; i++) { /* the pack's buffers, each from the stage that runs its block */
        tf_entry *t = &e[n++];
        *t = (tf_entry){.name = (char *)buf[i].name, .dtype = 1, .ndim = 1, .shape = {buf[i].numel},
                        .numel = buf[i].numel};
        if (!(t->data = malloc(sizeof(float) * (size_t)(t->numel > 0 ? t->numel : 1)))) {
            rc = ct_fail(CT_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (session_buffer_get(s, &buf[i], t->data) != CT_OK) {
            rc = ct_fail(CT_ERR_INTERNAL, "cannot gather %s: %s", buf[i].name, ct_last_error());
            goto done;
        }
    }
    ct_hf_export x;
    if (s->rank == 0 && (rc = pack_export(s, &x)) == CT_OK) {
        tf_file w = {e, n, TF_VERSION};
        rc = hf_export_save(dir, &x, &w, d->head_dim, bf16 ? HF_BFLOAT16 : HF_FLOAT32, s->modelp->info.name);
    }
done:
    for (int i = 0; i < n; i++) free(e[i].data);
    free(e);
    return rc;
}

/* CT_OK if the checkpoint was written with this run's settings, or checkpoint.allow_config_change lets
 * it differ (said in one line); else CT_ERR_INVALID and the difference. */
static ct_status config_allowed(const ckpt_plan *ck, const char *dir, const ckpt_info *info) {
    int allow = ck->cfg.allow_config_change;
    if (!info->has_config)
        printf("checkpoint: %s does not record the run's settings (an older ctitan wrote it): training.seq_len and "
               "the model's settings are not compared\n", dir);
    if (!info->config_diff[0]) return CT_OK;
    if (!allow)
        return ct_fail(CT_ERR_INVALID, "checkpoint %s was written with %s (set checkpoint.allow_config_change: true to "
                       "resume anyway, or start in another job.dump_folder)", dir, info->config_diff);
    printf("checkpoint: %s was written with %s (allowed by checkpoint.allow_config_change)\n", dir, info->config_diff);
    return CT_OK;
}

/* pick_resume's step folder dir (at step model_step) holds the model only (a final save under
 * last_save_model_only): with checkpoint.load_step naming it, an error; else the newest full-state
 * save below it, in dir (*found 1), or none: a fresh start (*found 0). CT_OK, or a status with the
 * error line set. The loading functions below set lines the training loop prints after "ctitan: ". */
static ct_status resume_full_below(session *s, const manifest *mf, ckpt_plan *ck, int64_t load_step,
                                   int64_t model_step, char *dir, size_t len, int *found) {
    char where[600];
    *found = 0;
    if (load_step >= 0) {
        int64_t full = ckpt_latest_full(ck->folder, INT64_MAX);
        mf_where(mf, "checkpoint.load_step", where, sizeof where);
        char alt[64] = "none is here";
        if (full >= 0) snprintf(alt, sizeof alt, "step-%" PRId64 " has it", full);
        return ct_fail(CT_ERR_INVALID, "%s: %s holds the model only (a final save under checkpoint.last_save_model_only); "
                       "resuming needs the optimizer and train state (%s): set checkpoint.load_step to a full save, or "
                       "load it as checkpoint.initial_load_path into a new job.dump_folder", where, dir, alt);
    }
    int64_t full = ckpt_latest_full(ck->folder, model_step);
    if (full < 0) { /* training from step 0 again would overwrite the finished run's model.ctt */
        mf_where(mf, "training.steps", where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: %s holds the model only (checkpoint.last_save_model_only: true) and no save "
                       "in %s holds the optimizer and train state, so the run cannot continue where it stopped: to "
                       "train on from these weights, start a new job.dump_folder with checkpoint.initial_load_path: %s "
                       "and checkpoint.initial_load_model_only: true; to make a run continuable, set "
                       "checkpoint.last_save_model_only: false", where, dir, ck->folder, dir);
    }
    printf("checkpoint: %s holds the model only (checkpoint.last_save_model_only); resuming from step-%" PRId64
           ", the newest save with the full training state (steps %" PRId64 "-%" PRId64 " are trained again)\n",
           dir, full, full + 1, model_step);
    if (snprintf(dir, len, "%s/step-%" PRId64, ck->folder, full) >= (int)len) /* fit above: shorter */
        return ct_fail(CT_ERR_INTERNAL, "checkpoint: %s: path too long", ck->folder);
    ckpt_info info;
    ct_status st = ckpt_inspect(s, dir, 1, &info);
    if (st != CT_OK) return ct_fail(st, "checkpoint: %s", ct_last_error());
    if ((st = config_allowed(ck, dir, &info)) != CT_OK) return st;
    *found = 1;
    return CT_OK;
}

/* Picks the step folder a run resumes from (checkpoint.load_step, else the newest) and checks it:
 * *found 1 and its path in dir (2: a seed checkpoint, the model only), 0 when there is none (a fresh
 * start). CT_OK, or a status with the error line set.
 * A checkpoint at training.steps means the run already finished (ck->finished: its model is loaded,
 * for the end-of-run sample, and nothing is trained or written). A model-only save (the final save
 * under last_save_model_only) cannot resume training: the newest full-state one below it does. */
static ct_status pick_resume(session *s, const manifest *mf, ckpt_plan *ck, int64_t load_step, char *dir, size_t len,
                             int *found) {
    char where[600];
    int64_t steps_total = ck->cfg.steps, step = load_step;
    ct_status st;
    *found = 0;
    if (load_step < 0) {
        int64_t *steps;
        int n;
        if ((st = ckpt_steps(ck->folder, s->rank == 0, &steps, &n)) != CT_OK)
            return ct_fail(st, "checkpoint: %s", ct_last_error());
        step = n > 0 ? steps[0] : -1;
        free(steps);
        if (step < 0) return CT_OK;
    }
    if (snprintf(dir, len, "%s/step-%" PRId64, ck->folder, step) >= (int)len)
        return ct_fail(CT_ERR_INVALID, "checkpoint: %s: path too long", ck->folder);
    ckpt_info info;
    if ((st = ckpt_inspect(s, dir, 1, &info)) != CT_OK) {
        if (load_step < 0) return ct_fail(st, "checkpoint: %s", ct_last_error());
        mf_where(mf, "checkpoint.load_step", where, sizeof where);
        return ct_fail(st, "%s: %s", where, ct_last_error());
    }
    if ((st = config_allowed(ck, dir, &info)) != CT_OK) return st;
    if (info.step > steps_total) {
        mf_where(mf, "training.steps", where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: checkpoint %s is at step %" PRId64 ", past training.steps %" PRId64 ": "
                       "raise training.steps, or resume from an earlier step with checkpoint.load_step", where, dir,
                       info.step, steps_total);
    }
    if (info.step == steps_total && steps_total > 0) {
        if ((st = ckpt_load(s, dir, CKPT_MODEL, &info.state, &info.has_state)) != CT_OK)
            return ct_fail(st, "checkpoint: %s", ct_last_error());
        int64_t full = info.has_state ? info.step : ckpt_latest_full(ck->folder, info.step);
        char from[160] = "";
        if (full >= 0 && full < info.step)
            snprintf(from, sizeof from, " (it goes on from step-%" PRId64 ", the newest save with the optimizer state)",
                     full);
        if (full < 0) /* said now: raising training.steps would only get the error of resume_full_below */
            printf("checkpoint: this run already finished at step %" PRId64 " (%s): nothing to train; its save holds "
                   "the model only (checkpoint.last_save_model_only), so it cannot be continued: train on from its "
                   "weights with checkpoint.initial_load_path in a new job.dump_folder\n", info.step, dir);
        else
            printf("checkpoint: this run already finished at step %" PRId64 " (%s): nothing to train; raise "
                   "training.steps to train further%s\n", info.step, dir, from);
        ck->state.step = info.step;
        ck->finished = 1;
        *found = 1;
        return CT_OK;
    }
    if (info.has_state) {
        *found = 1;
        return CT_OK;
    }
    if (info.step == 0) { /* a seed checkpoint (create_seed_checkpoint): the model, then step 1 */
        *found = 2;
        return CT_OK;
    }
    return resume_full_below(s, mf, ck, load_step, info.step, dir, len, found);
}

/* An initial load's error (the one set), at the line that set checkpoint.initial_load_path. Returns st. */
static ct_status initial_load_fail(const manifest *mf, ct_status st) {
    char where[600];
    mf_where(mf, "checkpoint.initial_load_path", where, sizeof where);
    return ct_fail(st, "%s: %s", where, ct_last_error());
}

/* checkpoint.exclude_from_loading: CT_OK when every item is one we know, else CT_ERR_INVALID with the
 * line set. */
static ct_status exclude_list_check(const manifest *mf, const char *exclude) {
    char where[600];
    const char *bad_item = NULL;
    for (const char *p = exclude; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, ",");
        if (len) {
            char item[64];
            snprintf(item, sizeof item, "%.*s", (int)(len < 63 ? len : 63), p);
            for (char *e = item + strlen(item); e > item && e[-1] == ' ';) *--e = 0;
            if (*item && strcmp(item, "optimizer") && strcmp(item, "lr_scheduler") && strcmp(item, "dataloader"))
                bad_item = p;
        }
        p += len;
    }
    if (!bad_item) return CT_OK;
    mf_where(mf, "checkpoint.exclude_from_loading", where, sizeof where);
    return ct_fail(CT_ERR_INVALID, "%s: expected a list of optimizer, lr_scheduler, dataloader; got '%s'", where,
                   exclude);
}

/* The checkpoint keys into a fresh ck, checked; load_step and exclude_from_loading for the caller.
 * CT_OK, or CT_ERR_INVALID with the line set. */
static ct_status ckpt_settings_check(session *s, const manifest *mf, const char *dump, ckpt_plan *ck,
                                     int64_t *load_step, const char **exclude) {
    char where[600];
    memset(ck, 0, sizeof *ck);
    ckpt_settings_read(mf, &ck->cfg); /* the section, once */
    const ckpt_settings *cs = &ck->cfg;
    const char *folder = cs->folder, *mode = cs->async_mode, *dtype = cs->export_dtype;
    ck->enable = cs->enable;
    ck->interval = cs->interval;
    ck->keep = cs->keep;
    *load_step = cs->load_step;
    ck->last_model_only = cs->last_model_only;
    ck->last_in_hf = cs->last_in_hf;
    *exclude = cs->exclude_from_loading;
    ck->state.seed = cs->seed;
    ck->state.dp_size = s->mesh.dp_size > 0 ? s->mesh.dp_size : 1;
    snprintf(ck->folder, sizeof ck->folder, "%s/%s", dump, folder);
    if (strcmp(mode, "disabled") && strcmp(mode, "async")) {
        mf_where(mf, "checkpoint.async_mode", where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: expected disabled or async, got '%s'", where, mode);
    }
    ck->async = !strcmp(mode, "async");
    if (strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")) {
        mf_where(mf, "checkpoint.export_dtype", where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: expected float32 or bfloat16, got '%s'", where, dtype);
    }
    ck->export_bf16 = !strcmp(dtype, "bfloat16");
    if (ck->interval < 1 || ck->keep < 0 || (ck->keep == 1 && ck->async)) {
        mf_where(mf, ck->interval < 1 ? "checkpoint.interval" : "checkpoint.keep_latest_k", where, sizeof where);
        return ct_fail(CT_ERR_INVALID, "%s: need interval >= 1 and keep_latest_k 0 or >= 2 with async saves (the "
                       "newest may still be writing), >= 1 otherwise", where);
    }
    return exclude_list_check(mf, *exclude);
}

const char *ckpt_hf_folder(const char *path, char *buf, size_t len) {
    char probe[PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s/config.json", path) < (int)sizeof probe && access(probe, F_OK) == 0)
        return path;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* ".../step-10/" */
    if (snprintf(buf, len, "%.*s-hf", (int)n, path) >= (int)len ||
        snprintf(probe, sizeof probe, "%s/config.json", buf) >= (int)sizeof probe || access(probe, F_OK) != 0)
        return path;
    return buf;
}

/* checkpoint.initial_load_path, when the run's own folder gave nothing: a Hugging Face model or a
 * model-only load is done here (*found 0); a full checkpoint is checked like a resume and left in dir
 * for the caller to load (*found 1). *found 0 too when no initial load is set. CT_OK, or a status with
 * the line set. */
static ct_status initial_load(session *s, const manifest *mf, const ckpt_plan *ck, char *dir, size_t len,
                              int *found) {
    const char *initial = ck->cfg.initial_load_path;
    ct_status st;
    *found = 0;
    if (!initial) return CT_OK;
    int model_only = ck->cfg.initial_load_model_only, in_hf = ck->cfg.initial_load_in_hf;
    if (in_hf) { /* a Hugging Face folder, read by the pack's table: the model only */
        char beside[PATH_MAX];
        const char *hf = ckpt_hf_folder(initial, beside, sizeof beside);
        if (hf != initial && s->rank == 0)
            printf("checkpoint: %s holds no config.json: loading the Hugging Face export beside it, %s\n", initial, hf);
        if ((st = load_hf(s, hf)) != CT_OK) return initial_load_fail(mf, st);
        printf("checkpoint: loaded the Hugging Face model %s\n", hf);
        return CT_OK;
    }
    struct stat sb;
    if (stat(initial, &sb) == 0 && !S_ISDIR(sb.st_mode)) { /* a model file (model.ctt): the model only */
        if ((st = session_load_model(s, initial)) != CT_OK) return initial_load_fail(mf, st);
        printf("checkpoint: loaded the model file %s\n", initial);
        return CT_OK;
    }
    if ((st = resolve_step_dir(initial, dir, len)) != CT_OK) return initial_load_fail(mf, st);
    if (model_only) {
        if ((st = load_model_checked(s, dir, ck->cfg.allow_config_change)) != CT_OK) return initial_load_fail(mf, st);
        printf("checkpoint: loaded %s (model)\n", dir);
        return CT_OK;
    }
    ckpt_info info; /* a full initial load continues another run: the same checks as a resume */
    if ((st = ckpt_inspect(s, dir, 1, &info)) != CT_OK || (st = config_allowed(ck, dir, &info)) != CT_OK)
        return initial_load_fail(mf, st);
    *found = 1;
    return CT_OK;
}

/* Loads what of dir (CKPT_* bits) the exclusions leave and, with want_state, the train state the
 * run goes on from. CT_OK, or ckpt_load's status with the line set. */
static ct_status resume_load(session *s, ckpt_plan *ck, const char *dir, int what, int want_state,
                             const char *exclude) {
    if (excluded(exclude, "optimizer")) what &= ~CKPT_OPTIMIZER;
    ckpt_train_state st;
    int has_state = 0;
    ct_status rc = ckpt_load(s, dir, what, &st, &has_state);
    if (rc != CT_OK) return ct_fail(rc, "checkpoint: %s", ct_last_error());
    if (want_state && has_state) {
        ck->state.step = st.step;
        ck->state.tokens_seen = st.tokens_seen;
        /* the data position is global: a changed data-parallel degree restarts at the same token */
        ck->state.data_position = excluded(exclude, "dataloader") ? 0 : st.data_position;
        ck->lr_offset = excluded(exclude, "lr_scheduler") ? st.step : 0;
    }
    printf("checkpoint: loaded %s (%s%s), resuming after step %" PRId64 "\n", dir,
           what & CKPT_OPTIMIZER ? "model and optimizer" : "model", want_state && has_state ? ", train state" : "",
           ck->state.step);
    return CT_OK;
}

ct_status ckpt_begin(session *s, const manifest *mf, const char *dump, ckpt_plan *ck) {
    int64_t load_step;
    const char *exclude;
    ct_status st = ckpt_settings_check(s, mf, dump, ck, &load_step, &exclude);
    if (st != CT_OK) return st;
    /* resume from the run's own folder first, else the initial load */
    char dir[PATH_MAX];
    int found = 0, what = CKPT_MODEL | CKPT_OPTIMIZER, want_state = 1;
    if (ck->enable) {
        if ((st = pick_resume(s, mf, ck, load_step, dir, sizeof dir, &found)) != CT_OK) return st;
        if (ck->finished) return CT_OK;
        if (found == 2) { /* a seed checkpoint: the model only */
            what = CKPT_MODEL;
            want_state = 0;
        }
    }
    if (!found && (st = initial_load(s, mf, ck, dir, sizeof dir, &found)) != CT_OK) return st;
    if (!found) return CT_OK;
    return resume_load(s, ck, dir, what, want_state, exclude);
}

static void *write_thread(void *arg) {
    ckpt_plan *ck = arg;
    ck->pending_ok = ckpt_snapshot_write(ck->snap, ck->pending_dir) == CT_OK;
    if (!ck->pending_ok) snprintf(ck->pending_err, sizeof ck->pending_err, "%s", ct_last_error());
    return NULL;
}

/* Completes the async save in flight: join the writer, then the collective commit. CT_OK, or
 * ckpt_commit's status with "checkpoint: ..." set. */
static ct_status finish_pending(session *s, ckpt_plan *ck) {
    if (!ck->pending) return CT_OK;
    pthread_join(ck->thread, NULL);
    ck->pending = 0;
    ckpt_snapshot_free(ck->snap);
    ck->snap = NULL;
    /* the writer's own message, if it failed (ckpt_commit adds one only for another rank's failure) */
    if (!ck->pending_ok) ct_set_error("%s", ck->pending_err);
    ct_status st = ckpt_commit(s, ck->folder, ck->pending_step, &ck->pending_state, ck->pending_ok);
    if (st != CT_OK) return ct_fail(st, "checkpoint: %s", ct_last_error());
    if (s->rank == 0) ckpt_purge(ck->folder, ck->keep);
    return CT_OK;
}

/* One save of `what` at step (async: taken now, written by a thread). CT_OK, or the status of what
 * failed with "checkpoint: ..." set. */
static ct_status save(session *s, ckpt_plan *ck, int64_t step, int what, int export_bf16, int with_state) {
    ct_status st = finish_pending(s, ck);
    if (st != CT_OK) return st;
    if (!ck->async) {
        st = ckpt_save(s, ck->folder, step, with_state ? &ck->state : NULL, what, export_bf16);
        if (st != CT_OK) return ct_fail(st, "checkpoint: %s", ct_last_error());
        if (s->rank == 0) ckpt_purge(ck->folder, ck->keep);
        return CT_OK;
    }
    if ((st = ckpt_prepare(s, ck->folder, step)) != CT_OK) return ct_fail(st, "checkpoint: %s", ct_last_error());
    if (!(ck->snap = ckpt_snapshot_take(s, what, export_bf16)))
        return ct_fail(CT_ERR_NOMEM, "checkpoint: %s", ct_last_error());
    snprintf(ck->pending_dir, sizeof ck->pending_dir, "%s/step-%" PRId64 ".tmp", ck->folder, step);
    ck->pending_step = step;
    ck->pending_state = ck->state;
    ck->pending = 1;
    if (pthread_create(&ck->thread, NULL, write_thread, ck)) { /* no thread: write here */
        ck->pending_ok = ckpt_snapshot_write(ck->snap, ck->pending_dir) == CT_OK;
        ck->pending = 0;
        ckpt_snapshot_free(ck->snap);
        ck->snap = NULL;
        st = ckpt_commit(s, ck->folder, step, &ck->state, ck->pending_ok);
        if (st != CT_OK) return ct_fail(st, "checkpoint: %s", ct_last_error());
    }
    return CT_OK;
}

ct_status ckpt_step(session *s, ckpt_plan *ck, int64_t step, int64_t last_step) {
    if (!ck->enable || ck->finished || step % ck->interval || step == last_step) return CT_OK;
    return save(s, ck, step, CKPT_MODEL | CKPT_OPTIMIZER, 0, 1);
}

ct_status ckpt_save_now(session *s, ckpt_plan *ck, int64_t step) {
    if (!ck->enable) return CT_OK;
    ct_status st = CT_OK;
    if (step % ck->interval) st = save(s, ck, step, CKPT_MODEL | CKPT_OPTIMIZER, 0, 1); /* else ckpt_step saved it */
    ct_status pending = finish_pending(s, ck);
    return st != CT_OK ? st : pending;
}

ct_status ckpt_end(session *s, ckpt_plan *ck, int64_t last_step) {
    if (!ck->enable || ck->finished) return CT_OK;
    ct_status st = CT_OK;
    if (ck->state.step == last_step && last_step > 0) {
        int model_only = ck->last_model_only;
        st = save(s, ck, last_step, model_only ? CKPT_MODEL : CKPT_MODEL | CKPT_OPTIMIZER, model_only && ck->export_bf16,
                  !model_only);
    }
    ct_status pending = finish_pending(s, ck);
    if (st == CT_OK) st = pending;
    if (st == CT_OK && ck->last_in_hf && last_step > 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/step-%" PRId64 "-hf", ck->folder, last_step);
        if ((st = save_hf(s, dir, ck->export_bf16)) != CT_OK)
            return ct_fail(st, "checkpoint: Hugging Face export: %s", ct_last_error());
        printf("checkpoint: Hugging Face model written to %s\n", dir);
    }
    return st;
}

ct_status ckpt_seed(session *s, const manifest *mf, const char *dump) {
    ckpt_settings cs;
    char path[PATH_MAX];
    ckpt_settings_read(mf, &cs);
    snprintf(path, sizeof path, "%s/%s", dump, cs.folder);
    ct_status st = ckpt_save(s, path, 0, NULL, CKPT_MODEL, 0);
    if (st != CT_OK) return ct_fail(st, "seed checkpoint: %s", ct_last_error());
    printf("checkpoint: seed checkpoint written to %s/step-0\n", path);
    return CT_OK;
}
