/* Unit tests for src/net/rpc.c against an in-process fake broker: the version picker, the retry policy, decoded responses, resends, decode errors, a client freed while a resend waits. */
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

#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/msg/list_mirrors_request.h"
#include "kmirror/msg/list_mirrors_response.h"
#include "kmirror/rpc.h"

/* The fake answers ApiVersions (ListMirrors 0..0, Metadata 4..12) and ListMirrors: busy first, then one mirror. */
typedef struct fake {
	struct event_base *base;
	struct evconnlistener *l;
	struct bufferevent *conn;
	uint16_t port;
	int busy;     /* answers with COORDINATOR_LOAD_IN_PROGRESS before the real one */
	bool garbage; /* answer ListMirrors with bytes that do not decode */
	int list_calls;
} fake;

typedef struct result {
	int calls, states;
	km_rpc_response r;
	char name[64];
	int32_t count;
} result;

/* hdr_v1: response header v1 (flexible APIs but ApiVersions): an empty tagged-field section after the id. */
static void reply(fake *f, int32_t corr, const km_wr *w, bool hdr_v1)
{
	uint8_t hdr[9] = {0};
	size_t hl = hdr_v1 ? 9 : 8;
	km_put_be32(hdr, (uint32_t)(hl - 4 + w->len));
	km_put_be32(hdr + 4, (uint32_t)corr);
	evbuffer_add(bufferevent_get_output(f->conn), hdr, hl);
	evbuffer_add(bufferevent_get_output(f->conn), w->buf, w->len);
}

static void answer_versions(fake *f, const km_req_header *h)
{
	km_api_versions_response_api_version av[3];
	km_api_versions_response m;
	const int16_t keys[][3] = {{KM_API_API_VERSIONS, 0, 3}, {KM_API_LIST_MIRRORS, 0, 0}, {KM_API_METADATA, 4, 12}};
	km_wr w;

	km_api_versions_response_init(&m);
	for (int i = 0; i < 3; i++) {
		km_api_versions_response_api_version_init(&av[i]);
		av[i].api_key = keys[i][0];
		av[i].min_version = keys[i][1];
		av[i].max_version = keys[i][2];
	}
	m.api_keys.items = av;
	m.api_keys.count = 3;
	km_wr_init(&w);
	km_api_versions_response_encode(&w, h->api_version, &m);
	reply(f, h->correlation_id, &w, false);
	km_wr_free(&w);
}

static void answer_list(fake *f, const km_req_header *h)
{
	km_list_mirrors_response m;
	km_list_mirrors_response_listed_mirror lm;
	km_wr w;

	f->list_calls++;
	km_list_mirrors_response_init(&m);
	km_list_mirrors_response_listed_mirror_init(&lm);
	lm.mirror_name = km_str_c("m1");
	lm.source_bootstrap_servers = km_str_c("src:9092");
	lm.topic_count = 3;
	if (f->busy > 0) {
		f->busy--;
		m.error_code = KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS;
	} else {
		m.mirrors.items = &lm;
		m.mirrors.count = 1;
	}
	km_wr_init(&w);
	if (f->garbage)
		km_wr_i32(&w, 0);
	else
		km_list_mirrors_response_encode(&w, 0, &m);
	reply(f, h->correlation_id, &w, true);
	km_wr_free(&w);
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
		if (h.api_key == KM_API_API_VERSIONS)
			answer_versions(f, &h);
		else if (h.api_key == KM_API_LIST_MIRRORS)
			answer_list(f, &h);
		evbuffer_drain(in, (size_t)size + 4);
	}
}

static void fake_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	fake *f = arg;
	(void)l, (void)sa, (void)len;
	f->conn = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
	km_net_bev_setcb(f->conn, fake_read, NULL, NULL, f);
	km_net_bev_enable(f->conn, EV_READ | EV_WRITE);
}

