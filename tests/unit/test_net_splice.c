/* Spliced ranges between two plain bufferevents (km_net_bev_splice) over real loopback TCP sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "kmirror/net.h"
#include "unit_tcp.h"

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The byte at position i of the stream the source's peer writes. */
static uint8_t pat(size_t i)
{
	return (uint8_t)((i * 2654435761u) >> 13);
}

/*
 * One run: the source's peer writes `total` pattern bytes (or `eof_at` of them, then closes);
 * the source's read callback starts a range of `range` bytes at offset `skip` (the bytes before it
 * move through user space), then moves the rest. The destination's output holds `before` bytes
 * first; `after` bytes are added to it right after the range starts (they must come after it).
 * The destination's peer reads everything, slowly if asked, and checks the order.
 */
typedef struct run {
	struct event_base *base;
	int a[2], b[2]; /* a[0]: source's peer, a[1]: source; b[0]: destination, b[1]: its peer */
	struct bufferevent *src, *dst;
	size_t total, skip, range, eof_at;
	size_t written, forwarded;
	size_t before, after;
	size_t got, expect;
	uint8_t *seen;
	int started;              /* km_net_bev_splice's answer */
	size_t buffered_at_start; /* range bytes the source's input held when the range started */
	bool done, src_event, dst_event;
	short src_what, dst_what;
	/* the slow reader */
	size_t read_chunk;
	struct timeval read_every;
	size_t pause_at; /* after this many bytes read: the reader pauses pause_ms */
	int pause_ms;
	bool paused_once;
	bool dst_noread; /* the destination does not read: its peer's close is seen by a write */
	double pause_cpu, pause_written_from, pause_written_to;
	struct event *wr_ev, *rd_ev, *tick;
} run;

static void src_read(struct bufferevent *bev, void *arg);

static void range_done(struct bufferevent *bev, void *arg)
{
	run *r = arg;
	(void)bev;
	r->done = true;
	r->forwarded += r->range;
	src_read(r->src, r); /* what follows the range may be buffered already: no readiness would bring it */
}

static void src_read(struct bufferevent *bev, void *arg)
{
	run *r = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	for (;;) {
		size_t n = evbuffer_get_length(in);
		if (!n)
			return;
		if (r->forwarded < r->skip) {
			size_t m = r->skip - r->forwarded;
			if (m > n)
				m = n;
			evbuffer_remove_buffer(in, bufferevent_get_output(r->dst), m);
			r->forwarded += m;
			continue;
		}
		if (r->forwarded == r->skip && !r->started && r->range) {
			uint8_t *pad;
			r->buffered_at_start = n < r->range ? n : r->range;
			r->started = km_net_bev_splice(bev, r->dst, r->range, range_done, r);
			assert_true(r->started >= 0);
			if (r->started == 1) {
				r->done = true;
				r->forwarded += r->range;
				continue;
			}
			r->started = r->started == 0 ? 2 : r->started;
			/* Added during the range: must reach the peer after the range's bytes. */
			pad = malloc(r->after);
			for (size_t i = 0; i < r->after; i++)
				pad[i] = pat(r->skip + r->range + i) ^ 0x5a;
			evbuffer_add(bufferevent_get_output(r->dst), pad, r->after);
			free(pad);
			return;
		}
		if (r->started == 2 && !r->done)
			return;
		evbuffer_remove_buffer(in, bufferevent_get_output(r->dst), n);
		r->forwarded += n;
	}
}

static void src_event(struct bufferevent *bev, short what, void *arg)
{
	run *r = arg;
	(void)bev;
	r->src_event = true;
	r->src_what = what;
	event_base_loopbreak(r->base);
}

static void dst_event(struct bufferevent *bev, short what, void *arg)
{
	run *r = arg;
	(void)bev;
	r->dst_event = true;
	r->dst_what = what;
	event_base_loopbreak(r->base);
}

static void peer_write(evutil_socket_t fd, short what, void *arg)
{
	run *r = arg;
	uint8_t buf[65536];
	size_t end = r->eof_at ? r->eof_at : r->total;
	(void)what;
	while (r->written < end) {
		size_t n = end - r->written < sizeof(buf) ? end - r->written : sizeof(buf);
		ssize_t w;
		for (size_t i = 0; i < n; i++)
			buf[i] = pat(r->written + i);
		w = write(fd, buf, n);
		if (w <= 0)
			return;
		r->written += (size_t)w;
	}
	event_del(r->wr_ev);
	if (r->eof_at)
		shutdown(fd, SHUT_WR);
}

