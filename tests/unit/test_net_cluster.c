/* Unit tests for src/net/cluster.c: the broker table (metadata, learning, moves), bootstrap rotation after a failed connection, a broker's lanes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <cmocka.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "kmirror/cluster.h"

static km_metadata_response two_brokers(km_metadata_response_broker *b)
{
	km_metadata_response r;

	km_metadata_response_init(&r);
	memset(b, 0, 2 * sizeof(*b));
	b[0].node_id = 1;
	b[0].host = km_str_c("h1");
	b[0].port = 9001;
	b[1].node_id = 2;
	b[1].host = km_str_c("h2");
	b[1].port = 9002;
	r.brokers.items = b;
	r.brokers.count = 2;
	return r;
}

static km_cluster *new_cluster(struct event_base *base, const km_hostport *boot, size_t n, void (*cb)(void *), void *arg)
{
	km_net_client_opts o;

	memset(&o, 0, sizeof(o));
	o.client_id = "test";
	o.connect_timeout_ms = 2000;
	o.request_timeout_ms = 2000;
	o.skip_api_versions = true; /* ready once connected: no broker here */
	return km_cluster_new(base, "test", &o, boot, n, cb, arg);
}

static void test_broker_table(void **state)
{
	struct event_base *base = event_base_new();
	km_hostport boot = {"127.0.0.1", 1};
	km_metadata_response_broker b[2];
	km_metadata_response r = two_brokers(b), empty;
	km_cluster *cl = new_cluster(base, &boot, 1, NULL, NULL);
	int32_t ids[4];
	const char *host;
	uint16_t port;
	bool moved;
	(void)state;

	assert_non_null(cl);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 0);
	assert_false(km_cluster_addr(cl, 1, &host, &port));
	assert_null(km_cluster_node(cl, 1));
	assert_int_equal(km_cluster_brokers(cl, &r), KM_OK);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 2);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 2);
	assert_true(km_cluster_addr(cl, 2, &host, &port));
	assert_string_equal(host, "h2");
	assert_int_equal(port, 9002);
	/* A response naming no broker is no news. */
	km_metadata_response_init(&empty);
	assert_int_equal(km_cluster_brokers(cl, &empty), KM_OK);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 2);
	/* Learning: the same address, a move, a new broker, and what cannot be an address. */
	assert_int_equal(km_cluster_learn(cl, 1, "h1", 2, 9001, &moved), KM_OK);
	assert_false(moved);
	assert_int_equal(km_cluster_learn(cl, 1, "h1x", 3, 9101, &moved), KM_OK);
	assert_true(moved);
	assert_true(km_cluster_addr(cl, 1, &host, &port));
	assert_string_equal(host, "h1x");
	assert_int_equal(port, 9101);
	assert_int_equal(km_cluster_learn(cl, 7, "h7", 2, 9007, &moved), KM_OK);
	assert_false(moved);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 3);
	assert_int_equal(ids[2], 7);
	assert_int_equal(km_cluster_learn(cl, 8, "h8", 2, 0, &moved), KM_ERR_INVAL);
	assert_int_equal(km_cluster_learn(cl, 8, "", 0, 9008, &moved), KM_ERR_INVAL);
	assert_int_equal(km_cluster_learn(cl, -1, "h", 1, 9008, &moved), KM_ERR_INVAL);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 3);
	/* The next metadata replaces the table. */
	assert_int_equal(km_cluster_brokers(cl, &r), KM_OK);
	assert_int_equal(km_cluster_node_ids(cl, ids, 4), 2);
	assert_false(km_cluster_addr(cl, 7, &host, &port));
	km_cluster_free(cl);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

typedef struct watch {
	struct event_base *base;
	int changes;
} watch;

static void on_change(void *arg)
{
	watch *w = arg;
	w->changes++;
	event_base_loopbreak(w->base);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	(void)l;
	(void)sa;
	(void)len;
	(void)arg;
	evutil_closesocket(fd);
}

/* Run the loop until on_change (or 5 s). */
static void wait_change(watch *w)
{
	struct timeval tv = {5, 0};
	int before = w->changes;
	event_base_loopexit(w->base, &tv);
	event_base_dispatch(w->base);
	assert_true(w->changes > before);
}

