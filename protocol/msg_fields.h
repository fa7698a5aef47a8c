/* The one description of each message's fields, read by both the encoder and the decoder
 * so a field cannot exist on one side only: its wire key, its type, where it lives in the
 * C struct, its bounds, and when the encoder leaves it out. Private to protocol/ (and its
 * tests). */
#ifndef HEARTH_PROTOCOL_MSG_FIELDS_H
#define HEARTH_PROTOCOL_MSG_FIELDS_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/msg.h"

enum field_kind {
	FK_U32, FK_U64, FK_F64, FK_F32, FK_BOOL, FK_STR,
	FK_U32S,      /* array of unsigned integers */
	FK_STRS,      /* array of strings */
	FK_MAP,       /* a nested map described by sub */
	FK_MAPS,      /* an array of nested maps described by sub */
	FK_TOP,       /* array of [token, logprob] pairs */
	FK_ERRCODE,   /* enum msg_errcode as its wire name */
	FK_FINISH,    /* enum msg_finish as its wire name */
	FK_U32SS,     /* array of arrays of unsigned integers (struct msg_u32s) */
	FK_BIN,       /* msgpack bin, into struct msg_bytes */
};

#define FF_REQUIRED 1u
#define FF_UTF8 2u       /* strings: must be valid UTF-8 */
#define FF_NONEMPTY 4u   /* strings and arrays: at least one byte/element */
#define FF_MIN_OPEN 8u   /* numbers: strictly above min */
#define FF_OMIT_ZERO 16u /* the encoder leaves out a false, zero or empty value */
#define FIELD_NO_OFF UINT32_MAX

struct field_table;

/* off: the value, relative to the table's base struct; off_n: element count for arrays;
 * off_has: a bool set when the field is present (the encoder writes the field only when it
 * is true). min/max bound a number, or the bytes of a string, or the elements of an array;
 * elem_max bounds array elements (bytes of each string, value of each integer). */
struct field {
	const char *key;
	uint8_t kind;
	uint8_t flags;
	uint32_t off;
	uint32_t off_n;
	uint32_t off_has;
	double min;
	double max;
	double elem_max;
	const struct field_table *sub; /* FK_MAP, FK_MAPS */
};

struct field_table {
	const struct field *fields;
	size_t n_fields;
	size_t size;  /* of the struct the fields live in (an FK_MAPS element) */
};

struct msg_type_desc {
	enum msg_from from;
	struct field_table body;  /* fields of the top map besides `t` and `id` */
};

#define FIELD_U32MAX 4294967295.0
#define FIELD_U64MAX 18446744073709551615.0

extern const struct msg_type_desc msg_types[MSG_TYPE_COUNT];

#endif