static void fake_start(fake *f, struct event_base *base)
{
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	memset(f, 0, sizeof(*f));
	f->base = base;
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

static void on_state(km_net_client *c, km_err err, void *arg)
{
	result *r = arg;
	(void)c;
	if (err == KM_OK)
		r->states++;
}

static void run_until(struct event_base *base, const int *counter, int want)
{
	for (int i = 0; i < 400 && *counter < want; i++) {
		struct timeval tv = {0, 10000};
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
}

static km_net_client *ready_client(struct event_base *base, fake *f, result *res)
{
	km_net_client_opts o = {.client_id = "rpc-test", .request_timeout_ms = 2000, .on_state = on_state, .arg = res};
	km_net_client *c = km_net_client_new(base, &o);
	assert_non_null(c);
	assert_int_equal(km_net_client_connect(c, "127.0.0.1", f->port), KM_OK);
	run_until(base, &res->states, 1);
	assert_int_equal(res->states, 1);
	return c;
}

static void on_list(km_net_client *c, const km_rpc_response *r, void *arg)
{
	result *res = arg;
	const km_list_mirrors_response *m = r->msg;
	(void)c;
	res->calls++;
	res->r = *r;
	res->count = -1;
	if (m) {
		res->count = m->mirrors.count;
		if (m->mirrors.count > 0)
			snprintf(res->name, sizeof(res->name), "%.*s", (int)m->mirrors.items[0].mirror_name.len,
				 m->mirrors.items[0].mirror_name.p);
	}
	if (r->why[0])
		snprintf(res->name, sizeof(res->name), "%.40s", r->why);
}

static km_err list_error(const void *msg) { return ((const km_list_mirrors_response *)msg)->error_code; }

static void test_version_pick(void **state)
{
	struct event_base *base = event_base_new();
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	assert_int_equal(km_net_version_pick(c, KM_API_METADATA, 10, 13), 12); /* capped by the broker */
	assert_int_equal(km_net_version_pick(c, KM_API_METADATA, 4, 9), 9);    /* capped by the caller */
	assert_int_equal(km_net_version_pick(c, KM_API_METADATA, 13, 13), -1); /* the broker is too old */
	assert_int_equal(km_net_version_pick(c, KM_API_FETCH, 0, 13), -1);     /* the broker lacks the key */
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_policy(void **state)
{
	(void)state;
	assert_int_equal(km_rpc_classify(KM_OK), KM_RPC_DONE);
	assert_int_equal(km_rpc_classify(KM_KAFKA_NOT_LEADER_OR_FOLLOWER), KM_RPC_REFRESH);
	assert_int_equal(km_rpc_classify(16 /* NOT_COORDINATOR */), KM_RPC_REFRESH);
	assert_int_equal(km_rpc_classify(KM_ERR_CLOSED), KM_RPC_REFRESH);
	assert_int_equal(km_rpc_classify(KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS), KM_RPC_RETRY);
	assert_int_equal(km_rpc_classify(KM_KAFKA_TOPIC_AUTHORIZATION_FAILED), KM_RPC_DONE);
	assert_int_equal(km_rpc_classify(KM_ERR_DECODE), KM_RPC_DONE);
	assert_int_equal(km_rpc_classify(KM_MIRROR_UNKNOWN_CLUSTER_MIRROR), KM_RPC_DONE);
	assert_string_equal(km_rpc_action_name(KM_RPC_REFRESH), "refresh");
	for (int i = 0; i < 50; i++) {
		int64_t d1 = km_rpc_backoff_ms(1, 100, 1000), d3 = km_rpc_backoff_ms(3, 100, 1000);
		int64_t d9 = km_rpc_backoff_ms(9, 100, 1000);
		assert_in_range(d1, 80, 120);
		assert_in_range(d3, 320, 480);
		assert_in_range(d9, 800, 1200);
	}
}

static void test_call_decoded(void **state)
{
	struct event_base *base = event_base_new();
	km_list_mirrors_request rq;
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	km_list_mirrors_request_init(&rq);
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, NULL, on_list, &res), KM_OK);
	run_until(base, &res.calls, 1);
	assert_int_equal(res.calls, 1);
	assert_int_equal(res.r.err, KM_OK);
	assert_int_equal(res.r.api_key, KM_API_LIST_MIRRORS);
	assert_int_equal(res.r.attempts, 1);
	assert_int_equal(res.count, 1);
	assert_string_equal(res.name, "m1");
	/* A version the codec lacks is refused before anything is sent. */
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 7, &rq, NULL, on_list, &res), KM_ERR_UNSUPPORTED);
	assert_int_equal(f.list_calls, 1);
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_resend_on_retriable(void **state)
{
	struct event_base *base = event_base_new();
	km_list_mirrors_request rq;
	km_rpc_opts o = {.error_of = list_error, .retry_budget_ms = 2000, .backoff_ms = 10, .backoff_max_ms = 20};
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	f.busy = 2;
	km_list_mirrors_request_init(&rq);
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, &o, on_list, &res), KM_OK);
	run_until(base, &res.calls, 1);
	assert_int_equal(res.calls, 1);
	assert_int_equal(res.r.err, KM_OK);
	assert_int_equal(res.r.code, KM_OK);
	assert_int_equal(res.r.attempts, 3);
	assert_int_equal(f.list_calls, 3);
	assert_string_equal(res.name, "m1");

	/* Past the budget the retriable code reaches the callback, with the policy's word on it. */
	f.busy = 100;
	o.retry_budget_ms = 50;
	res.calls = 0;
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, &o, on_list, &res), KM_OK);
	run_until(base, &res.calls, 1);
	assert_int_equal(res.calls, 1);
	assert_int_equal(res.r.err, KM_OK);
	assert_int_equal(res.r.code, KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS);
	assert_int_equal(res.r.action, KM_RPC_RETRY);
	assert_true(res.r.attempts >= 2);
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_decode_error(void **state)
{
	struct event_base *base = event_base_new();
	km_list_mirrors_request rq;
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	f.garbage = true;
	km_list_mirrors_request_init(&rq);
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, NULL, on_list, &res), KM_OK);
	run_until(base, &res.calls, 1);
	assert_int_equal(res.calls, 1);
	assert_int_equal(res.r.err, KM_ERR_DECODE);
	assert_int_equal(res.r.action, KM_RPC_DONE);
	assert_null(res.r.msg);
	assert_non_null(strstr(res.name, "ListMirrors"));
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/* The caller's arena: the decoded response outlives the callback. */
static void on_keep(km_net_client *c, const km_rpc_response *r, void *arg)
{
	const km_list_mirrors_response **out = arg;
	(void)c;
	*out = r->msg;
}

