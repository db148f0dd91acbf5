/* model_desc.h: the description every saved model carries, so that it can be used without its
 * manifest: `convert --to hf` and `generate` need no shape flags, and `model.flavor: from_checkpoint`
 * takes the model from checkpoint.initial_load_path.
 *
 * A description is a JSON object:
 *   {"format": "ctitan-model", "version": 1,
 *    "name": "llama3", "flavor": "debugmodel",          (model.name and model.flavor as run)
 *    "options": {"dim": 128, "n_heads": 4, ...},         (every model.* option of the pack with a value:
 *                                                        the model's own for those it describes, else
 *                                                        the manifest's; unset ones are left out)
 *    "model": {"dim": 128, "n_layers": 2, ...}}         (ct_model_desc's fields, rope scaling included)
 * It is stored in model.ctt as the text entry "ctitan.description" (tensorfile.h, tf_text) and in a
 * checkpoint's metadata.json as "model". Files without one (older ctitan, golden files) load as
 * before: the manifest alone says what the model is.
 *
 * Descriptions are read as untrusted input: mdesc_check refuses anything but the shape above, with
 * option keys of at most 64 characters, strings of at most 4095. */
#ifndef CT_MODEL_DESC_H
#define CT_MODEL_DESC_H

#include "config/manifest.h"
#include "engine/session.h"

#include <jansson.h>

#define MDESC_ENTRY "ctitan.description"

/* The running model's description (after session_open with parameters). NULL when out of memory. */
json_t *mdesc_build(const session *s);
/* CT_OK when d has the shape above, else CT_ERR_INVALID and "label: what is wrong" set. */
ct_status mdesc_check(const json_t *d, const char *label);
/* The description of a model file (.ctt), a step folder, a checkpoint folder (its newest step) or,
 * with in_hf, a Hugging Face folder (the pack its config.json's model_type names, created from it:
 * hf_pack.h; no flavor). CT_OK with *out NULL when the file has none;
 * CT_OK with *out (the caller's reference) when it has one; else a status and one line set. */
ct_status mdesc_read(const char *path, int in_hf, json_t **out);
/* A ct_model_desc field of d ("n_heads"): 1 and *out when present, else 0. */
int mdesc_field(const json_t *d, const char *field, double *out);

/* Sets the description's model.name, model.flavor and options in the manifest where it does not
 * set them; a key it sets must agree, else CT_ERR_INVALID and "where: model.KEY: VALUE contradicts the
 * checkpoint's VALUE (label)" set. compare_flavor: 0 leaves an explicit model.flavor alone (a
 * model load needs the same weights, not the same preset). */
ct_status mdesc_apply(manifest *mf, const json_t *d, const char *label, int compare_flavor);

/* mdesc_for_load (generate's), mdesc_from_checkpoint and ckpt_save_model are declared in checkpoint.h, for
 * files that cannot include jansson. */

#endif