static void peer_read(evutil_socket_t fd, short what, void *arg)
{
	run *r = arg;
	uint8_t buf[65536];
	size_t chunk = r->read_chunk ? r->read_chunk : sizeof(buf);
	(void)what;
	if (r->pause_at && !r->paused_once && r->got >= r->pause_at) {
		/* The reader stops: the range waits with bytes in the pipe and the writer is held back. */
		struct timeval tv = {0, r->pause_ms * 1000};
		r->paused_once = true;
		r->pause_cpu = cpu_s();
		r->pause_written_from = (double)r->written;
		event_del(r->rd_ev);
		event_add(r->tick, &tv);
		return;
	}
	for (int k = 0; k < (r->read_chunk ? 1 : 64); k++) {
		ssize_t n = read(fd, buf, chunk);
		if (n <= 0)
			break;
		memcpy(r->seen + r->got, buf, (size_t)n);
		r->got += (size_t)n;
		if (r->got >= r->expect) {
			event_base_loopbreak(r->base);
			return;
		}
	}
	if (r->read_chunk)
		event_add(r->rd_ev, &r->read_every);
}

static void pause_over(evutil_socket_t fd, short what, void *arg)
{
	run *r = arg;
	(void)fd;
	(void)what;
	r->pause_cpu = cpu_s() - r->pause_cpu;
	r->pause_written_to = (double)r->written;
	event_add(r->rd_ev, r->read_chunk ? &r->read_every : NULL);
}

static void run_setup(run *r)
{
	r->base = event_base_new();
	assert_non_null(r->base);
	tcp_pair(r->a);
	tcp_pair(r->b);
}

