/* Bounded single-producer/single-consumer queue of pointers: the only hand-off between the
 * loop thread and the compute thread (one queue each way). Lock-free, no allocation after
 * queue_init, no syscalls. */
#ifndef HEARTH_DAEMON_QUEUE_H
#define HEARTH_DAEMON_QUEUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "protocol/error.h"

struct queue {
	/* head and tail live on their own cache lines so producer and consumer do not
	 * false-share. */
	_Alignas(64) _Atomic size_t head;   /* next slot to pop; written by the consumer */
	_Alignas(64) _Atomic size_t tail;   /* next slot to push; written by the producer */
	_Alignas(64) size_t mask;
	void **slots;
};

/* cap is rounded up to a power of two. */
int queue_init(struct queue *q, size_t cap, struct hearth_error *err);
void queue_destroy(struct queue *q);
bool queue_push(struct queue *q, void *item);   /* false when full */
void *queue_pop(struct queue *q);               /* NULL when empty */

#endif
