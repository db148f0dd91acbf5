/* manifest.h: the YAML manifest (libyaml), command-line overrides and schema validation.
 *
 * A manifest is a tree of sections; nested maps flatten into dotted keys ("training.steps",
 * "quantize.dense.float8.enable"). Every key carries where it came from (file and line, or the
 * command line) so that every error names it. The schema (core keys plus the options each loaded
 * plugin declares under its section) decides which keys exist and their types. Functions that can fail
 * return a ct_status (or NULL) and leave their one-line message with ct_set_error (base/error.h).
 */
#ifndef CT_MANIFEST_H
#define CT_MANIFEST_H

#include "ctitan/abi.h"

#include <stdint.h>
#include <stdio.h>

typedef struct mf_value {
    char *key;    /* dotted: "training.steps" */
    char *value;  /* the scalar as written; NULL for a sequence or map (type errors) */
    int is_seq;   /* 1: the YAML value was a list of plain values, joined with ',' in value; 2 (MF_ITEMS): a
                   * list of maps, item i's keys flattened under "key[i]." and value the item count (in a data
                   * file, any list, item i being "key[i]"); 3 (MF_MAP, data files only): a map, value NULL,
                   * its keys following it under "key." */
    int line;     /* 1-based line in the manifest, 0 for the command line */
    int flag;     /* command line: MF_FLAG_BARE for `--key` (value "true"), MF_FLAG_NEGATED for `--no-key`
                   * (value "false"); validation refuses either on a key that is not a boolean */
} mf_value;

enum { MF_FLAG_NONE, MF_FLAG_BARE, MF_FLAG_NEGATED };
enum { MF_ITEMS = 2, MF_MAP = 3 }; /* mf_value.is_seq */

typedef struct mf_schema_entry {
    char *key; /* dotted */
    ct_opt_type type;
    char *default_value; /* NULL: unset unless given */
    char *help;
    int plugin; /* declared by a plugin (shown separately in --help) */
    /* Checked for every value given, whether or not the key's feature is on (copies: a plugin read
     * only for its option list is unloaded; NULL: none). range: "[lo, hi]" with '(' or ')' for an
     * open end, both ends numbers; choices: "a|b|c", the only strings accepted. */
    char *range;
    char *choices;
} mf_schema_entry;

typedef struct manifest {
    char *path; /* as given */
    char *dir;  /* its folder, for resolving relative paths */
    mf_value *values;
    int n_values, values_cap;
    int *index;        /* open-addressing hash of values by key: value index + 1, 0 = empty */
    size_t index_cap;  /* a power of two, more than twice n_values; 0 before the first value */
    mf_schema_entry *schema;
    int n_schema;
} manifest;

/* Limits on reading a manifest, which is untrusted input: every cost of reading one is bounded and
 * linear in its size. Each refusal is one "path:line: ..." line naming the limit. */
#define MF_MAX_BYTES (4 << 20)  /* file size */
#define MF_MAX_DEPTH 64         /* maps and lists nested in each other (aliases expanded) */
#define MF_MAX_ANCHORS 1024     /* &anchors (libyaml looks each alias up among them one by one) */
#define MF_MAX_ALIASES 4096     /* *aliases */
#define MF_MAX_NODES (1 << 18)  /* nodes visited while flattening, aliases expanded (alias bombs) */
#define MF_MAX_KEYS 65536       /* keys in all */
#define MF_MAX_KEY_LEN 255      /* one dotted key */
/* Sizes computed from several keys, checked by manifest_validate before anything is allocated */
#define MF_MAX_MICROBATCH_TOKENS (1 << 24) /* training.local_batch_size x training.seq_len */
#define MF_MAX_STEP_TOKENS (1 << 30)       /* training.global_batch_size x training.seq_len */

/* Parses the YAML file: one document whose root is a map of sections; explicit nulls (`key: ~`,
 * `key: null`, `key:`) are refused, so a key is either given a value or left out for its default.
 * On error returns NULL with the message "path:line[:col]: what" set (ct_last_error). */
manifest *manifest_load(const char *path);

/* A YAML file that is not a manifest but is read like one (a hardware profile, core/plan/hardware.c): the
 * same dotted keys with their lines, limits and syntax errors, but read as data for its own reader to
 * check: no schema, no TOML; a top-level key may hold a plain value; every map and every list is an entry
 * of its own placed before what it holds (is_seq MF_MAP, MF_ITEMS), so m->values is the document in
 * order and a reader can tell a map, a list and a plain value apart; an empty value is kept (value NULL)
 * for that reader to refuse naming what it expects; any key given twice is refused (a map given twice:
 * "duplicate section" at the top level), as are anchors, aliases and '[' or ']' in a key. */
