/* checkpoint.h: distributed checkpoints.
 *
 * A checkpoint is a folder `step-N` holding, per rank that has something to save, `rank-R.bin`
 * (its pieces, back to back) and `rank-R.json` (what each piece is), and `metadata.json`, written
 * last by rank 0: every tensor's global shape and dtype, every piece's box (offsets and sizes per
 * dimension of the global tensor), file, byte offset, length and FNV-1a 64 checksum, and the
 * training state. A save goes to `step-N.tmp` and is renamed once complete (fsync'd), so a folder
 * named `step-N` with a metadata.json is always whole; anything else is ignored and cleaned.
 *
 * Loading reshards: each rank computes the box its current layout needs for every tensor and
 * copies the intersections from whichever pieces cover it, whatever layout wrote them.
 * Tensors: "<fqn>" (parameters) and "optimizer.<k>.<fqn>" (the optimizer's k-th state).
 *
 * Errors: a function here that can fail returns CT_OK or a status (NULL for a pointer) with its one
 * line set (base/error.h), and prints nothing; the loop's side below prints its own.
 */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include "checkpoint/settings.h"
#include "engine/session.h"

#include <stdint.h>

typedef struct ckpt_train_state {
    int64_t step;          /* optimizer steps done */
    int64_t tokens_seen;   /* over all ranks */
    int64_t data_position; /* the data loader's next global sequence number */
    int64_t seed;
    int64_t dp_size;       /* data-parallel ranks when saved */
} ckpt_train_state;

#define CKPT_MODEL 1
#define CKPT_OPTIMIZER 2

/* Saves what `what` says (and the train state when st != NULL) into folder/step-N. Collective:
 * every rank calls it. export_bf16 rounds the model to bf16 values (stored as f32). */
ct_status ckpt_save(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int what,
                    int export_bf16);
/* The parts of a save, for saving on a background thread (checkpoint.async_mode):
 *   ckpt_prepare (collective)  -> ckpt_snapshot_take (device -> host copy; training may go on)
 *   -> ckpt_snapshot_write (files; any thread: its error is that thread's) -> ckpt_commit
 *   (collective: metadata, rename). A rank whose write failed (wrote_ok 0) calls ckpt_commit with that
 *   write's error set: the commit fails with it; another rank's failure gets a line of its own. */
typedef struct ckpt_snapshot ckpt_snapshot;
ct_status ckpt_prepare(session *s, const char *folder, int64_t step);
ckpt_snapshot *ckpt_snapshot_take(session *s, int what, int export_bf16);
ct_status ckpt_snapshot_write(const ckpt_snapshot *sn, const char *dir);
void ckpt_snapshot_free(ckpt_snapshot *sn);
ct_status ckpt_commit(session *s, const char *folder, int64_t step, const ckpt_train_state *st, int wrote_ok);

/* The steps N of the complete folder/step-N (with a metadata.json), newest first, in *steps (free
 * it) and their count in *count; CT_ERR_INVALID when a step folder holds rank pieces but no
 * metadata.json (deleted by hand: never silently skipped, nor overwritten). `clean` (rank 0 only):
 * removes interrupted saves (step-N.tmp) and finishes interrupted replacements (step-N.old). */
ct_status ckpt_steps(const char *folder, int clean, int64_t **steps, int *count);
/* The newest step below `below` whose save holds the full training state (not model-only), or -1. */
int64_t ckpt_latest_full(const char *folder, int64_t below);

/* What a step folder's metadata.json says, once validated as untrusted input: every field's type
 * and range, the pieces against the shapes, world_size and mesh against each other and against the
 * rank indexes present, the step against the folder's name. */
typedef struct ckpt_info {
    int64_t step;
    int world_size;
    int has_state;     /* a train_state (full save); 0: model only */
    int has_optimizer; /* optimizer.* tensors */
    int has_config;    /* the run's settings were recorded (checkpoints of older ctitan: not) */
    ckpt_train_state state;
    char config_diff[256]; /* "training.seed 0; this run has 1": the first difference, or "" */
} ckpt_info;
/* resume: compare the data settings (training.seed, seq_len) too, not only the model's. */
ct_status ckpt_inspect(session *s, const char *step_dir, int resume, ckpt_info *info);
/* Loads `what` from a step folder into this rank's storage, resharding. *st gets the train state
 * when the checkpoint has one (*has_state = 1). Collective only in that every rank reads files. */
