/* Importance statistics for the int4 packer, read from llama.cpp's imatrix files (the GGUF
 * llama-imatrix writes: for each weight matrix NAME, NAME.in_sum2 holds the sum of each
 * input column's squares over calibration text and NAME.counts the tokens behind it). */
#ifndef HEARTH_ENGINE_IMATRIX_H
#define HEARTH_ENGINE_IMATRIX_H

#include <stddef.h>

#include "protocol/error.h"

struct imatrix;

/* Maps and validates path: a GGUF whose general.type (when present) is "imatrix", with at
 * least one NAME.in_sum2 / NAME.counts pair, each F32, of matching expert counts, every
 * value finite and >= 0. Anything else fails naming the file and what is wrong (a legacy
 * .dat imatrix gets the command that converts it). */
int imatrix_open(struct imatrix **out, const char *path, struct hearth_error *err);
void imatrix_close(struct imatrix *im);

/* The column weights of matrix `name` (name_len bytes) with cols columns: *w points at cols
 * floats inside the file (valid until imatrix_close), or is NULL when the file has no
 * statistics for it (the packer then weighs every column alike, as llama-quantize does).
 * A row length that disagrees with the model's, or statistics of several experts for a
 * dense matrix, is HEARTH_EINVAL naming the matrix. */
int imatrix_weights(const struct imatrix *im, const char *name, size_t name_len, size_t cols,
		    const float **w, struct hearth_error *err);

/* How many matrices the file has statistics for. */
size_t imatrix_entries(const struct imatrix *im);

#endif
