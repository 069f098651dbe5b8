/* Unit tests for the async client against an in-process fake broker: ApiVersions negotiation, pipelining, SASL/PLAIN, delivery modes, referenced pieces, caps, errors, timeouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <cmocka.h>

#include <event2/listener.h>

#include "kmirror/api.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/net.h"
#include "tls_cert.h"

typedef enum { MODE_ECHO, MODE_BAD_CORR, MODE_SILENT, MODE_SASL, MODE_BIG, MODE_HOLD } fake_mode;

typedef struct fake {
	struct event_base *base;
	struct evconnlistener *l;
	struct bufferevent *conn;
	uint16_t port;
	fake_mode mode;
	int requests;
	int16_t keys[16];
	char sasl_token[64];
	size_t sasl_token_len;
	int16_t av_max;        /* newest ApiVersions version the fake takes (default 5) */
	bool av_hide;          /* its UNSUPPORTED_VERSION answer lists no ApiVersions range */
	int16_t av_seen[4];    /* ApiVersions versions asked for, in order */
	int av_count;
	size_t big_len;        /* MODE_BIG: size of the answer to a Fetch */
	int32_t held[16];      /* MODE_HOLD: correlation ids not answered yet */
	int nheld;
	SSL_CTX *tls;          /* set: the fake speaks TLS */
} fake;

typedef struct result {
	int calls;
	km_err err[8];
	char body[8][32];
	int states;
	km_err state_err;
	int writable;
} result;

static void fake_reply(fake *f, int32_t corr, const void *body, size_t len)
{
	uint8_t hdr[8];
	km_put_be32(hdr, (uint32_t)(4 + len));
	km_put_be32(hdr + 4, (uint32_t)corr);
	evbuffer_add(bufferevent_get_output(f->conn), hdr, 8);
	evbuffer_add(bufferevent_get_output(f->conn), body, len);
}

/*
 * ApiVersions as a broker answers it: UNSUPPORTED_VERSION in the v0 layout for a version above
 * av_max, else Produce 3..13, Fetch 4..99, Metadata 0..12, ListOffsets 50..60 (nothing in common
 * with the codec), ApiVersions 0..av_max, an unknown key 999, kmirror's DescribeMirrors 0..0, and
 * from v3 one finalized feature.
 */
static void fake_api_versions(fake *f, const km_req_header *h)
{
	static const int16_t keys[][3] = {{0, 3, 13}, {1, 4, 99}, {3, 0, 12}, {2, 50, 60}, {18, 0, 0}, {999, 0, 5},
					  {KM_API_DESCRIBE_MIRRORS, 0, 0}};
	km_api_versions_response_api_version av[7];
	km_api_versions_response_finalized_feature_key feat;
	km_api_versions_response m;
	int16_t v = h->api_version;
	km_wr w;

	if (f->av_count < 4)
		f->av_seen[f->av_count] = v;
	f->av_count++;
	km_api_versions_response_init(&m);
	for (int i = 0; i < 7; i++) {
		km_api_versions_response_api_version_init(&av[i]);
		av[i].api_key = keys[i][0];
		av[i].min_version = keys[i][1];
		av[i].max_version = keys[i][0] == 18 ? f->av_max : keys[i][2];
	}
	m.api_keys.items = av;
	m.api_keys.count = 7;
	if (v > f->av_max) {
		m.error_code = KM_KAFKA_UNSUPPORTED_VERSION;
		m.api_keys.items = &av[4];
		m.api_keys.count = f->av_hide ? 0 : 1;
		v = 0;
	} else if (v >= 3) {
		km_api_versions_response_finalized_feature_key_init(&feat);
		feat.name = km_str_c("metadata.version");
		feat.min_version_level = 1;
		feat.max_version_level = 27;
		m.finalized_features.items = &feat;
		m.finalized_features.count = 1;
		m.finalized_features_epoch = 5;
	}
	km_wr_init(&w);
	km_api_versions_response_encode(&w, v, &m);
	assert_true(km_wr_ok(&w));
	fake_reply(f, h->correlation_id, w.buf, w.len);
	km_wr_free(&w);
}

