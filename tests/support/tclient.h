/* A raw protocol client for tests that drive a real hearthd: it speaks frames and the ring
 * directly (no libhearth), so a test can also misbehave. Failures are cmocka assertions. */
#ifndef HEARTH_TESTS_TCLIENT_H
#define HEARTH_TESTS_TCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/fdpass.h"
#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/ring.h"

#define MAX_TOK 512

struct tclient {
	int fd;
	struct frame_reader fr;
	struct ring ring;
	bool have_ring;
	int fds[FDPASS_MAX];
	size_t n_fds;
	uint64_t next_id;
	struct msg welcome;
};

struct gen_result {
	int32_t tokens[MAX_TOK];
	uint32_t n;
	char text[8192];
	size_t text_len;
	struct msg final;       /* done or error */
};

uint64_t tc_now_ms(void);
int tc_connect_path(struct tclient *c, const char *path);
void tc_close(struct tclient *c);
void tc_send_raw(struct tclient *c, const void *p, size_t n);
void tc_send(struct tclient *c, const struct msg *m);
int tc_recv(struct tclient *c, struct msg *out, int timeout_ms);
void tc_hello(struct tclient *c, const char *name);
void tc_drain_ring(struct tclient *c, uint64_t id, struct gen_result *g);
uint64_t tc_generate_start(struct tclient *c, const int32_t *prompt, uint32_t n, uint32_t max_tokens, double temp, uint64_t seed, bool logits);
void tc_generate_wait(struct tclient *c, uint64_t id, struct gen_result *g, int timeout_ms);
void tc_generate(struct tclient *c, const int32_t *prompt, uint32_t n, uint32_t max_tokens, double temp, uint64_t seed, struct gen_result *g);
struct msg tc_simple(struct tclient *c, enum msg_type t);

#endif
