/* Requests whose cost grows with their input run on libuv's thread pool instead of the
 * loop thread: tokenizing up to 1 MiB of text takes a second, which would hold every other
 * client's ping. The tokenizer is read-only while a model is loaded; a model is released
 * only after offload_quiesce, so no worker reads a freed tokenizer. */
#ifndef HEARTH_DAEMON_OFFLOAD_H
#define HEARTH_DAEMON_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct server;
struct session;

/* Requests of one connection on the thread pool at once; more are refused `busy`, so a
 * pipelined flood of 1 MiB texts holds at most this many copies. */
#define OFFLOAD_PER_CLIENT 4

/* Tokenizes text (len bytes; owned: freed when done) for request id on a worker, and
 * answers `tokens` or an error from the loop thread once it is done. The session stays
 * allocated until then (it counts as in flight). */
void offload_tokenize(struct session *ss, uint64_t id, char *text, size_t len, bool add_bos,
		      bool special);

/* Tokenizes an embed request's texts (em: owned, freed when done) on a worker, then submits
 * it (session_embed_submit) or answers its refusal from the loop thread. */
struct msg_embed;
void offload_embed(struct session *ss, uint64_t id, int pooling, struct msg_embed *em);

/* Waits (on the loop thread) until no worker uses a tokenizer: before a model is freed. */
void offload_quiesce(struct server *srv);

#endif