/* MODE_HOLD: answer every request held so far with "ok". */
static void fake_flush(fake *f)
{
	for (int i = 0; i < f->nheld; i++)
		fake_reply(f, f->held[i], "ok", 2);
	f->nheld = 0;
}

static void fake_read(struct bufferevent *bev, void *arg)
{
	fake *f = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	int32_t size;

	while (km_net_frame_peek(in, 1 << 20, 8, false, &size) == KM_FRAME_READY) {
		uint8_t *p = evbuffer_pullup(in, size + 4);
		km_req_header h;
		assert_int_equal(km_net_parse_request_header(p + 4, (size_t)size, 1, &h), KM_OK);
		assert_true(km_str_eq_c(h.client_id, "test-client"));
		if (f->requests < 16)
			f->keys[f->requests] = h.api_key;
		f->requests++;
		if (h.api_key == KM_API_API_VERSIONS) {
			fake_api_versions(f, &h);
		} else if (f->mode == MODE_BIG && h.api_key == KM_API_FETCH) {
			uint8_t *big = malloc(f->big_len);
			for (size_t i = 0; i < f->big_len; i++)
				big[i] = (uint8_t)(i * 7 + 3);
			fake_reply(f, h.correlation_id, big, f->big_len);
			free(big);
		} else if (f->mode == MODE_HOLD) {
			assert_true(f->nheld < 16);
			f->held[f->nheld++] = h.correlation_id;
		} else if (f->mode == MODE_SASL && h.api_key == 17) {
			uint8_t ok[] = {0, 0, 0, 0, 0, 1, 0, 5, 'P', 'L', 'A', 'I', 'N'};
			fake_reply(f, h.correlation_id, ok, sizeof(ok));
		} else if (f->mode == MODE_SASL && h.api_key == 36) {
			/* error 0, null message, empty auth bytes, session lifetime */
			uint8_t ok[] = {0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
			km_rd r;
			km_bytes tok;
			km_rd_init(&r, p + 4 + h.body_offset, (size_t)size - h.body_offset);
			assert_true(km_rd_bytes(&r, "auth", false, false, &tok));
			f->sasl_token_len = (size_t)tok.len;
			memcpy(f->sasl_token, tok.p, (size_t)tok.len);
			fake_reply(f, h.correlation_id, ok, sizeof(ok));
		} else if (f->mode == MODE_BAD_CORR) {
			fake_reply(f, h.correlation_id + 1000, "x", 1);
		} else if (f->mode != MODE_SILENT) {
			/* echo the body back */
			fake_reply(f, h.correlation_id, p + 4 + h.body_offset, (size_t)size - h.body_offset);
		}
		evbuffer_drain(in, (size_t)size + 4);
	}
}

static void fake_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	fake *f = arg;
	f->conn = f->tls ? km_net_bev_new(f->base, fd, f->tls, true, NULL, false)
			 : bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
	km_net_bev_setcb(f->conn, fake_read, NULL, NULL, f);
	km_net_bev_enable(f->conn, EV_READ | EV_WRITE);
}

static void fake_start(fake *f, struct event_base *base, fake_mode mode)
{
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	memset(f, 0, sizeof(*f));
	f->base = base;
	f->mode = mode;
	f->av_max = 5;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->l = evconnlistener_new_bind(base, fake_accept, f, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 16,
				       (struct sockaddr *)&sin, sizeof(sin));
	assert_non_null(f->l);
	getsockname(evconnlistener_get_fd(f->l), (struct sockaddr *)&sin, &slen);
	f->port = ntohs(sin.sin_port);
}

static void fake_stop(fake *f)
{
	if (f->conn)
		km_net_bev_free(f->conn);
	evconnlistener_free(f->l);
}

static void on_response(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	result *r = arg;
	if (r->calls < 8) {
		r->err[r->calls] = err;
		if (body)
			snprintf(r->body[r->calls], sizeof(r->body[0]), "%.*s", (int)len, (const char *)body);
	}
	r->calls++;
}

static void on_state(km_net_client *c, km_err err, void *arg)
{
	result *r = arg;
	r->states++;
	r->state_err = err;
}

