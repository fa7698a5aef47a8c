/* Errors as values, shared by every module (kernels/ included, which return these codes
 * rather than -errno): a negative HEARTH_E* code and a caller-owned message that names what
 * was wrong (which file, offset, field or limit). The caller decides what to do; nothing
 * here logs or exits. */
#ifndef HEARTH_PROTOCOL_ERROR_H
#define HEARTH_PROTOCOL_ERROR_H

#include <stddef.h>

enum {
	HEARTH_OK = 0,
	HEARTH_EINVAL = -1,      /* a bad argument or value (config, request field) */
	HEARTH_ENOMEM = -2,      /* an allocation or a budget could not be met */
	HEARTH_EIO = -3,         /* a system call failed; the message carries errno's words */
	HEARTH_EFORMAT = -4,     /* malformed input: file, frame or ring record */
	HEARTH_EUNSUPPORTED = -5,/* well-formed but not handled (tensor type, architecture) */
	HEARTH_ERANGE = -6,      /* a count or size beyond a limit or overflowing */
	HEARTH_ENOTFOUND = -7,   /* a required key, tensor or token is missing */
	HEARTH_EBUSY = -8,       /* a limit on concurrent work was reached */
	HEARTH_EKVFULL = -9,     /* the KV budget cannot hold the request */
	HEARTH_ECLOSED = -10,    /* the peer went away */
	HEARTH_EPROTO = -11,     /* protocol violation by the peer */
	HEARTH_EPERM = -12,      /* refused by policy */
	HEARTH_ETIMEDOUT = -13,
	HEARTH_ECANCELED = -14,
	HEARTH_ESHUTDOWN = -15,  /* the daemon is stopping */
	/* The most negative code: codes run from 0 down to it without gaps, so a new code
	 * takes the next value and moves this (test_error walks the range). */
	HEARTH_ECODE_LAST = HEARTH_ESHUTDOWN,
};

#define HEARTH_ERROR_MSG_MAX 512

struct hearth_error {
	int code;
	char msg[HEARTH_ERROR_MSG_MAX];
};

/* Fills err (which may be NULL) and returns code, so a failing path reads
 * `return hearth_error_set(err, HEARTH_EFORMAT, "%s: ...", path);`. */
int hearth_error_set(struct hearth_error *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Like hearth_error_set, with ": <strerror(errnum)>" appended. */
int hearth_error_errno(struct hearth_error *err, int code, int errnum, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Puts "context: " in front of an error already set, for callers that add where it happened. */
void hearth_error_prefix(struct hearth_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

void hearth_error_clear(struct hearth_error *err);

/* The stable short name of a code ("bad_format", "kv_full"), as used on the wire. */
const char *hearth_strerror(int code);

#endif
