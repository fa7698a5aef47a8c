/* hearth-openai's HTTP listener on libmicrohttpd (client/openai/http.c). */
#ifndef HEARTH_OPENAI_HTTP_H
#define HEARTH_OPENAI_HTTP_H

#include <microhttpd.h>

#include "client/openai/gw.h"

/* Serves g on an already bound and listening socket (TCP or Unix); NULL with msg on failure. */
struct MHD_Daemon *gw_http_start(struct gw *g, int listen_fd, char *msg, size_t cap);

#endif
