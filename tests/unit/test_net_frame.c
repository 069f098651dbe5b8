/* Unit tests for net framing: frame checks, TLS/HTTP sniffing, request headers, the evbuffer cursor, bufferevent fill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <cmocka.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "kmirror/net.h"
#include "tls_cert.h"

static void test_frame_sizes(void **state)
{
	uint8_t b[16] = {0, 0, 0, 8, 0, 3, 0, 9, 0, 0, 0, 7, 0, 0, 0, 0};
	int32_t size = 0;

	assert_int_equal(km_net_frame_check(b, 3, 1000, 8, true, &size), KM_FRAME_NEED_MORE);
	assert_int_equal(km_net_frame_check(b, 11, 1000, 8, true, &size), KM_FRAME_NEED_MORE);
	assert_int_equal(size, 8);
	assert_int_equal(km_net_frame_check(b, 12, 1000, 8, true, &size), KM_FRAME_READY);
	/* over the cap */
	assert_int_equal(km_net_frame_check(b, 12, 7, 8, false, &size), KM_FRAME_TOO_LARGE);
	/* too small to hold a request header, and negative */
	km_put_be32(b, 7);
	assert_int_equal(km_net_frame_check(b, 12, 1000, 8, false, &size), KM_FRAME_BAD_SIZE);
	km_put_be32(b, 0xffffffffu);
	assert_int_equal(km_net_frame_check(b, 12, 1000, 8, false, &size), KM_FRAME_BAD_SIZE);
	/* a response may be just a correlation id */
	km_put_be32(b, 4);
	assert_int_equal(km_net_frame_check(b, 8, 1000, 4, false, &size), KM_FRAME_READY);
}

static void test_tls_and_http_sniffing(void **state)
{
	/* TLS 1.0 record header as ClientHellos carry it: 0x16 0x03 0x01, then length. */
	const uint8_t hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
	const uint8_t hello13[] = {0x16, 0x03, 0x03, 0x00, 0x80};
	int32_t size = 0;

	assert_int_equal(km_net_frame_check(hello, sizeof(hello), 104857600, 8, true, &size), KM_FRAME_TLS_HELLO);
	assert_int_equal(km_net_frame_check(hello13, sizeof(hello13), 104857600, 8, true, &size), KM_FRAME_TLS_HELLO);
	/* Not on later frames: there it is just a size (here: too large). */
	assert_int_equal(km_net_frame_check(hello, sizeof(hello), 104857600, 8, false, &size), KM_FRAME_TOO_LARGE);
	assert_int_equal(size, 0x16030102);
	assert_int_equal(km_net_frame_check((const uint8_t *)"GET /metrics HTTP/1.1\r\n", 23, 104857600, 8, true, &size),
			 KM_FRAME_HTTP);
	assert_string_equal(km_frame_status_name(KM_FRAME_TLS_HELLO), "tls-client-hello");
}

static void test_frame_peek_evbuffer(void **state)
{
	struct evbuffer *b = evbuffer_new();
	const uint8_t part1[] = {0, 0, 0, 10, 0, 18, 0, 3};
	const uint8_t part2[] = {0, 0, 0, 1, 0xff, 0xff};
	int32_t size = 0;

	evbuffer_add(b, part1, 2);
	assert_int_equal(km_net_frame_peek(b, 100, 8, true, &size), KM_FRAME_NEED_MORE);
	evbuffer_add(b, part1 + 2, sizeof(part1) - 2);
	assert_int_equal(km_net_frame_peek(b, 100, 8, true, &size), KM_FRAME_NEED_MORE);
	assert_int_equal(size, 10);
	/* Split over two chains, as reads deliver it. */
	evbuffer_add(b, part2, sizeof(part2));
	assert_int_equal(km_net_frame_peek(b, 100, 8, true, &size), KM_FRAME_READY);
	assert_int_equal(km_net_frame_peek(b, 9, 8, false, &size), KM_FRAME_TOO_LARGE);
	evbuffer_free(b);
}