static void run_until(struct event_base *base, const int *counter, int want)
{
	for (int i = 0; i < 400 && *counter < want; i++) {
		struct timeval tv = {0, 10000};
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
}

static km_net_client *client(struct event_base *base, result *r, int64_t tmo, const char *mech)
{
	km_net_client_opts o;
	memset(&o, 0, sizeof(o));
	o.client_id = "test-client";
	o.request_timeout_ms = tmo;
	o.connect_timeout_ms = 2000;
	o.sasl_mechanism = mech;
	o.sasl_username = "alice";
	o.sasl_password = "s3cret";
	o.on_state = on_state;
	o.arg = r;
	return km_net_client_new(base, &o);
}

static void test_pipelined_in_order(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result r = {0};
	km_net_client *c;

	fake_start(&f, base, MODE_ECHO);
	c = client(base, &r, 5000, NULL);
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", f.port), KM_OK);
	/* Sent before the connection is up: queued, then sent in order. */
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"first", 5, on_response, &r), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"second", 6, on_response, &r), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"third", 5, on_response, &r), KM_OK);
	assert_int_equal(km_net_client_inflight(c), 3);
	run_until(base, &r.calls, 3);
	assert_int_equal(r.calls, 3);
	assert_int_equal(r.states, 1);
	assert_int_equal(r.state_err, KM_OK);
	assert_true(km_net_client_ready(c));
	assert_string_equal(r.body[0], "first");
	assert_string_equal(r.body[1], "second");
	assert_string_equal(r.body[2], "third");
	assert_int_equal(km_net_client_inflight(c), 0);
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/* SO_SNDBUF of this process's socket connected to port (-1: none found). */
static int sndbuf_of_socket_to(uint16_t port)
{
	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_in peer;
		socklen_t len = sizeof(peer);
		int v = 0;
		socklen_t vl = sizeof(v);
		if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0 && peer.sin_family == AF_INET &&
		    ntohs(peer.sin_port) == port && getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &vl) == 0)
			return v;
	}
	return -1;
}

static long read_wmem_max(void)
{
	long v = 0;
	FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/*
 * sndbuf_bytes: the connection's send buffer is set (the kernel doubles what it is given) where
 * net.core.wmem_max allows it whole; above wmem_max it stays the kernel's own.
 */
static void test_sndbuf(void **state)
{
	int sizes[] = {1 << 20, 0};
	long max = read_wmem_max();
	(void)state;

	sizes[1] = max > 0 && max < (1L << 30) ? (int)max + 4096 : 0;
	for (int i = 0; i < 2; i++) {
		struct event_base *base = event_base_new();
		fake f;
		result r = {0};
		km_net_client_opts o;
		km_net_client *c;
		int got;

		if (!sizes[i])
			continue;
		fake_start(&f, base, MODE_ECHO);
		memset(&o, 0, sizeof(o));
		o.client_id = "test-client";
		o.connect_timeout_ms = 2000;
		o.sndbuf_bytes = sizes[i];
		o.on_state = on_state;
		o.arg = &r;
		c = km_net_client_new(base, &o);
		assert_int_equal(km_net_client_connect(c, "127.0.0.1", f.port), KM_OK);
		assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"x", 1, on_response, &r), KM_OK);
		run_until(base, &r.calls, 1);
		assert_int_equal(r.calls, 1);
		got = sndbuf_of_socket_to(f.port);
		if (sizes[i] <= max)
			assert_int_equal(got, 2 * sizes[i]);
		else
			assert_true(got > 0 && got < sizes[i]); /* autotuning's, from tcp_wmem's default */
		km_net_client_free(c);
		fake_stop(&f);
		event_base_loop(base, EVLOOP_NONBLOCK);
		event_base_free(base);
	}
}

