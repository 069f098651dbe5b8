/* A plain bufferevent's reads (sized from the previous ones, no FIONREAD) and km_net_move, over loopback TCP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <cmocka.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "kmirror/net.h"
#include "unit_tcp.h"

/* ---- libevent's allocations, counted: what its buffers hold, capacity and not bytes ---- */

static size_t live_bytes;

typedef union {
	size_t n;
	max_align_t align;
} mm_head;

static void *mm_malloc(size_t n)
{
	mm_head *h = malloc(sizeof(*h) + n);
	if (!h)
		return NULL;
	h->n = n;
	live_bytes += n;
	return h + 1;
}

static void mm_free(void *p)
{
	mm_head *h;
	if (!p)
		return;
	h = (mm_head *)p - 1;
	live_bytes -= h->n;
	free(h);
}

static void *mm_realloc(void *p, size_t n)
{
	mm_head *h = p ? (mm_head *)p - 1 : NULL, *g;
	size_t old = h ? h->n : 0;
	if (!(g = realloc(h, sizeof(*g) + n)))
		return NULL;
	live_bytes = live_bytes - old + n;
	g->n = n;
	return g + 1;
}

/* The byte at position i of the stream the peer writes. */
static uint8_t pat(size_t i)
{
	return (uint8_t)((i * 2654435761u) >> 13);
}

/* The reading side: everything read is moved on to held, which nobody drains (a peer that does not read). */
typedef struct side {
	struct event_base *base;
	int fds[2]; /* fds[0]: the peer that writes, fds[1]: the bufferevent's */
	struct bufferevent *bev;
	struct evbuffer *held;
	size_t reads, piece; /* piece: moved on in pieces of this size (0: all at once) */
} side;

static void on_read(struct bufferevent *bev, void *arg)
{
	side *s = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	s->reads++;
	while (evbuffer_get_length(in)) {
		size_t n = evbuffer_get_length(in);
		km_net_move(in, s->held, s->piece && s->piece < n ? s->piece : n);
	}
	event_base_loopbreak(s->base);
}

static void side_open(side *s)
{
	memset(s, 0, sizeof(*s));
	s->base = event_base_new();
	assert_non_null(s->base);
	tcp_pair(s->fds);
	s->bev = km_net_bev_new(s->base, s->fds[1], NULL, true, NULL, false);
	assert_non_null(s->bev);
	km_net_bev_setcb(s->bev, on_read, NULL, NULL, s);
	km_net_bev_enable(s->bev, EV_READ);
	s->held = evbuffer_new();
}

static void side_close(side *s)
{
	km_net_bev_free(s->bev);
	close(s->fds[0]);
	evbuffer_free(s->held);
	event_base_free(s->base);
}

/* The peer writes n pattern bytes (from stream offset *at), and the loop runs until they are all held. */
static void send_and_read(side *s, size_t *at, size_t n)
{
	uint8_t *buf = malloc(n);
	size_t off = 0, want = evbuffer_get_length(s->held) + n;

	for (size_t i = 0; i < n; i++)
		buf[i] = pat(*at + i);
	while (off < n || evbuffer_get_length(s->held) < want) {
		if (off < n) {
			ssize_t w = write(s->fds[0], buf + off, n - off);
			if (w > 0)
				off += (size_t)w;
		}
		event_base_loop(s->base, EVLOOP_ONCE);
	}
	*at += n;
	free(buf);
}

static void check_held(side *s, size_t total)
{
	uint8_t *all;
	assert_int_equal(evbuffer_get_length(s->held), total);
	all = evbuffer_pullup(s->held, -1);
	for (size_t i = 0; i < total; i++)
		if (all[i] != pat(i))
			fail_msg("byte %zu is %u, not %u", i, all[i], pat(i));
}

