/* hearthd-tool's commands: the engine run in-process, without the service. Each parses its
 * own options (argv[0] is the command's name) and returns the process exit status. */
#ifndef HEARTH_DAEMON_TOOLS_TOOLS_H
#define HEARTH_DAEMON_TOOLS_TOOLS_H

#include <stddef.h>

#include "protocol/error.h"

/* `run`: generation with the f32 reference engine, printed as it is sampled. */
int tool_run(int argc, char **argv);

/* `bench`: loads a model into the resident int4 engine and measures it the way the daemon
 * runs it (same loader, same pinned pool): prefill and decode tokens/s for W4A16 and W4A8,
 * and a streaming-read probe on the pool's cores to judge decode against. */
int tool_bench(int argc, char **argv);

/* `imatrix`: an importance matrix from calibration text (llama-imatrix's GGUF), made by the
 * f32 reference engine. */
int tool_imatrix(int argc, char **argv);

/* `render-template`: a chat template rendered over a conversation (JSON files). */
int tool_render(int argc, char **argv);

/* args.c: an integer option in lo..hi, or -1 with "hearthd-tool CMD: NAME 'S' is not an
 * integer in lo..hi" on stderr. */
int tool_parse_long(const char *cmd, const char *name, const char *s, long lo, long hi, long *out);
/* The whole file at path (at most about max bytes) into *out, the caller's to free. */
int tool_read_file(const char *path, size_t max, char **out, size_t *len, struct hearth_error *err);

#endif