ct_status ckpt_load(session *s, const char *step_dir, int what, ckpt_train_state *st, int *has_state);
/* Validates a metadata.json text (structure, shapes, every piece's box and size); for fuzzing. The
 * error starts with label. */
ct_status ckpt_check_metadata(const char *text, size_t len, const char *label);
/* Deletes all but the newest k checkpoints (k <= 0: keep all), never the newest full-state one. */
void ckpt_purge(const char *folder, int64_t keep);

/* `model.flavor: from_checkpoint`: the model of checkpoint.initial_load_path (checkpoint.initial_load_in_hf:
 * a Hugging Face folder) into the manifest, as mdesc_apply. CT_OK (also when the flavor is another),
 * or CT_ERR_INVALID after one error line. */
ct_status mdesc_from_checkpoint(manifest *mf);

/* Writes the parameters to a ctt file, the model's description first (atomic; every rank gathers,
 * rank 0 writes). Prints nothing: CT_OK, or a status with the error set. */
ct_status ckpt_save_model(session *s, const char *path);


/* ---- the training loop's side (ckpt_run.c) ---- */
#include <pthread.h>

typedef struct ckpt_plan {
    ckpt_settings cfg; /* the section's keys, read once by ckpt_begin */
    int enable, async, last_model_only, export_bf16, last_in_hf;
    int64_t interval, keep;
    char folder[4096];
    ckpt_train_state state; /* the loop keeps step, tokens_seen and data_position current */
    int64_t lr_offset;      /* lr_scheduler excluded from loading: the schedule restarts */
    /* async_mode: a save whose files a thread is writing */
    pthread_t thread;
    int pending, pending_ok;
    int64_t pending_step;
    ckpt_train_state pending_state;
    ckpt_snapshot *snap;
    char pending_dir[4200];
    char pending_err[1024]; /* the writer's error, copied from its thread's */
    int finished; /* the newest checkpoint is at training.steps: nothing to train, nothing to save */
} ckpt_plan;

/* The training loop's side returns CT_OK, or the status of what failed with one line set (nothing
 * printed; the loop prints it after "ctitan: "). */
/* Reads the checkpoint section and resumes from the newest checkpoint (or initial_load_path). */
ct_status ckpt_begin(session *s, const manifest *mf, const char *dump_folder, ckpt_plan *ck);
/* After step `step`: a periodic save when due (and completes an async save in flight). */
ct_status ckpt_step(session *s, ckpt_plan *ck, int64_t step, int64_t last_step);
/* After the loop: completes any async save, then the final save. */
ct_status ckpt_end(session *s, ckpt_plan *ck, int64_t last_step);
/* A stop before the last step: a full, resumable save of `step` now (unless the periodic save of this
 * step was just made), with any async save committed. CT_OK when checkpoints are off. */
ct_status ckpt_save_now(session *s, ckpt_plan *ck, int64_t step);
/* `checkpoint.create_seed_checkpoint`: saves step-0 (model only) and returns. */
ct_status ckpt_seed(session *s, const manifest *mf, const char *dump_folder);
/* generate: the model of the file it loads (path: a model file, step or checkpoint folder) into the
 * manifest, as mdesc_apply (model_desc.h) without comparing the flavor. CT_OK also when the file has
 * no description or does not exist (the load reports that); CT_ERR_INVALID after one error line. */
ct_status mdesc_for_load(manifest *mf, const char *path);
/* Loads the model from a step folder or a checkpoint folder (its newest step). CT_OK, or a status
 * with the error set (nothing printed). */
ct_status ckpt_load_model_from(session *s, const char *path);
/* The Hugging Face folder checkpoint.initial_load_path names: path itself when it holds a config.json;
 * else, when there is one, the export checkpoint.last_save_in_hf wrote beside that step folder
 * (".../step-10/" -> ".../step-10-hf", in buf), which torchtitan's next command loads by the step's
 * own path; else path (whose load then says what is missing). */
const char *ckpt_hf_folder(const char *path, char *buf, size_t len);

/* checkpoint.last_save_in_hf: CT_OK when the model can be written as a Hugging Face folder by its
 * pack's own table (ABI 2.12; a pack without one is refused); else CT_ERR_INVALID and one line
 * starting with `who` (the manifest key's place). Reads shapes only: call before training. */
ct_status ckpt_hf_export_check(session *s, const char *who);

#endif