/* Reads of every size, bursts after trickles (past the reservation: the spill), moved on in odd pieces. */
static void test_reads_keep_the_stream(void **state)
{
	static const size_t sizes[] = {1, 100, 5000, 300000, 7, 65536, 1000000, 10, 200000, 3, 131072, 4096};
	side s;
	size_t at = 0;
	(void)state;

	side_open(&s);
	s.piece = 3000; /* mostly partial chains: referenced, not copied */
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		send_and_read(&s, &at, sizes[i]);
	check_held(&s, at);
	side_close(&s);
}

/*
 * A peer that sends a little at a time to a side that moves every read on to a buffer nobody
 * drains: what that buffer holds in memory stays near what it holds in bytes, also after a burst.
 * Reserving the full read size (256 KiB) for each read would hold 256 KiB per 100-byte read.
 */
static void test_trickle_memory_bound(void **state)
{
	side s;
	size_t at = 0, base_bytes, held_mem;
	(void)state;

	side_open(&s);
	base_bytes = live_bytes;
	send_and_read(&s, &at, 256 * 1024); /* a burst first: the reservations that follow shrink */
	for (int i = 0; i < 2000; i++)
		send_and_read(&s, &at, 100);
	held_mem = live_bytes - base_bytes;
	print_message("held %zu bytes in %zu bytes of libevent's memory, %zu reads\n", evbuffer_get_length(s.held),
		      held_mem, s.reads);
	assert_true(s.reads >= 2000);
	assert_true(held_mem >= evbuffer_get_length(s.held)); /* the count sees the chains */
	/* The burst's chains, the reservations after it halving, then libevent's smallest chain (1 KiB) a read. */
	assert_true(held_mem < 4 * 256 * 1024 + s.reads * 1200);
	check_held(&s, at);
	side_close(&s);
}

/* km_net_move: the part of a chain that moves is referenced (same memory), kept until dst lets go. */
static void test_move_references(void **state)
{
	struct evbuffer *src = evbuffer_new(), *dst = evbuffer_new();
	struct evbuffer_iovec v;
	uint8_t buf[10000];
	const uint8_t *chain;
	(void)state;

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = pat(i);
	evbuffer_add(src, buf, sizeof(buf));
	assert_int_equal(evbuffer_peek(src, -1, NULL, &v, 1), 1);
	chain = v.iov_base;

	km_net_move(src, dst, 6000);
	assert_int_equal(evbuffer_get_length(src), 4000);
	assert_int_equal(evbuffer_get_length(dst), 6000);
	assert_int_equal(evbuffer_peek(dst, -1, NULL, &v, 1), 1);
	assert_ptr_equal(v.iov_base, chain); /* not copied */

	/* The rest of the chain stays in src; what comes after goes to a chain of its own. */
	evbuffer_add(src, "tail", 4);
	assert_memory_equal(evbuffer_pullup(src, 4000), buf + 6000, 4000);
	evbuffer_free(src); /* dst's bytes outlive src */
	assert_memory_equal(evbuffer_pullup(dst, -1), buf, 6000);

	/* A small part is copied; a move that ends with a chain moves the chain. */
	src = evbuffer_new();
	evbuffer_add(src, buf, sizeof(buf));
	assert_int_equal(evbuffer_peek(src, -1, NULL, &v, 1), 1);
	chain = v.iov_base;
	evbuffer_drain(dst, 6000);
	km_net_move(src, dst, 100);
	assert_int_equal(evbuffer_peek(dst, -1, NULL, &v, 1), 1);
	assert_ptr_not_equal(v.iov_base, chain);
	km_net_move(src, dst, sizeof(buf) - 100);
	assert_int_equal(evbuffer_get_length(src), 0);
	assert_memory_equal(evbuffer_pullup(dst, -1), buf, sizeof(buf));
	evbuffer_free(src);
	evbuffer_free(dst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_reads_keep_the_stream),
	    cmocka_unit_test(test_trickle_memory_bound),
	    cmocka_unit_test(test_move_references),
	};
	/* Before libevent allocates anything: its memory is counted from here. */
	event_set_mem_functions(mm_malloc, mm_realloc, mm_free);
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