typedef struct mf_data_format {
    const char *what; /* the file's kind in messages: "cannot open hardware profile", "a hardware profile has none" */
    const char *root; /* the message for a root that is not a map: "expected a hardware profile: a map of ..." */
    int max_depth;    /* maps and lists nested in each other */
    int max_keys;     /* entries in all: keys, maps, lists and their items */
} mf_data_format;
manifest *manifest_load_data(const char *path, const mf_data_format *format);
/* The value given for key (its text, kind and line), or NULL; no default counts. */
const mf_value *mf_find(const manifest *m, const char *key);
/* Applies one "--section.key=value" (key and value separately). The last override of a key wins. */
ct_status manifest_override(manifest *m, const char *key, const char *value);
/* Applies a bare boolean flag as torchtitan's command line takes them: `--key` (MF_FLAG_BARE, true) or
 * `--no-key` (MF_FLAG_NEGATED, false); manifest_validate refuses it on a key that is not a boolean. */
ct_status manifest_override_flag(manifest *m, const char *key, int flag);
/* One command-line argument "--KEY[=VALUE]" in torchtitan's spellings: '-' in the key read as '_'
 * (tyro's `--training.local-batch-size`), and a negated boolean as `--no-section.key`,
 * `--section.no-key` or `--section.no_key`. Writes the dotted key into key; *value points into arg
 * after '=' or is NULL; *negated is 1 for a negation. CT_OK, or CT_ERR_INVALID with "command line: ..." set. */
ct_status manifest_cli_key(const char *arg, char *key, size_t keylen, const char **value, int *negated);
/* The type of one of the core's keys, or -1 when the core does not declare it (a plugin's, or unknown). */
int manifest_core_type(const char *key);
void manifest_free(manifest *m);
/* An empty manifest whose values all come from the command line (manifest_override): a command
 * that takes plugin options without a YAML file (`ctitan schedule --parallelism.KEY=VALUE`).
 * Relative paths resolve from the working folder. NULL when out of memory. */
manifest *manifest_new(void);
/* Copies `from` (value and where it was set) to `to` when `to` is unset: one setting, two spellings.
 * CT_OK (also when there is nothing to copy), or CT_ERR_NOMEM with "path: out of memory" set. */
ct_status manifest_alias(manifest *m, const char *from, const char *to);

/* torchtitan's spellings that are not ctitan's keys (config/torchtitan_keys.h): a key mapped onto ctitan's
 * is copied there (refused when both disagree), and a torchtitan dataset name (training.dataset = "c4_test")
 * gives way to the dataset_path beside it, or is refused naming that key when the command reads data
 * (reads_data; generate reads none). CT_OK, or a status with one line set. */
ct_status manifest_torchtitan(manifest *m, int reads_data);
/* One of torchtitan's keys that is not ctitan's (torchtitan_keys.h): CT_OK when its value is accepted (or it
 * is mapped, or v's key is none of them), CT_ERR_INVALID with the reason set when refused. */
ct_status manifest_torchtitan_check(const manifest *m, const mf_value *v);

/* Adds the core's keys to the schema. */
void manifest_add_core_schema(manifest *m);
/* Adds a plugin's options under `section` ("model", "optimizer", "device"). The schema keeps
 * copies of every string: the plugin may be unloaded afterwards. */
void manifest_add_plugin_schema(manifest *m, const char *section, const ct_option_spec *opts);
/* Whether a key given under `prefix` ("comm.") is not in the schema yet: a plugin whose section it
 * is has options to add before manifest_validate. */
int manifest_has_unknown(const manifest *m, const char *prefix);
/* Checks every key exists in the schema, parses as its type and lies in its range or choices, then
 * the sizes computed from several keys; the first error is set (ct_last_error) and CT_ERR_INVALID returned. */
ct_status manifest_validate(const manifest *m);

/* Typed getters (after validation): lookups, not failures, so an int and no message. 0 when the key is
 * set or has a default (and parses as the type), -1 when unset: the caller decides whether that is an
 * error. */
int mf_get_str(const manifest *m, const char *key, const char **out);
int mf_get_int(const manifest *m, const char *key, int64_t *out);
int mf_get_float(const manifest *m, const char *key, double *out);
int mf_get_bool(const manifest *m, const char *key, int *out);
/* Whether the manifest or the command line gives the key (a default does not count). */
int mf_is_set(const manifest *m, const char *key);
/* The item count of a list of maps at key (its items' keys are "key[0].path", ...), or -1 when the key
 * holds a plain value or is unset. On the command line, --key=value replaces the whole list and
 * --key[N].field=value changes one field of an item. */
int mf_list_len(const manifest *m, const char *key);
/* Where a key was set: "path:line" or "command line" (for errors about values). */
void mf_where(const manifest *m, const char *key, char *buf, size_t len);

/* Prints the effective configuration (every schema key with its value) as YAML. */
void manifest_print(const manifest *m, FILE *f);
/* Prints the schema as help text. */
void manifest_print_schema(const manifest *m, FILE *f);

/* Parsers shared with plugins' option getters: 0 when s parses as the type (*out set), -1 when it does
 * not (or s is NULL). No message: the caller names the key or argument. */
int mf_parse_int(const char *s, int64_t *out);
int mf_parse_float(const char *s, double *out);
int mf_parse_bool(const char *s, int *out);

#endif