static void run_small_buffers(run *r)
{
	int sz = 32 * 1024;
	setsockopt(r->a[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(r->a[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	setsockopt(r->b[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(r->b[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static void run_go(run *r)
{
	struct timeval limit = {30, 0};
	uint8_t *pre;

	r->src = km_net_bev_new(r->base, r->a[1], NULL, false, NULL, false);
	r->dst = km_net_bev_new(r->base, r->b[0], NULL, false, NULL, false);
	assert_non_null(r->src);
	assert_non_null(r->dst);
	km_net_bev_setcb(r->src, src_read, NULL, src_event, r);
	km_net_bev_setcb(r->dst, NULL, NULL, dst_event, r);
	km_net_bev_enable(r->src, EV_READ);
	if (!r->dst_noread)
		km_net_bev_enable(r->dst, EV_READ);
	/* The destination's output before the range */
	pre = malloc(r->before + 1);
	for (size_t i = 0; i < r->before; i++)
		pre[i] = (uint8_t)(pat(i) ^ 0xff);
	evbuffer_add(bufferevent_get_output(r->dst), pre, r->before);
	free(pre);
	r->expect = r->before + (r->eof_at ? r->eof_at : r->total) + r->after;
	r->seen = calloc(1, r->expect + 1);
	r->wr_ev = event_new(r->base, r->a[0], EV_WRITE | EV_PERSIST, peer_write, r);
	r->rd_ev = event_new(r->base, r->b[1], r->read_chunk ? EV_READ : EV_READ | EV_PERSIST, peer_read, r);
	r->tick = evtimer_new(r->base, pause_over, r);
	event_add(r->wr_ev, NULL);
	event_add(r->rd_ev, r->read_chunk ? &r->read_every : NULL);
	/* 30 s at most: a test then fails on what it did not see */
	event_base_loopexit(r->base, &limit);
	event_base_dispatch(r->base);
}

/* What the destination's peer must have read, in order: before, the source's bytes with `after` after the range. */
static void check_stream(const run *r)
{
	size_t o = 0, src_bytes = r->eof_at ? r->eof_at : r->total;
	assert_int_equal(r->got, r->expect);
	for (size_t i = 0; i < r->before; i++, o++) {
		uint8_t want = (uint8_t)(pat(i) ^ 0xff);
		if (r->seen[o] != want)
			fail_msg("byte %zu (before the range) differs", o);
	}
	for (size_t i = 0; i < r->skip + r->range && i < src_bytes; i++, o++)
		if (r->seen[o] != pat(i))
			fail_msg("byte %zu (source byte %zu, before or in the range) differs", o, i);
	for (size_t i = 0; i < r->after; i++, o++) {
		uint8_t want = (uint8_t)(pat(r->skip + r->range + i) ^ 0x5a);
		if (r->seen[o] != want)
			fail_msg("byte %zu (added during the range) differs", o);
	}
	for (size_t i = r->skip + r->range; i < src_bytes; i++, o++)
		if (r->seen[o] != pat(i))
			fail_msg("byte %zu (source byte %zu, after the range) differs", o, i);
}

static void run_free(run *r)
{
	if (r->src)
		km_net_bev_free(r->src);
	if (r->dst)
		km_net_bev_free(r->dst);
	event_free(r->wr_ev);
	event_free(r->rd_ev);
	event_free(r->tick);
	close(r->a[0]);
	close(r->b[1]);
	event_base_free(r->base);
	free(r->seen);
}

/* Bytes before, in and after a range of 4 MiB reach the peer in order; part of the range was buffered. */
static void test_splice_in_order(void **state)
{
	run r = {.total = 6u << 20, .skip = 1000, .range = 4u << 20, .before = 70000, .after = 3000};
	int fds0 = open_fds();
	(void)state;
	run_setup(&r);
	run_go(&r);
	assert_false(r.src_event);
	assert_false(r.dst_event);
	assert_int_equal(r.started, 2); /* spliced, not wholly buffered */
	assert_true(r.done);
	assert_true(r.buffered_at_start > 0);
	assert_true(r.buffered_at_start < r.range);
	check_stream(&r);
	run_free(&r);
	assert_int_equal(open_fds(), fds0); /* sockets and the pipe closed */
}

/* A range the input already holds is moved at once: 1, no callback, same order. */
static void test_splice_buffered(void **state)
{
	run r = {.total = 3000, .skip = 10, .range = 100, .before = 5, .after = 0};
	(void)state;
	run_setup(&r);
	run_go(&r);
	assert_int_equal(r.started, 1);
	check_stream(&r);
	run_free(&r);
}

/*
 * The destination's reader is slow and stops for 400 ms mid-range: the range waits for its
 * socket (no spinning: little CPU while it waits) and holds the source back (the writer stalls),
 * then finishes in order.
 */
static void test_splice_slow_reader(void **state)
{
	run r = {.total = 8u << 20,
		 .skip = 0,
		 .range = 8u << 20,
		 .before = 100,
		 .after = 10,
		 .pause_at = 1u << 20,
		 .pause_ms = 400};
	(void)state;
	run_setup(&r);
	run_small_buffers(&r);
	run_go(&r);
	assert_false(r.src_event);
	assert_false(r.dst_event);
	assert_int_equal(r.started, 2);
	assert_true(r.paused_once);
	check_stream(&r);
	/* While nothing was read: under 25% of a core, and the writer got at most a few MiB ahead. */
	assert_true(r.pause_cpu < 0.1);
	assert_true(r.pause_written_to - r.pause_written_from < (double)(3u << 20));
	assert_true(r.pause_written_to < (double)r.total);
	run_free(&r);
}

/* The destination's reader takes 16 KiB per 1 ms: many short writes, same bytes. */
static void test_splice_trickle(void **state)
{
	run r = {.total = 1u << 20,
		 .skip = 77,
		 .range = (1u << 20) - 1000,
		 .before = 10,
		 .after = 10,
		 .read_chunk = 16384,
		 .read_every = {0, 1000}};
	(void)state;
	run_setup(&r);
	run_small_buffers(&r);
	run_go(&r);
	assert_int_equal(r.started, 2);
	check_stream(&r);
	run_free(&r);
}

/* The source's peer closes inside the range: its event callback hears EOF, done never runs, nothing leaks. */
static void test_splice_eof(void **state)
{
	run r = {.total = 4u << 20, .eof_at = 1u << 20, .skip = 0, .range = 4u << 20, .before = 0, .after = 0};
	int fds0 = open_fds();
	(void)state;
	run_setup(&r);
	run_go(&r);
	assert_true(r.src_event);
	assert_true(r.src_what & BEV_EVENT_EOF);
	assert_true(r.src_what & BEV_EVENT_READING);
	assert_false(r.done);
	run_free(&r);
	assert_int_equal(open_fds(), fds0);
}

/* The destination's peer closes inside the range: the destination's event callback hears a write error. */
static void test_splice_dst_gone(void **state)
{
	run r = {.total = 8u << 20, .skip = 0, .range = 8u << 20, .before = 0, .after = 0};
	int fds0 = open_fds();
	(void)state;
	run_setup(&r);
	run_small_buffers(&r);
	r.dst_noread = true;
	r.pause_at = 1; /* read nothing... */
	r.pause_ms = 100000;
	close(r.b[1]); /* ...the peer is gone: writes fail with EPIPE / ECONNRESET */
	r.b[1] = socket(AF_INET, SOCK_STREAM, 0);
	run_go(&r);
	assert_true(r.dst_event);
	assert_true(r.dst_what & BEV_EVENT_WRITING);
	assert_true(r.dst_what & BEV_EVENT_ERROR);
	assert_false(r.done);
	run_free(&r);
	assert_int_equal(open_fds(), fds0);
}

/* TLS or not connected: refused, nothing moved. */
static void test_splice_refused(void **state)
{
	struct event_base *base = event_base_new();
	struct bufferevent *a = km_net_bev_new(base, -1, NULL, false, NULL, false);
	struct bufferevent *b = km_net_bev_new(base, -1, NULL, false, NULL, false);
	(void)state;
	assert_false(km_net_bev_can_splice(a));
	assert_int_equal(km_net_bev_splice(a, b, 100000, NULL, NULL), KM_ERR_INVAL);
	km_net_bev_free(a);
	km_net_bev_free(b);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_splice_in_order),    cmocka_unit_test(test_splice_buffered),
	    cmocka_unit_test(test_splice_slow_reader), cmocka_unit_test(test_splice_trickle),
	    cmocka_unit_test(test_splice_eof),         cmocka_unit_test(test_splice_dst_gone),
	    cmocka_unit_test(test_splice_refused),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