static void test_caller_arena(void **state)
{
	struct event_base *base = event_base_new();
	km_list_mirrors_request rq;
	km_arena a;
	km_rpc_opts o = {0};
	const km_list_mirrors_response *kept = NULL;
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	km_arena_init(&a, 0);
	o.arena = &a;
	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	km_list_mirrors_request_init(&rq);
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, &o, on_keep, &kept), KM_OK);
	for (int i = 0; i < 400 && !kept; i++)
		event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	run_until(base, &res.calls, 1);
	assert_non_null(kept);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(kept->mirrors.count, 1);
	assert_true(km_str_eq_c(kept->mirrors.items[0].source_bootstrap_servers, "src:9092"));
	km_arena_free(&a);
	km_net_client_free(c);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static void test_freed_while_waiting(void **state)
{
	struct event_base *base = event_base_new();
	km_list_mirrors_request rq;
	km_rpc_opts o = {.error_of = list_error, .retry_budget_ms = 60000, .backoff_ms = 5000, .backoff_max_ms = 5000};
	fake f;
	result res = {0};
	km_net_client *c;
	(void)state;

	fake_start(&f, base);
	c = ready_client(base, &f, &res);
	f.busy = 100;
	km_list_mirrors_request_init(&rq);
	assert_int_equal(km_rpc_call(c, KM_API_LIST_MIRRORS, 0, &rq, &o, on_list, &res), KM_OK);
	for (int i = 0; i < 400 && f.list_calls < 1; i++)
		event_base_loop(base, EVLOOP_ONCE);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(res.calls, 0); /* its resend waits on the timer */
	km_net_client_free(c);
	assert_int_equal(res.calls, 1);
	assert_int_equal(res.r.err, KM_ERR_CLOSED);
	fake_stop(&f);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_pick),        cmocka_unit_test(test_policy),
		cmocka_unit_test(test_call_decoded),        cmocka_unit_test(test_resend_on_retriable),
		cmocka_unit_test(test_decode_error),        cmocka_unit_test(test_caller_arena),
		cmocka_unit_test(test_freed_while_waiting),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