static size_t build_header(km_wr *w, int16_t key, int16_t ver, int32_t corr, const char *client_id, int hv)
{
	km_wr_i16(w, key);
	km_wr_i16(w, ver);
	km_wr_i32(w, corr);
	if (hv >= 1)
		km_wr_string(w, false, km_str_c(client_id));
	if (hv >= 2) {
		/* one unknown tagged field, which must be skipped */
		km_wr_uvarint(w, 1);
		km_wr_uvarint(w, 5);
		km_wr_uvarint(w, 2);
		km_wr_u16(w, 0xabcd);
	}
	return w->len;
}

static void test_request_header(void **state)
{
	km_wr w;
	km_req_header h;
	size_t end;

	km_wr_init(&w);
	end = build_header(&w, 3, 12, 77, "rdkafka", 2);
	km_wr_i32(&w, 0x11223344); /* body */
	assert_int_equal(km_net_parse_request_header(w.buf, w.len, 2, &h), KM_OK);
	assert_int_equal(h.api_key, 3);
	assert_int_equal(h.api_version, 12);
	assert_int_equal(h.correlation_id, 77);
	assert_true(km_str_eq_c(h.client_id, "rdkafka"));
	assert_int_equal(h.body_offset, end);
	/* Header v1 stops after the client id. */
	assert_int_equal(km_net_parse_request_header(w.buf, w.len, 1, &h), KM_OK);
	assert_int_equal(h.body_offset, 8 + 2 + 7);
	/* Truncated in the client id. */
	assert_int_not_equal(km_net_parse_request_header(w.buf, 12, 1, &h), KM_OK);
	/* null client id */
	km_wr_free(&w);
	km_wr_init(&w);
	build_header(&w, 18, 3, 1, NULL, 1);
	assert_int_equal(km_net_parse_request_header(w.buf, w.len, 1, &h), KM_OK);
	assert_int_equal(h.client_id.len, -1);
	km_wr_free(&w);
}

static void test_response_header(void **state)
{
	struct evbuffer *b = evbuffer_new();
	/* size 10: correlation id 7, header tags (one tag of 2 bytes: 5 bytes), one body byte */
	static const uint8_t v1[] = {0, 0, 0, 10, 0, 0, 0, 7, 1, 5, 2, 0xaa, 0xbb, 0x42};
	int32_t corr = 0;
	size_t hlen = 0;
	(void)state;
	evbuffer_add(b, v1, 6);
	assert_int_equal(km_net_response_header(b, 10, 1, &corr, &hlen), 0); /* not all here yet */
	evbuffer_add(b, v1 + 6, sizeof(v1) - 6);
	assert_int_equal(km_net_response_header(b, 10, 1, &corr, &hlen), 1);
	assert_int_equal(corr, 7);
	assert_int_equal(hlen, 9); /* correlation id and the tag section */
	assert_int_equal(km_net_response_header(b, 10, 0, &corr, &hlen), 1);
	assert_int_equal(hlen, 4); /* header v0: the correlation id only */
	/* a tag section longer than the frame: malformed once the frame is whole */
	assert_int_equal(km_net_response_header(b, 5, 1, &corr, &hlen), -1);
	evbuffer_free(b);
}

