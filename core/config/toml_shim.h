/* toml_shim.h: torchtitan's TOML configs read by a packaged parser (toml++, in toml_shim.cpp, the one C++
 * file of the core), handed to the manifest as the leaves YAML would give: dotted key, the value as
 * text, its kind and its line. */
#ifndef CT_TOML_SHIM_H
#define CT_TOML_SHIM_H

#include "ctitan/abi.h"

#include <stddef.h>

enum {
    MF_TOML_SCALAR, /* a string, number or boolean, as text ("3e-4", "true") */
    MF_TOML_LIST,   /* an array of plain values, joined with ',' */
    MF_TOML_ITEMS,  /* an array of tables ([[training.dataset]]): its items' keys came first as "key[i].field";
                     * value is the item count */
    MF_TOML_NESTED, /* an array of arrays, which no manifest key takes: the visitor refuses it by its key */
};

/* Called once per leaf (tables in key order, arrays in order); CT_OK to go on, another status to stop
 * (it set the error). */
typedef ct_status (*mf_toml_visit)(void *ctx, const char *key, const char *value, int kind, int line);

/* Parses text (n bytes, named path in errors) and visits every leaf. Returns CT_OK, or a status with one
 * line set (ct_set_error): "path:line:col: what" for a syntax error, "path:line: key: what" for a value no
 * manifest holds (a date, an array of arrays), or the visitor's. Maps nested deeper than max_depth are
 * refused. */
ct_status mf_toml_parse(const char *path, const char *text, size_t n, int max_depth, mf_toml_visit visit,
                        void *ctx);


#endif
