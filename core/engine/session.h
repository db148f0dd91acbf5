/* session.h: a run's pieces, built from a manifest: plugins, device, model, runtime, optimizer. */
#ifndef CT_SESSION_H
#define CT_SESSION_H

#include "ctitan/device.h"
#include "ctitan/model.h"
#include "ctitan/optimizer.h"
#include "ctitan/quantizer.h"
#include "ctitan/strategy.h"
#include "host/host.h"
#include "config/manifest.h"
#include "engine/pipeline.h"
#include "engine/runtime.h"
#include "tools/tokenizer.h"

/* Exit statuses: bad input (manifest, options, data files) and failures while running. */
#define EXIT_BAD_INPUT 2
#define EXIT_RUN_FAILED 1

typedef struct session {
    manifest *mf;
    plugin *devp, *modelp, *optp, *commp, *stratp, *quantp, *axisp;
    const ct_quantizer_api *qapi; /* NULL: no float8 */
    ct_quantizer *quant;
    const ct_comm_api *capi; /* NULL on one rank */
    ct_comm *comm;
    const ct_strategy_api *sapi, *xapi; /* the data-parallel strategy; the one serving the tp mesh axis */
    ct_strategy *strat, *xstrat;
    ct_mesh_info mesh;
    int rank, world;
    const ct_device_api *d;
    ct_device *dev;
    const ct_model_api *m;
    ct_model *model;
    const ct_optimizer_api *o;
    ct_optimizer *opt;
    runtime rt;
    int rt_ready;
    char *opt_mem;   /* one allocation: state_count f32 values per parameter element */
    size_t opt_bytes;
    int n_state;
    pipeline *pl;      /* pipeline parallel (pp > 1), else NULL */
    double peak_flops; /* measured matmul peak of the device at matmul_precision, FLOP/s (0 if unknown) */
    int opt_calls;                /* optimizer calls in the last step (contiguous tensors merged) */
    const char *matmul_precision; /* "f32", or "bf16" once the device took set_matmul_dtype(CT_BF16) */
} session;

/* Command-line arguments common to train/generate: a manifest and --section.key=value overrides. */
typedef struct run_args {
    const char *config;
    int print_config, dry_run, help;
    const char *checkpoint; /* generate: model file */
    const char *prompt;     /* generate: overrides generate.prompt */
} run_args;

/* Parses argv after the subcommand into args and applies overrides to a freshly loaded manifest.
 * Returns the manifest, or NULL after printing one error line (*status set). */
manifest *session_parse(int argc, char **argv, run_args *args, const char *usage, int *status);

/* Loads plugins, validates the manifest, creates device and model; with `with_params`, also the
 * runtime (parameters initialised) and `with_optimizer` the optimizer and its states.
 * Prints one error line and returns the exit status on failure, 0 on success. */
int session_open(session *s, manifest *mf, int with_params, int with_optimizer);
void session_close(session *s);

/* A path from the manifest: as given when it exists (or is absolute), else relative to the
 * manifest's folder. */
void session_resolve_path(const manifest *mf, const char *p, char *out, size_t len);

/* Writes the parameters to a ctt file (atomic). */
int session_save_model(session *s, const char *path, char *err, size_t errlen);
int session_load_model(session *s, const char *path, char *err, size_t errlen);

/* Opens model.tokenizer_path and checks it against the model (every id it makes is a row of the
 * embedding). Prints one line naming the key and returns EXIT_BAD_INPUT, or 0 with *tok set. */
int session_open_tokenizer(session *s, ct_tokenizer **tok);
/* Samples up to max_new tokens after `prompt` and prints the text (rank 0). Sizes are checked, and
 * memory grows with the tokens made. */
int session_generate(session *s, const ct_tokenizer *tok, const char *prompt, int64_t max_new, double temperature,
                     int64_t top_k, double top_p, uint64_t seed, int64_t max_context);

/* One optimizer step. inputs, targets: this rank's G sequences (its slice of the global batch; the
 * whole batch on one rank), (G, T) on the host, run in microbatches of L: zero grads,
 * forward/backward each microbatch with the loss normalised by the global batch's valid-token
 * count, global grad norm over every rank, clip to max_norm, optimizer step at lr on local storage.
 * *loss and *valid are global.
 * Returns 0, -1 on a failure (ct_last_error), 1 when the norm is not finite (nothing updated). */
int session_train_step(session *s, const int32_t *inputs, const int32_t *targets, int64_t G, int64_t L, int64_t T,
                       double lr, double max_norm, int64_t step, double *loss, double *norm, int64_t *valid);

int cmd_train(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_plugins(int argc, char **argv);
int cmd_launch(int argc, char **argv);
/* Under `ctitan launch`: records this rank's exit status for the launcher. */
void launch_record_status(int status);
/* In a rank started by `ctitan launch`: registers its pid for the launcher's signal forwarding and
 * ends the rank when the launcher or its parent (mpirun) ends. No-op otherwise. */
void launch_rank_start(void);
/* Started by torchrun (WORLD_SIZE) or srun (SLURM_STEP_NUM_TASKS) with several processes but not
 * as an MPI job (each would be rank 0 of 1): EXIT_BAD_INPUT with one line saying how to launch; else
 * 0. Call before the comm plugin joins (an MPI singleton sets MPI's variables). */
int launch_check_world(void);

#endif