static void test_evrd(void **state)
{
	struct evbuffer *b = evbuffer_new();
	const uint8_t a[] = {0x00, 0x07, 0xde, 0xad};
	const uint8_t c[] = {0xbe, 0xef, 0x96, 0x01, 0x03, 'a', 'b', 0x02, 0x01, 0x01, 0x09, 0x02, 0x00, 0x00, 0x7f};
	km_evrd r;
	int16_t i16;
	int32_t i32;
	uint32_t u;

	/* Two chains, so fields straddle chain boundaries. */
	evbuffer_add(b, a, sizeof(a));
	evbuffer_add(b, c, sizeof(c));
	km_evrd_init(&r, b, 0, evbuffer_get_length(b) - 1); /* the last byte is outside the window */
	assert_true(km_evrd_i16(&r, &i16));
	assert_int_equal(i16, 7);
	assert_true(km_evrd_i32(&r, &i32));
	assert_int_equal((uint32_t)i32, 0xdeadbeefu);
	assert_true(km_evrd_uvarint(&r, &u));
	assert_int_equal(u, 150);
	assert_true(km_evrd_skip_compact(&r)); /* "ab" */
	assert_true(km_evrd_skip_tags(&r));    /* 2 tags: (1, len 1, 0x09), (2, len 0) */
	assert_int_equal(r.pos, sizeof(a) + sizeof(c) - 2);
	assert_true(km_evrd_skip(&r, 1));
	/* At the window end: any read fails and the failure sticks. */
	assert_false(km_evrd_i16(&r, &i16));
	assert_false(km_evrd_skip(&r, 0) && r.err == KM_OK);
	/* Skipping past the window fails. */
	km_evrd_init(&r, b, 2, 6);
	assert_false(km_evrd_skip(&r, 5));
	/* An over-long varint is an error, not a hang. */
	{
		struct evbuffer *v = evbuffer_new();
		const uint8_t bad[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
		evbuffer_add(v, bad, sizeof(bad));
		km_evrd_init(&r, v, 0, sizeof(bad));
		assert_false(km_evrd_uvarint(&r, &u));
		evbuffer_free(v);
	}
	evbuffer_free(b);
}

/* What the read callback saw: bytes before and after the fill, and the bytes themselves in order. */
typedef struct {
	size_t upto, calls, first_before, first_after;
	struct evbuffer *got;
	bool eof;
} fill_probe;

static void fill_read_cb(struct bufferevent *bev, void *arg)
{
	fill_probe *p = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	size_t before = evbuffer_get_length(in), added = km_net_bev_fill(bev, p->upto);

	assert_int_equal(evbuffer_get_length(in), before + added);
	assert_true(evbuffer_get_length(in) <= (before > p->upto ? before : p->upto));
	if (p->calls++ == 0) {
		p->first_before = before;
		p->first_after = evbuffer_get_length(in);
	}
	evbuffer_add_buffer(p->got, in);
}

static void fill_event_cb(struct bufferevent *bev, short what, void *arg)
{
	fill_probe *p = arg;
	if (what & BEV_EVENT_EOF)
		p->eof = true;
}

static void run_fill(size_t total, size_t upto, fill_probe *p)
{
	int sv[2];
	uint8_t *data = malloc(total), *seen;
	struct event_base *base = event_base_new();
	struct bufferevent *bev;
	size_t off = 0;

	assert_non_null(data);
	for (size_t i = 0; i < total; i++)
		data[i] = (uint8_t)(i * 7 + i / 251);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	while (off < total) {
		ssize_t n = write(sv[1], data + off, total - off);
		assert_true(n > 0);
		off += (size_t)n;
	}
	shutdown(sv[1], SHUT_WR);
	memset(p, 0, sizeof(*p));
	p->upto = upto;
	p->got = evbuffer_new();
	bev = km_net_bev_new(base, sv[0], NULL, false, NULL, false);
	assert_non_null(bev);
	km_net_bev_setcb(bev, fill_read_cb, NULL, fill_event_cb, p);
	km_net_bev_fill(bev, upto); /* a plain bufferevent reads this much per readiness from now on */
	km_net_bev_enable(bev, EV_READ);
	for (int i = 0; i < 1000 && !p->eof; i++)
		event_base_loop(base, EVLOOP_ONCE);
	/* Every byte once, in order, and the end of stream still reported by the bufferevent itself. */
	assert_true(p->eof);
	assert_int_equal(evbuffer_get_length(p->got), total);
	seen = evbuffer_pullup(p->got, -1);
	assert_memory_equal(seen, data, total);
	km_net_bev_free(bev);
	evbuffer_free(p->got);
	event_base_free(base);
	close(sv[1]);
	free(data);
}

static void test_bev_fill(void **state)
{
	fill_probe p;

	/* libevent 2.1 alone hands over 4 KiB per readiness event; here the first callback has it all. */
	run_fill(100000, 256 * 1024, &p);
	assert_true(p.first_before <= 100000);
	assert_int_equal(p.first_after, 100000);
	assert_true(p.calls <= 2);
	/* upto bounds what one callback takes: at least ceil(100000 / 10000) callbacks. */
	run_fill(100000, 10000, &p);
	assert_int_equal(p.first_after, p.first_before > 10000 ? p.first_before : 10000);
	assert_true(p.calls >= 10);
	/* Nothing waiting: the fill adds nothing and EOF is not swallowed. */
	run_fill(1, 256 * 1024, &p);
	assert_int_equal(p.first_after, 1);
}

/* ---- writes: straight from the output, the write event only while the socket is full ---- */

typedef struct {
	size_t writes;
	short events;
} write_probe;

static void probe_write_cb(struct bufferevent *bev, void *arg)
{
	write_probe *p = arg;
	(void)bev;
	p->writes++;
}

static void probe_event_cb(struct bufferevent *bev, short what, void *arg)
{
	write_probe *p = arg;
	(void)bev;
	p->events |= what;
}

/* Reads what the socket holds (non-blocking) onto got; the bytes read. */
static size_t drain_socket(int fd, struct evbuffer *got)
{
	uint8_t buf[65536];
	size_t total = 0;
	ssize_t n;
	while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
		evbuffer_add(got, buf, (size_t)n);
		total += (size_t)n;
	}
	return total;
}

