/* SPSC pointer queue: the producer publishes a slot with a release store of tail, the
 * consumer frees it with a release store of head; each side reads the other's index with
 * acquire, which is all the ordering a single producer and consumer need. */
#include "daemon/serve/queue.h"
#include "protocol/assert.h"

#include <stdlib.h>

int queue_init(struct queue *q, size_t cap, struct hearth_error *err)
{
	size_t n = 2;
	while (n < cap) {
		if (n > ((size_t)-1) / 4)
			return hearth_error_set(err, HEARTH_ERANGE, "queue: capacity %zu too large", cap);
		n <<= 1;
	}
	q->slots = calloc(n, sizeof *q->slots);
	if (!q->slots)
		return hearth_error_set(err, HEARTH_ENOMEM, "queue: cannot allocate %zu slots", n);
	q->mask = n - 1;
	atomic_init(&q->head, 0);
	atomic_init(&q->tail, 0);
	return 0;
}

void queue_destroy(struct queue *q)
{
	free(q->slots);
	q->slots = NULL;
}

bool queue_push(struct queue *q, void *item)
{
	size_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
	size_t head = atomic_load_explicit(&q->head, memory_order_acquire);
	hearth_assert(tail - head <= q->mask + 1); /* never more items than slots */
	if (tail - head > q->mask)
		return false;
	q->slots[tail & q->mask] = item;
	atomic_store_explicit(&q->tail, tail + 1, memory_order_release);
	return true;
}

void *queue_pop(struct queue *q)
{
	size_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
	size_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
	hearth_assert(tail - head <= q->mask + 1); /* the consumer never passes the producer */
	if (head == tail)
		return NULL;
	void *item = q->slots[head & q->mask];
	atomic_store_explicit(&q->head, head + 1, memory_order_release);
	return item;
}
