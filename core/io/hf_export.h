/* hf_export.h: a model's parameters -> a Hugging Face folder, by a table the model pack supplies
 * (ct_hf_export, ABI 2.12): tensor names mapped by patterns, RoPE rows permuted where marked, and a
 * config.json written from the pack's fields as transformers writes one (json.dumps(indent=2,
 * sort_keys=True), floats as Python prints them). The core knows no model's names here.
 *
 * Errors: functions return a ct_status and leave one line for ct_last_error() (base/error.h).
 */
#ifndef CTITAN_HF_EXPORT_H
#define CTITAN_HF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/error.h"
#include "ctitan/model.h"
#include "io/tensorfile.h"

/* What the exported tensors hold. */
typedef enum hf_dtype { HF_FLOAT32, HF_BFLOAT16 } hf_dtype;

/* The Hugging Face name of ctitan parameter `name` under x's table (into hf, len bytes) and its
 * CT_HF_* flags; CT_ERR_INVALID naming the parameter when no pattern matches it. */
ct_status hf_export_name(const ct_hf_export *x, const char *name, char *hf, size_t len, uint32_t *flags);

/* Everything hf_export_save needs, checked without writing: every entry of w (float32, 1-D or 2-D)
 * maps to a distinct name; a CT_HF_ROPE_ROWS tensor has rows in whole heads of head_dim (even);
 * the fields are well formed. `who` names the table's owner in messages ("model qwen3"). */
ct_status hf_export_check(const ct_hf_export *x, const tf_file *w, int64_t head_dim, const char *who);

/* Writes DIR/model.safetensors (metadata format "pt") and DIR/config.json, each atomically;
 * creates DIR. The output is a function of the inputs only, byte for byte. */
ct_status hf_export_save(const char *dir, const ct_hf_export *x, const tf_file *w, int64_t head_dim,
                         hf_dtype dtype, const char *who);

/* Reads the Hugging Face folder DIR by x's table backwards: DIR/config.json's model_type must be
 * x->model_type and its CT_HF_CHECKED fields equal x's; every parameter of `want` (names and shapes;
 * its data is not read) must be in the folder with its shape (any safetensors dtype, converted to
 * float32; marked rows un-permuted), and every tensor of the folder must be one of them. *out: the
 * parameters in want's order (free with tf_free). */
ct_status hf_import_load(const char *dir, const ct_hf_export *x, const tf_file *want, int64_t head_dim,
                         const char *who, tf_file **out);

/* The same, for a folder whose config.json set the model's options (a pack created from it by its
 * hf_import links, ABI 2.16): a CT_HF_CHECKED field that differs is what the pack cannot run ("KEY must
 * be VALUE"), and one the links read may be absent (it was read as transformers' default). */
ct_status hf_import_load_folder(const char *dir, const ct_hf_export *x, const ct_hf_option *links, const tf_file *want,
                                int64_t head_dim, const char *who, tf_file **out);

/* Only the config.json part of hf_import_load_folder: model_type and the CT_HF_CHECKED fields. */
ct_status hf_import_check_folder(const char *dir, const ct_hf_export *x, const ct_hf_option *links, const char *who);

/* Whether x's table has a CT_HF_TIED row for parameter `name` (an untied head that reads a tied folder's
 * table). */
int hf_tied_row(const ct_hf_export *x, const char *name);

/* config.json's JSON (the caller json_decref's it: at most 1 MB, no duplicate key), or NULL and an error
 * naming the file. */
json_t *hf_config_read(const char *path);

/* root's value at the '.'-separated key ("rope_scaling.factor"), or NULL. */
json_t *hf_config_get(json_t *root, const char *key);

/* config.json (root) as transformers 4 writes it, whichever version wrote it: rope_parameters (5) read
 * as rope_scaling, which becomes null (plain RoPE), the frequency-band type or YaRN, with every key
 * (hf_read_rope's, rope_json's), and rope_theta the top-level key. *view: a new reference. A RoPE type or
 * YaRN setting ctitan does not run is refused, naming it (path names the file). */
ct_status hf_config_view(json_t *root, const char *path, json_t **view);

/* Hugging Face's frequency-band RoPE scaling (transformers' rope_type "llama3", Llama 3.1's; the
 * same as ct_model_desc.rope_*): factor 0 is plain RoPE. yarn: transformers' rope_type "yarn" instead
 * (factor, orig, beta_fast, beta_slow, mscale_all_dim; cos and sin unscaled, which is what ctitan's
 * YaRN runs: DeepSeek-V3's softmax scale times (0.1 mscale_all_dim ln factor + 1)^2). */
#define HF_ROPE_BANDS "llama3"
typedef struct hf_rope {
    double factor, low, high; /* factor, low_freq_factor, high_freq_factor */
    int64_t orig;             /* original_max_position_embeddings */
    int yarn;
    double beta_fast, beta_slow, mscale_all_dim;
} hf_rope;

/* DIR/config.json's RoPE scaling, from rope_scaling (transformers 4) or rope_parameters (5), which
 * must agree when both scale; rope_type default (or none) is plain. YaRN and any other rope_type are
 * refused, naming it: this is the reader for models whose description (ct_model_desc) carries the
 * scaling; a pack whose table checks rope_scaling itself reads YaRN through hf_config_view. */
ct_status hf_read_rope(const char *dir, hf_rope *out);

/* config.json's text for x (malloc'd; NULL and an error when a field is malformed). */
char *hf_export_config(const ct_hf_export *x, hf_dtype dtype, const char *who);

/* Shortest decimal that reads back as x, always with a '.' or an exponent, as Python's repr writes a
 * float ("500000.0", "1e-05"). */
void hf_format_double(char *out, size_t len, double x);

/* The q/k row permutation of one (n_heads * head_dim, cols) matrix: to_hf = 1 from ctitan's
 * interleaved layout to Hugging Face's, 0 back. dst and src must not overlap. */
void hf_permute_rows(float *dst, const float *src, int64_t n_heads, int64_t head_dim, int64_t cols, int to_hf);

#endif