static void test_bev_direct_write(void **state)
{
	struct event_base *base = event_base_new();
	struct evbuffer *got = evbuffer_new();
	const size_t total = 8 * 1024 * 1024; /* far more than a socket buffer holds */
	uint8_t *data = malloc(total);
	write_probe p = {0};
	struct bufferevent *bev;
	int sv[2], rounds = 0;

	(void)state;
	for (size_t i = 0; i < total; i++)
		data[i] = (uint8_t)(i * 13 + i / 509);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	bev = km_net_bev_new(base, sv[0], NULL, false, NULL, false);
	assert_non_null(bev);
	km_net_bev_setcb(bev, NULL, probe_write_cb, probe_event_cb, &p);
	km_net_bev_enable(bev, EV_READ | EV_WRITE);

	/* A small write leaves in the loop round after the one that queued it: no readiness wait. */
	evbuffer_add(bufferevent_get_output(bev), "hello", 5);
	assert_int_equal(event_base_loop(base, EVLOOP_NONBLOCK), 0);
	assert_int_equal(evbuffer_get_length(bufferevent_get_output(bev)), 0);
	assert_int_equal(drain_socket(sv[1], got), 5);
	assert_int_equal(p.writes, 1);
	evbuffer_drain(got, 5);

	/* A big one fills the socket; the rest goes as the peer reads, every byte once and in order. */
	evbuffer_add(bufferevent_get_output(bev), data, total);
	while (evbuffer_get_length(got) < total && rounds++ < 100000) {
		event_base_loop(base, EVLOOP_NONBLOCK);
		drain_socket(sv[1], got);
	}
	assert_int_equal(evbuffer_get_length(got), total);
	assert_memory_equal(evbuffer_pullup(got, -1), data, total);
	assert_true(p.writes >= 2);
	assert_int_equal(p.events, 0);

	/* Back to direct writes once the output drained. */
	evbuffer_drain(got, total);
	p.writes = 0;
	evbuffer_add(bufferevent_get_output(bev), "again", 5);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(drain_socket(sv[1], got), 5);
	assert_int_equal(p.writes, 1);

	/* The peer gone: the write fails and the event callback hears it. */
	signal(SIGPIPE, SIG_IGN);
	close(sv[1]);
	evbuffer_add(bufferevent_get_output(bev), data, 4096);
	for (int i = 0; i < 10 && !p.events; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_true(p.events & BEV_EVENT_WRITING);
	assert_true(p.events & BEV_EVENT_ERROR);

	km_net_bev_free(bev);
	evbuffer_free(got);
	event_base_free(base);
	free(data);
}

/* The caller frees the bufferevent inside its own read callback: nothing is touched after. */
static void free_in_read_cb(struct bufferevent *bev, void *arg)
{
	int *calls = arg;
	(*calls)++;
	km_net_bev_free(bev);
}

static void test_bev_free_in_callback(void **state)
{
	struct event_base *base = event_base_new();
	struct bufferevent *bev;
	int sv[2], calls = 0;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	bev = km_net_bev_new(base, sv[0], NULL, false, NULL, false);
	km_net_bev_setcb(bev, free_in_read_cb, NULL, NULL, &calls);
	km_net_bev_enable(bev, EV_READ);
	evbuffer_add(bufferevent_get_output(bev), "queued", 6); /* a flush armed, then freed with it */
	assert_int_equal(write(sv[1], "x", 1), 1);
	for (int i = 0; i < 5; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(calls, 1);
	close(sv[1]);
	event_base_free(base);
}

/* ---- the same over TLS: a client bufferevent reading what a TLS server bufferevent writes ---- */

typedef struct {
	size_t upto, calls, total;
	struct evbuffer *got;
} tls_probe;

static void tls_read_cb(struct bufferevent *bev, void *arg)
{
	tls_probe *p = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	if (p->upto)
		km_net_bev_fill(bev, p->upto);
	p->calls++;
	evbuffer_add_buffer(p->got, in);
}

/* Read callbacks needed for total bytes over TLS with this fill (0: none); checks the bytes. */
static size_t run_tls_fill(const char *dir, size_t total, size_t upto)
{
	char cert[300], key[300], err[256];
	SSL_CTX *sctx, *cctx;
	struct event_base *base = event_base_new();
	struct bufferevent *srv, *cli;
	uint8_t *data = malloc(total);
	tls_probe p = {.upto = upto, .total = total, .got = evbuffer_new()};
	int sv[2];

	snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
	snprintf(key, sizeof(key), "%s/key.pem", dir);
	sctx = km_net_tls_server_ctx(&(km_net_tls_files){.cert_file = cert, .key_file = key}, 0, err, sizeof(err));
	cctx = km_net_tls_client_ctx(&(km_net_tls_files){.ca_file = cert}, false, err, sizeof(err));
	assert_non_null(sctx);
	assert_non_null(cctx);
	for (size_t i = 0; i < total; i++)
		data[i] = (uint8_t)(i * 7 + i / 251);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	evutil_make_socket_nonblocking(sv[0]);
	evutil_make_socket_nonblocking(sv[1]);
	srv = km_net_bev_new(base, sv[1], sctx, true, NULL, false);
	cli = km_net_bev_new(base, sv[0], cctx, false, "localhost", false);
	assert_non_null(srv);
	assert_non_null(cli);
	km_net_bev_setcb(cli, tls_read_cb, NULL, NULL, &p);
	km_net_bev_enable(cli, EV_READ | EV_WRITE);
	km_net_bev_enable(srv, EV_READ | EV_WRITE);
	evbuffer_add(bufferevent_get_output(srv), data, total);
	for (int i = 0; i < 200000 && evbuffer_get_length(p.got) < total; i++)
		event_base_loop(base, EVLOOP_ONCE);
	assert_int_equal(evbuffer_get_length(p.got), total);
	assert_memory_equal(evbuffer_pullup(p.got, -1), data, total);
	km_net_bev_free(cli);
	km_net_bev_free(srv);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
	SSL_CTX_free(sctx);
	SSL_CTX_free(cctx);
	evbuffer_free(p.got);
	free(data);
	return p.calls;
}

static void test_bev_fill_tls(void **state)
{
	char dir[] = "/tmp/km-fill-XXXXXX";
	size_t plain, filled;

	if (!km_test_make_cert(dir))
		skip();
	/* Without the fill libevent takes about one record per event; with it, what the socket holds. */
	plain = run_tls_fill(dir, 4 << 20, 0);
	filled = run_tls_fill(dir, 4 << 20, 1 << 20);
	printf("# TLS, 4 MiB: %zu read callbacks without the fill, %zu with a 1 MiB fill\n", plain, filled);
	assert_true(filled * 4 < plain);
	km_test_remove_cert(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_sizes),
		cmocka_unit_test(test_tls_and_http_sniffing),
		cmocka_unit_test(test_frame_peek_evbuffer),
		cmocka_unit_test(test_request_header),
		cmocka_unit_test(test_response_header),
		cmocka_unit_test(test_evrd),
		cmocka_unit_test(test_bev_fill),
		cmocka_unit_test(test_bev_fill_tls),
		cmocka_unit_test(test_bev_direct_write),
		cmocka_unit_test(test_bev_free_in_callback),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
