/* JSON Schema to GBNF, with llama.cpp's converter's whitespace policy and property order
 * (required properties first, each group in schema order). What it cannot enforce it
 * refuses with the keyword and the JSON pointer of the schema node; nothing is ignored
 * except annotations (title, description, examples, ...). */
#ifndef HEARTH_DAEMON_JSON_SCHEMA_H
#define HEARTH_DAEMON_JSON_SCHEMA_H

#include <jansson.h>

#include "protocol/error.h"

/* Bounds that keep hostile schemas cheap. */
#define JSON_SCHEMA_MAX_DEPTH 64       /* nesting of schema objects */
#define JSON_SCHEMA_MAX_RULES 4096     /* generated rules */
#define JSON_SCHEMA_MAX_OUTPUT (1u << 20)
#define JSON_SCHEMA_MAX_ITEMS 1000     /* minItems/maxItems/minLength/maxLength bounds */

/* Writes a malloc'ed NUL-terminated GBNF text to *out (root = the schema's instance). */
int json_schema_to_gbnf(const json_t *schema, char **out, struct hearth_error *err);

#endif