static void test_bad_correlation_closes(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result r = {0};
	km_net_client *c;

	fake_start(&f, base, MODE_BAD_CORR);
	c = client(base, &r, 5000, NULL);
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", f.port), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"a", 1, on_response, &r), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"b", 1, on_response, &r), KM_OK);
	run_until(base, &r.calls, 2);
	assert_int_equal(r.calls, 2);
	assert_int_equal(r.err[0], KM_ERR_DECODE);
	assert_int_equal(r.err[1], KM_ERR_DECODE);
	assert_int_equal(r.state_err, KM_ERR_DECODE);
	assert_false(km_net_client_ready(c));
	/* A closed client refuses new requests. */
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"c", 1, on_response, &r), KM_ERR_CLOSED);
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_timeout(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result r = {0};
	km_net_client *c;

	fake_start(&f, base, MODE_SILENT);
	c = client(base, &r, 300, NULL);
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", f.port), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"a", 1, on_response, &r), KM_OK);
	run_until(base, &r.calls, 1);
	assert_int_equal(r.calls, 1);
	assert_int_equal(r.err[0], KM_ERR_TIMEOUT);
	assert_int_equal(f.requests, 2); /* ApiVersions (answered), then the silent one */
	assert_string_equal(km_net_client_reason(c), "a request timed out");
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_sasl_plain(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result r = {0};
	km_net_client *c;

	fake_start(&f, base, MODE_SASL);
	c = client(base, &r, 5000, "PLAIN");
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", f.port), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 0, 1, 0, (const uint8_t *)"after-auth", 10, on_response, &r), KM_OK);
	run_until(base, &r.calls, 1);
	assert_int_equal(r.calls, 1);
	assert_int_equal(r.err[0], KM_OK);
	assert_string_equal(r.body[0], "after-auth");
	/* ApiVersions, handshake, then authenticate, then the application request. */
	assert_int_equal(f.requests, 4);
	assert_int_equal(f.keys[0], 18);
	assert_int_equal(f.keys[1], 17);
	assert_int_equal(f.keys[2], 36);
	assert_int_equal(f.keys[3], 3);
	assert_int_equal(f.sasl_token_len, 1 + 5 + 1 + 6);
	assert_memory_equal(f.sasl_token, "\0alice\0s3cret", 13);
	assert_string_equal(km_net_client_reason(c), ""); /* no failure, no reason */
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_connect_refused(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result r = {0};
	km_net_client *c;
	uint16_t port;

	/* A port that was just free. */
	fake_start(&f, base, MODE_ECHO);
	port = f.port;
	fake_stop(&f);
	c = client(base, &r, 5000, NULL);
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", port), KM_OK);
	assert_int_equal(km_net_client_send(c, 3, 1, 1, 0, (const uint8_t *)"a", 1, on_response, &r), KM_OK);
	run_until(base, &r.calls, 1);
	assert_int_equal(r.calls, 1);
	assert_true(r.err[0] == KM_ERR_IO || r.err[0] == KM_ERR_CLOSED);
	assert_int_equal(r.states, 1);
	assert_int_not_equal(r.state_err, KM_OK);
	/* The reason a person reads (the CLI prints it): the socket's own error, nothing else. */
	assert_non_null(strstr(km_net_client_reason(c), "refused"));
	km_net_client_free(c);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void loop_for(struct event_base *base, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	event_base_loopexit(base, &tv);
	event_base_dispatch(base);
}

static km_net_client *client_opts(struct event_base *base, result *r, km_net_client_opts *o)
{
	o->client_id = "test-client";
	o->request_timeout_ms = o->request_timeout_ms ? o->request_timeout_ms : 5000;
	o->connect_timeout_ms = 2000;
	o->on_state = on_state;
	o->arg = r;
	return km_net_client_new(base, o);
}

/* One test's loop, fake broker and client (cmocka setup/teardown). */
typedef struct env {
	struct event_base *base;
	fake f;
	bool fake_up;
	result r;
	km_net_client_opts o; /* options of the next client */
	km_net_client *c;
} env;

static int env_setup(void **state)
{
	env *e = calloc(1, sizeof(*e));
	e->base = event_base_new();
	*state = e;
	return e->base ? 0 : -1;
}

/* A fresh result and a client with e->o connecting to port. */
static void env_client(env *e, uint16_t port)
{
	memset(&e->r, 0, sizeof(e->r));
	e->c = client_opts(e->base, &e->r, &e->o);
	assert_non_null(e->c);
	assert_int_equal(km_net_client_connect(e->c, "127.0.0.1", port), KM_OK);
}

/* The fake in mode, and a client connecting to it (the connection completes in the loop). */
static void env_begin(env *e, fake_mode mode)
{
	fake_start(&e->f, e->base, mode);
	e->fake_up = true;
	env_client(e, e->f.port);
}

static void env_end(env *e)
{
	if (e->c)
		km_net_client_free(e->c);
	e->c = NULL;
	if (e->fake_up)
		fake_stop(&e->f);
	e->fake_up = false;
	loop_for(e->base, 10);
}

static int env_teardown(void **state)
{
	env *e = *state;
	env_end(e);
	event_base_loop(e->base, EVLOOP_NONBLOCK);
	event_base_free(e->base);
	free(e);
	return 0;
}

static int16_t codec_max(int16_t key)
{
	return km_api_lookup(key)->max_version;
}

static void test_negotiation(void **state)
{
	env *e = *state;

	env_begin(e, MODE_ECHO);
	assert_int_equal(km_net_client_version(e->c, KM_API_PRODUCE), -1);
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, (const uint8_t *)"x", 1, on_response, &e->r), KM_OK);
	run_until(e->base, &e->r.calls, 1);
	assert_int_equal(e->r.states, 1);
	assert_int_equal(e->r.state_err, KM_OK);
	/* ApiVersions first, at the newest version the codec knows, and only then the queued request. */
	assert_int_equal(e->f.keys[0], KM_API_API_VERSIONS);
	assert_int_equal(e->f.keys[1], 3);
	assert_int_equal(e->f.av_count, 1);
	assert_int_equal(e->f.av_seen[0], KM_API_VERSIONS_RESPONSE_MAX_VERSION);
	assert_int_equal(km_net_client_version(e->c, KM_API_PRODUCE), 13 < codec_max(0) ? 13 : codec_max(0));
	assert_int_equal(km_net_client_version(e->c, KM_API_FETCH), codec_max(KM_API_FETCH)); /* broker offers more */
	assert_int_equal(km_net_client_version(e->c, KM_API_METADATA), 12);
	assert_int_equal(km_net_client_version(e->c, 2), -1);   /* ranges do not meet */
	assert_int_equal(km_net_client_version(e->c, 19), -1);  /* not offered */
	assert_int_equal(km_net_client_version(e->c, 999), -1); /* unknown to the codec */
	/* kmirror's own keys (32000 up) have their slots too: the CLI checks that a peer answers them. */
	assert_int_equal(km_net_client_version(e->c, KM_API_DESCRIBE_MIRRORS), 0);
	assert_int_equal(km_net_client_version(e->c, KM_API_LIST_MIRRORS), -1);
	assert_int_equal(km_net_client_version(e->c, KM_API_CREATE_MIRROR + 64), -1);
	assert_int_equal(km_net_client_version(e->c, KM_API_API_VERSIONS), 5);
	assert_int_equal(km_net_client_feature(e->c, "metadata.version"), 27);
	assert_int_equal(km_net_client_feature(e->c, "transaction.version"), -1);
}

static void fallback_case(env *e, bool hide, int16_t want_retry)
{
	env_begin(e, MODE_ECHO);
	e->f.av_max = 2;
	e->f.av_hide = hide;
	run_until(e->base, &e->r.states, 1);
	assert_int_equal(e->r.state_err, KM_OK);
	assert_true(km_net_client_ready(e->c));
	assert_int_equal(e->f.av_count, 2);
	assert_int_equal(e->f.av_seen[0], KM_API_VERSIONS_RESPONSE_MAX_VERSION);
	assert_int_equal(e->f.av_seen[1], want_retry);
	assert_int_equal(km_net_client_version(e->c, KM_API_METADATA), 12);
	assert_int_equal(km_net_client_version(e->c, KM_API_API_VERSIONS), 2);
	assert_int_equal(km_net_client_feature(e->c, "metadata.version"), -1); /* not in v0-2 answers */
	env_end(e);
}

static void test_negotiation_fallback(void **state)
{
	/* UNSUPPORTED_VERSION naming the broker's range: retry at its max; naming none: v0. */
	fallback_case(*state, false, 2);
	fallback_case(*state, true, 0);
}

typedef struct sink {
	struct evbuffer *got;
	int calls, lasts, errors;
	size_t next_off;
	bool offsets_ok;
	km_err err;
} sink;

static void on_owned(km_net_client *c, km_err err, struct evbuffer *body, void *arg)
{
	sink *k = arg;
	k->calls++;
	k->err = err;
	if (body) {
		evbuffer_add_buffer(k->got, body);
		evbuffer_free(body);
	}
}

static void on_stream(km_net_client *c, km_err err, struct evbuffer *chunk, size_t off, bool last, void *arg)
{
	sink *k = arg;
	k->calls++;
	k->lasts += last;
	if (err != KM_OK) {
		k->errors++;
		k->err = err;
		return;
	}
	if (off != k->next_off)
		k->offsets_ok = false;
	k->next_off += evbuffer_get_length(chunk);
	evbuffer_add_buffer(k->got, chunk); /* moved, and only released later */
}

static bool is_pattern(struct evbuffer *b, size_t len)
{
	const uint8_t *p = evbuffer_pullup(b, -1);
	if (evbuffer_get_length(b) != len)
		return false;
	for (size_t i = 0; i < len; i++)
		if (p[i] != (uint8_t)(i * 7 + 3))
			return false;
	return true;
}

/* A Fetch v4 (header v1) with no body, delivered owned or streamed to k. */
static void sink_request(km_net_request *rq, km_net_delivery d, sink *k)
{
	km_net_request_init(rq, KM_API_FETCH, 4);
	rq->hdr_version = 1;
	rq->delivery = d;
	rq->on_owned = on_owned;
	rq->on_stream = on_stream;
	rq->arg = k;
}

static void test_owned_delivery(void **state)
{
	env *e = *state;
	sink k = {.got = evbuffer_new()};
	km_net_request rq;

	env_begin(e, MODE_BIG);
	e->f.big_len = 300000;
	sink_request(&rq, KM_NET_OWNED, &k);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	run_until(e->base, &k.calls, 1);
	assert_int_equal(k.calls, 1);
	assert_int_equal(k.err, KM_OK);
	assert_true(is_pattern(k.got, 300000));
	/* A delivery with no callback for its mode is refused. */
	rq.on_owned = NULL;
	assert_int_equal(km_net_client_request(e->c, &rq), KM_ERR_INVAL);
	evbuffer_free(k.got);
}

/* 3 MiB streamed under a 256 KiB unreleased cap; over TLS when server_tls is set. */
static void streaming_case(env *e, SSL_CTX *server_tls)
{
	enum { BIG = 3 * 1024 * 1024, CAP = 256 * 1024 };
	km_net_client_stats st;
	sink k = {.got = evbuffer_new(), .offsets_ok = true};
	km_net_request rq;
	int pauses = 0;

	e->o.max_unreleased_bytes = CAP;
	e->o.read_fill_bytes = 128 * 1024;
	env_begin(e, MODE_BIG);
	e->f.tls = server_tls;
	e->f.big_len = BIG;
	sink_request(&rq, KM_NET_STREAM, &k);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	for (int round = 0; round < 200 && !k.lasts; round++) {
		size_t before;
		loop_for(e->base, 20);
		km_net_client_stats_get(e->c, &st);
		assert_true(st.unreleased <= CAP);
		if (!st.paused)
			continue;
		/* Paused: nothing more arrives until the consumer releases. */
		pauses++;
		before = k.next_off;
		loop_for(e->base, 20);
		assert_int_equal(k.next_off, before);
		km_net_client_release(e->c, st.unreleased);
	}
	assert_int_equal(k.lasts, 1);
	assert_int_equal(k.errors, 0);
	assert_true(k.offsets_ok);
	assert_true(k.calls > 2);
	assert_true(pauses >= 3);
	assert_true(is_pattern(k.got, BIG));
	km_net_client_stats_get(e->c, &st);
	assert_true(st.peak_unreleased <= CAP);
	assert_true(st.peak_buffered < 1024 * 1024);
	assert_int_equal(st.inflight, 0);
	evbuffer_free(k.got);
	env_end(e);
}

static void test_streaming_pauses(void **state)
{
	streaming_case(*state, NULL);
}

/* The same over TLS: negotiation, streaming, the read pause and the TLS fill together. */
static void test_streaming_tls(void **state)
{
	env *e = *state;
	char dir[] = "/tmp/km-client-XXXXXX", cert[64], key[64], err[256];
	SSL_CTX *server;

	if (!km_test_make_cert(dir))
		skip();
	snprintf(cert, sizeof(cert), "%s/cert.pem", dir);
	snprintf(key, sizeof(key), "%s/key.pem", dir);
	server = km_net_tls_server_ctx(&(km_net_tls_files){.cert_file = cert, .key_file = key}, 0, err, sizeof(err));
	e->o.tls = km_net_tls_client_ctx(&(km_net_tls_files){.ca_file = cert}, true, err, sizeof(err));
	assert_non_null(server);
	assert_non_null(e->o.tls);
	streaming_case(e, server);
	SSL_CTX_free(server);
	SSL_CTX_free(e->o.tls);
	e->o.tls = NULL;
	km_test_remove_cert(dir);
}

static void count_release(void *arg)
{
	(*(int *)arg)++;
}

/* Pieces: a copy, a referenced pointer, a referenced range spanning several chains of an evbuffer. */
static struct evbuffer *ref_source(void)
{
	struct evbuffer *src = evbuffer_new();
	static const char *parts[] = {"0123456789", "abcdefghij", "KLMNOPQRST"};
	for (int i = 0; i < 3; i++) {
		struct evbuffer *one = evbuffer_new();
		evbuffer_add(one, parts[i], 10);
		evbuffer_add_buffer(src, one); /* keeps them as separate chains */
		evbuffer_free(one);
	}
	return src;
}

static void fill_pieces(km_net_piece pc[3], struct evbuffer *src, int released[3])
{
	memset(pc, 0, 3 * sizeof(*pc));
	released[1] = released[2] = 0;
	pc[0].p = "copy|";
	pc[0].len = 5;
	pc[1].p = "mem|";
	pc[1].len = 4;
	pc[1].release = count_release;
	pc[1].release_arg = &released[1];
	pc[2].buf = src;
	pc[2].off = 5;
	pc[2].len = 20;
	pc[2].release = count_release;
	pc[2].release_arg = &released[2];
}

/* A flat request of key 3 v1 made of pieces, answered to on_response. */
static void piece_request(km_net_request *rq, const km_net_piece *pc, size_t n, result *r)
{
	km_net_request_init(rq, 3, 1);
	rq->pieces = pc;
	rq->npieces = n;
	rq->delivery = KM_NET_FLAT;
	rq->on_flat = on_response;
	rq->arg = r;
}

static void test_reference_pieces(void **state)
{
	env *e = *state;
	struct evbuffer *src = ref_source();
	km_net_piece pc[3];
	int released[3] = {0, 0, 0};
	km_net_request rq;

	env_begin(e, MODE_SILENT);
	fill_pieces(pc, src, released);
	piece_request(&rq, pc, 3, &e->r);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	/* Queued before the connection is ready: nothing written, nothing released. */
	assert_int_equal(released[1] + released[2], 0);
	run_until(e->base, &e->f.requests, 2);
	loop_for(e->base, 20);
	/* Written (the silent broker never answers): each referenced piece released once. */
	assert_int_equal(released[1], 1);
	assert_int_equal(released[2], 1);
	assert_int_equal(e->r.calls, 0);
	/* A range past the end of its buffer is refused up front, and nothing is released. */
	pc[2].off = 25;
	assert_int_equal(km_net_client_request(e->c, &rq), KM_ERR_INVAL);
	km_net_client_free(e->c);
	e->c = NULL;
	loop_for(e->base, 10);
	assert_int_equal(e->r.calls, 1);
	assert_int_equal(e->r.err[0], KM_ERR_CLOSED);
	assert_int_equal(released[1], 1);
	assert_int_equal(released[2], 1);
	env_end(e);

	/* Echoed back: the frame held the pieces' bytes in order. */
	env_begin(e, MODE_ECHO);
	fill_pieces(pc, src, released);
	piece_request(&rq, pc, 3, &e->r);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	run_until(e->base, &e->r.calls, 1);
	assert_string_equal(e->r.body[0], "copy|mem|56789abcdefghijKLMNO");
	env_end(e);
	assert_int_equal(released[1], 1);
	assert_int_equal(released[2], 1);

	/* The connection fails before anything is written: released once all the same. */
	env_client(e, e->f.port); /* the fake's port, closed just now */
	fill_pieces(pc, src, released);
	piece_request(&rq, pc, 3, &e->r);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	run_until(e->base, &e->r.calls, 1);
	loop_for(e->base, 10);
	assert_int_equal(e->r.calls, 1);
	assert_true(e->r.err[0] == KM_ERR_IO || e->r.err[0] == KM_ERR_CLOSED);
	assert_int_equal(released[1], 1);
	assert_int_equal(released[2], 1);
	env_end(e);
	assert_int_equal(released[1], 1);
	assert_int_equal(released[2], 1);
	evbuffer_free(src);
}

static void on_writable(km_net_client *c, void *arg)
{
	result *r = arg;
	r->writable++;
}

static void test_caps_and_writable(void **state)
{
	env *e = *state;
	km_net_piece pc[1];
	int released = 0;
	km_net_request rq;
	uint8_t body[200];

	e->o.max_inflight = 2;
	e->o.on_writable = on_writable;
	env_begin(e, MODE_HOLD);
	/* Queued before ready: they count. */
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, (const uint8_t *)"a", 1, on_response, &e->r), KM_OK);
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, (const uint8_t *)"b", 1, on_response, &e->r), KM_OK);
	memset(pc, 0, sizeof(pc));
	pc[0].p = "c";
	pc[0].len = 1;
	pc[0].release = count_release;
	pc[0].release_arg = &released;
	piece_request(&rq, pc, 1, &e->r);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_ERR_FULL);
	assert_int_equal(km_net_client_inflight(e->c), 2);
	run_until(e->base, &e->f.nheld, 2);
	loop_for(e->base, 20);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_ERR_FULL);
	assert_int_equal(e->r.writable, 0);
	assert_int_equal(released, 0); /* a refused request keeps nothing */
	fake_flush(&e->f);
	run_until(e->base, &e->r.writable, 1);
	assert_int_equal(e->r.calls, 2);
	assert_int_equal(e->r.writable, 1);
	assert_int_equal(km_net_client_inflight(e->c), 0);
	assert_int_equal(km_net_client_request(e->c, &rq), KM_OK);
	env_end(e);
	assert_int_equal(released, 1);

	/* The byte cap: one request alone always fits, a second that passes the cap does not. */
	memset(&e->o, 0, sizeof(e->o));
	e->o.max_inflight_bytes = 150;
	e->o.on_writable = on_writable;
	env_begin(e, MODE_HOLD);
	memset(body, 'x', sizeof(body));
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, body, 200, on_response, &e->r), KM_OK);
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, body, 10, on_response, &e->r), KM_ERR_FULL);
	run_until(e->base, &e->f.nheld, 1);
	fake_flush(&e->f);
	run_until(e->base, &e->r.writable, 1);
	assert_int_equal(e->r.writable, 1);
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, body, 10, on_response, &e->r), KM_OK);
	/* frames of 25 + body bytes: 35 + 105 fit in 150, a third does not */
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, body, 80, on_response, &e->r), KM_OK);
	assert_int_equal(km_net_client_send(e->c, 3, 1, 1, 0, body, 80, on_response, &e->r), KM_ERR_FULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pipelined_in_order),
		cmocka_unit_test(test_sndbuf), cmocka_unit_test(test_bad_correlation_closes),
		cmocka_unit_test(test_timeout),            cmocka_unit_test(test_sasl_plain),
		cmocka_unit_test(test_connect_refused),
		cmocka_unit_test_setup_teardown(test_negotiation, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_negotiation_fallback, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_owned_delivery, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_streaming_pauses, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_streaming_tls, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_reference_pieces, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_caps_and_writable, env_setup, env_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
