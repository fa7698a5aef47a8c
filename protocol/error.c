/* The one implementation of error values: formatting into the caller's buffer and the
 * stable names that the wire protocol and logs use for each code. */
#include "protocol/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int hearth_error_set(struct hearth_error *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return code;
}

int hearth_error_errno(struct hearth_error *err, int code, int errnum, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < sizeof err->msg)
			snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errnum));
		err->code = code;
	}
	return code;
}

void hearth_error_prefix(struct hearth_error *err, const char *fmt, ...)
{
	if (!err)
		return;
	char head[HEARTH_ERROR_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(head, sizeof head, fmt, ap);
	va_end(ap);
	/* "head: old message", cut at the buffer's end rather than dropping the old words. */
	size_t cap = sizeof err->msg - 1;
	size_t hl = strlen(head);
	if (hl > cap - 2)
		hl = cap - 2;
	size_t ml = strnlen(err->msg, sizeof err->msg);
	if (ml > cap - hl - 2)
		ml = cap - hl - 2;
	memmove(err->msg + hl + 2, err->msg, ml);
	memcpy(err->msg, head, hl);
	err->msg[hl] = ':';
	err->msg[hl + 1] = ' ';
	err->msg[hl + 2 + ml] = '\0';
}

void hearth_error_clear(struct hearth_error *err)
{
	if (err) {
		err->code = HEARTH_OK;
		err->msg[0] = '\0';
	}
}

const char *hearth_strerror(int code)
{
	switch (code) {
	case HEARTH_OK: return "ok";
	case HEARTH_EINVAL: return "bad_value";
	case HEARTH_ENOMEM: return "no_memory";
	case HEARTH_EIO: return "io_error";
	case HEARTH_EFORMAT: return "bad_format";
	case HEARTH_EUNSUPPORTED: return "unsupported";
	case HEARTH_ERANGE: return "too_large";
	case HEARTH_ENOTFOUND: return "not_found";
	case HEARTH_EBUSY: return "busy";
	case HEARTH_EKVFULL: return "kv_full";
	case HEARTH_ECLOSED: return "closed";
	case HEARTH_EPROTO: return "protocol_error";
	case HEARTH_EPERM: return "forbidden";
	case HEARTH_ETIMEDOUT: return "timed_out";
	case HEARTH_ECANCELED: return "canceled";
	case HEARTH_ESHUTDOWN: return "shutting_down";
	}
	return "unknown_error";
}
