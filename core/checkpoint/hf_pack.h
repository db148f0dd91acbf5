/* hf_pack.h: a model pack created for a Hugging Face folder or a model file without a manifest, so
 * `ctitan convert` and model.flavor: from_checkpoint of a folder go through the pack's own tables (ABI
 * 2.16's hf_import: config.json keys -> options; 2.12's hf_export: tensor names, RoPE rows, config.json
 * fields). The core knows no model here: a folder's model_type picks the pack among the model plugins
 * on the search path.
 *
 * Errors: functions return a ct_status and leave one line for ct_last_error() (base/error.h).
 */
#ifndef CT_HF_PACK_H
#define CT_HF_PACK_H

#include <jansson.h>
#include <stdio.h>

#include "config/manifest.h"
#include "io/hf_export.h"
#include "io/tensorfile.h"
#include "host/host.h"

typedef struct hf_pack {
    plugin *p;               /* the pack */
    manifest *mf;            /* its model section: the options it was created with */
    const ct_model_api *api;
    const ct_hf_import *im;  /* its hf_import (NULL for a pack made from options without one) */
    ct_model *model;
    ct_model_desc desc;
    ct_hf_export x;          /* the instance's table (the model's, valid until hf_pack_close) */
    tf_file *want;           /* every parameter written once: names and shapes, no data; then the buffers */
    int n_buffers;           /* want's last entries that are the pack's buffers (ABI 2.20), not parameters */
    char shared[128];        /* the first shared use ("output.weight" of a tied head), or "" */
    json_t *set;             /* the options set (name -> JSON value), for the description */
    struct ct_tensor **made; /* the shape-only tensors handed to the pack */
    int n_made;
} hf_pack;

/* The model plugin on the search path whose hf_import runs model_type: its path into path (len bytes).
 * CT_ERR_INVALID naming the model types that can be converted when none does. `label` starts the
 * message ("DIR/config.json"). */
ct_status hf_pack_find(const char *model_type, const char *label, char *path, size_t len);

/* The pack for folder DIR, created from its config.json by the pack's hf_import. pack_name: NULL to
 * pick it by model_type, else a pack's name or path. */
ct_status hf_pack_from_folder(const char *dir, const char *pack_name, hf_pack *k);

/* The pack named `name` (a bare name on the search path, or a path); when it cannot be loaded and
 * model_type is given, the pack that runs model_type. Created with `opts` (an object of option ->
 * JSON scalar) and `flavor` (NULL: the pack's first). `label` names the source in messages. */
ct_status hf_pack_from_options(const char *name, const char *model_type, const json_t *opts, const char *flavor,
                               const char *label, hf_pack *k);

/* The description (model_desc.h) of the created model: name, the options (those the model describes
 * and those set), and ct_model_desc's fields. NULL when out of memory. */
json_t *hf_pack_describe(const hf_pack *k);

/* "model: {name: N, KEY: VALUE, ...}": the manifest's model section that runs it, the options in the
 * order of the pack's hf_import, then any other set. */
void hf_pack_print_model(const hf_pack *k, const json_t *desc, FILE *out);

void hf_pack_close(hf_pack *k);

#endif