static void test_bootstrap_rotation(void **state)
{
	struct event_base *base = event_base_new();
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	struct evconnlistener *l;
	km_hostport boot[2] = {{"127.0.0.1", 1}, {"127.0.0.1", 0}};
	watch w = {base, 0};
	km_cluster *cl;
	km_net_client *c1, *c2;
	(void)state;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	l = evconnlistener_new_bind(base, on_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, -1,
				    (struct sockaddr *)&sin, sizeof(sin));
	assert_non_null(l);
	getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sin, &sl);
	boot[1].port = ntohs(sin.sin_port);
	cl = new_cluster(base, boot, 2, on_change, &w);
	assert_non_null(cl);
	/* The first bootstrap address refuses: the client fails, and says why. */
	c1 = km_cluster_any(cl);
	assert_non_null(c1);
	assert_ptr_equal(km_cluster_any(cl), c1);
	while (!km_cluster_failed(cl, c1))
		wait_change(&w);
	assert_true(strlen(km_cluster_last_error(cl)) > 0);
	assert_false(km_cluster_usable(cl, c1)); /* and is dropped */
	/* The next one is the second address, which accepts: ready (no ApiVersions here). */
	c2 = km_cluster_any(cl);
	assert_non_null(c2);
	while (!km_net_client_ready(c2) && !km_cluster_failed(cl, c2))
		wait_change(&w);
	assert_true(km_cluster_usable(cl, c2));
	assert_false(km_cluster_failed(cl, c2));
	km_cluster_free(cl);
	event_base_loop(base, EVLOOP_NONBLOCK); /* the clients' memory goes at the end of a loop iteration */
	evconnlistener_free(l);
	event_base_free(base);
}

/* Accepted connections, kept open until the test ends. */
typedef struct accepted {
	evutil_socket_t fd[16];
	int n;
} accepted;

static void on_accept_keep(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	accepted *a = arg;
	(void)l;
	(void)sa;
	(void)len;
	if (a->n < 16)
		a->fd[a->n++] = fd;
	else
		evutil_closesocket(fd);
}

/*
 * A broker's lanes are connections of their own: each opened when first asked, lane 0 the one
 * km_cluster_node gives; dropping one leaves the others; a metadata answer with the same address
 * keeps them all, a move drops them all.
 */
static void test_lanes(void **state)
{
	struct event_base *base = event_base_new();
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	accepted acc = {.n = 0};
	struct evconnlistener *l;
	km_hostport boot = {"127.0.0.1", 1};
	watch w = {base, 0};
	km_net_client *c[KM_CLUSTER_LANES], *again;
	km_metadata_response_broker b[2];
	km_metadata_response r = two_brokers(b);
	km_cluster *cl;
	bool moved;
	(void)state;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	l = evconnlistener_new_bind(base, on_accept_keep, &acc, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, -1,
				    (struct sockaddr *)&sin, sizeof(sin));
	assert_non_null(l);
	getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sin, &sl);
	cl = new_cluster(base, &boot, 1, on_change, &w);
	assert_non_null(cl);
	assert_int_equal(km_cluster_learn(cl, 1, "127.0.0.1", 9, ntohs(sin.sin_port), &moved), KM_OK);
	for (unsigned i = 0; i < KM_CLUSTER_LANES; i++) {
		c[i] = km_cluster_lane(cl, 1, i);
		assert_non_null(c[i]);
		for (unsigned k = 0; k < i; k++)
			assert_ptr_not_equal(c[i], c[k]);
	}
	assert_ptr_equal(km_cluster_node(cl, 1), c[0]);
	assert_null(km_cluster_lane(cl, 1, KM_CLUSTER_LANES));
	assert_null(km_cluster_lane(cl, 5, 1)); /* no such broker */
	while (acc.n < KM_CLUSTER_LANES)
		wait_change(&w);
	for (unsigned i = 0; i < KM_CLUSTER_LANES; i++) {
		while (!km_net_client_ready(c[i]) && !km_cluster_failed(cl, c[i]))
			wait_change(&w);
		assert_true(km_cluster_usable(cl, c[i]));
	}
	assert_int_equal(acc.n, KM_CLUSTER_LANES); /* one connection each, asked again or not */
	assert_ptr_equal(km_cluster_lane(cl, 1, 2), c[2]);
	/* One lane dropped: a new client for it, the others kept. */
	km_cluster_drop(cl, c[2]);
	assert_true(km_cluster_failed(cl, c[2]));
	again = km_cluster_lane(cl, 1, 2);
	assert_non_null(again);
	assert_ptr_equal(km_cluster_lane(cl, 1, 1), c[1]);
	assert_ptr_equal(km_cluster_lane(cl, 1, 3), c[3]);
	c[2] = again;
	/* Metadata naming broker 1 at the same address keeps its lanes. */
	b[0].host = km_str_c("127.0.0.1");
	b[0].port = ntohs(sin.sin_port);
	assert_int_equal(km_cluster_brokers(cl, &r), KM_OK);
	for (unsigned i = 0; i < KM_CLUSTER_LANES; i++)
		assert_false(km_cluster_failed(cl, c[i]));
	/* A move drops every lane. */
	assert_int_equal(km_cluster_learn(cl, 1, "127.0.0.2", 9, ntohs(sin.sin_port), &moved), KM_OK);
	assert_true(moved);
	for (unsigned i = 0; i < KM_CLUSTER_LANES; i++)
		assert_true(km_cluster_failed(cl, c[i]));
	km_cluster_free(cl);
	event_base_loop(base, EVLOOP_NONBLOCK);
	for (int i = 0; i < acc.n; i++)
		evutil_closesocket(acc.fd[i]);
	evconnlistener_free(l);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_broker_table),
		cmocka_unit_test(test_bootstrap_rotation),
		cmocka_unit_test(test_lanes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
