/* Unit tests for the async client against an in-process fake broker: pipelining, SASL/PLAIN, errors, timeouts. */
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

#include "kmirror/net.h"

typedef enum { MODE_ECHO, MODE_BAD_CORR, MODE_SILENT, MODE_SASL } fake_mode;

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
} fake;

typedef struct result {
	int calls;
	km_err err[8];
	char body[8][32];
	int states;
	km_err state_err;
} result;

static void fake_reply(fake *f, int32_t corr, const void *body, size_t len)
{
	uint8_t hdr[8];
	km_put_be32(hdr, (uint32_t)(4 + len));
	km_put_be32(hdr + 4, (uint32_t)corr);
	evbuffer_add(bufferevent_get_output(f->conn), hdr, 8);
	evbuffer_add(bufferevent_get_output(f->conn), body, len);
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
		if (f->mode == MODE_SASL && h.api_key == 17) {
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
	f->conn = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
	bufferevent_setcb(f->conn, fake_read, NULL, NULL, f);
	bufferevent_enable(f->conn, EV_READ | EV_WRITE);
}

static void fake_start(fake *f, struct event_base *base, fake_mode mode)
{
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	memset(f, 0, sizeof(*f));
	f->base = base;
	f->mode = mode;
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
		bufferevent_free(f->conn);
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
	assert_int_equal(f.requests, 1);
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
	assert_int_equal(km_net_client_send(c, 18, 0, 1, 0, (const uint8_t *)"after-auth", 10, on_response, &r), KM_OK);
	run_until(base, &r.calls, 1);
	assert_int_equal(r.calls, 1);
	assert_int_equal(r.err[0], KM_OK);
	assert_string_equal(r.body[0], "after-auth");
	/* Handshake, then authenticate, then the application request. */
	assert_int_equal(f.requests, 3);
	assert_int_equal(f.keys[0], 17);
	assert_int_equal(f.keys[1], 36);
	assert_int_equal(f.keys[2], 18);
	assert_int_equal(f.sasl_token_len, 1 + 5 + 1 + 6);
	assert_memory_equal(f.sasl_token, "\0alice\0s3cret", 13);
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
	km_net_client_free(c);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pipelined_in_order), cmocka_unit_test(test_bad_correlation_closes),
		cmocka_unit_test(test_timeout),            cmocka_unit_test(test_sasl_plain),
		cmocka_unit_test(test_connect_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
