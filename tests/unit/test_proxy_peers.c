/* Unit tests for the per-address connection counts behind max_connections_per_ip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <cmocka.h>

#include "proxy/peers.h"

static struct sockaddr_in v4(const char *a, uint16_t port)
{
	struct sockaddr_in sin;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	assert_int_equal(inet_pton(AF_INET, a, &sin.sin_addr), 1);
	return sin;
}

static struct sockaddr_in6 v6(const char *a, uint16_t port)
{
	struct sockaddr_in6 sin6;
	memset(&sin6, 0, sizeof(sin6));
	sin6.sin6_family = AF_INET6;
	sin6.sin6_port = htons(port);
	assert_int_equal(inet_pton(AF_INET6, a, &sin6.sin6_addr), 1);
	return sin6;
}

/* The cap counts connections per address, whatever the port; a release makes room again. */
static void test_cap_per_address(void **state)
{
	km_peers t = {NULL};
	struct sockaddr_in a1 = v4("127.0.12.3", 1000), a2 = v4("127.0.12.3", 1001), b = v4("127.0.12.4", 1000);
	km_peer *p[3], *q;
	bool full;

	(void)state;
	p[0] = km_peers_take(&t, (struct sockaddr *)&a1, 2, &full);
	p[1] = km_peers_take(&t, (struct sockaddr *)&a2, 2, &full);
	assert_non_null(p[0]);
	assert_ptr_equal(p[0], p[1]);
	assert_int_equal(km_peer_conns(p[0]), 2);
	/* the third from that address is refused, one from another address is not */
	assert_null(km_peers_take(&t, (struct sockaddr *)&a1, 2, &full));
	assert_true(full);
	q = km_peers_take(&t, (struct sockaddr *)&b, 2, &full);
	assert_non_null(q);
	assert_ptr_not_equal(q, p[0]);
	assert_int_equal(km_peers_count(&t), 2);
	/* one closes: room for one more */
	km_peers_release(&t, p[1]);
	p[2] = km_peers_take(&t, (struct sockaddr *)&a1, 2, &full);
	assert_ptr_equal(p[2], p[0]);
	/* cap 0: no cap */
	assert_non_null(km_peers_take(&t, (struct sockaddr *)&a1, 0, &full));
	assert_int_equal(km_peer_conns(p[0]), 3);
	/* the last connection of an address takes its entry with it */
	km_peers_release(&t, q);
	assert_int_equal(km_peers_count(&t), 1);
	km_peers_release(&t, NULL);
	for (int i = 0; i < 3; i++)
		km_peers_release(&t, p[0]);
	assert_int_equal(km_peers_count(&t), 0);
	assert_null(t.head);
}

/* A dual-stack listener sees an IPv4 client as ::ffff:a.b.c.d: the same peer; a real IPv6 address is another. */
static void test_mapped_v4_is_v4(void **state)
{
	km_peers t = {NULL};
	struct sockaddr_in a = v4("10.1.2.3", 5);
	struct sockaddr_in6 m = v6("::ffff:10.1.2.3", 6), o = v6("2001:db8::1", 7);
	km_peer *p, *q, *r;
	bool full;
	char text[64];

	(void)state;
	p = km_peers_take(&t, (struct sockaddr *)&a, 1, &full);
	assert_non_null(p);
	assert_null(km_peers_take(&t, (struct sockaddr *)&m, 1, &full));
	assert_true(full);
	q = km_peers_take(&t, (struct sockaddr *)&o, 1, &full);
	assert_non_null(q);
	r = km_peers_take(&t, NULL, 1, &full); /* no address: one entry of its own */
	assert_non_null(r);
	assert_int_equal(km_peers_count(&t), 3);
	km_peers_format((struct sockaddr *)&o, text, sizeof(text));
	assert_string_equal(text, "2001:db8::1");
	km_peers_format((struct sockaddr *)&a, text, sizeof(text));
	assert_string_equal(text, "10.1.2.3");
	km_peers_clear(&t);
	assert_null(t.head);
}

/* Many addresses (the table grows) and all of them gone again. */
static void test_many_addresses(void **state)
{
	km_peers t = {NULL};
	static km_peer *p[5000];
	bool full;

	(void)state;
	for (int i = 0; i < 5000; i++) {
		struct sockaddr_in a = v4("10.0.0.0", 1);
		a.sin_addr.s_addr = htonl(0x0a000000u + (uint32_t)i);
		p[i] = km_peers_take(&t, (struct sockaddr *)&a, 1, &full);
		assert_non_null(p[i]);
	}
	assert_int_equal(km_peers_count(&t), 5000);
	for (int i = 0; i < 5000; i++)
		km_peers_release(&t, p[i]);
	assert_int_equal(km_peers_count(&t), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cap_per_address),
		cmocka_unit_test(test_mapped_v4_is_v4),
		cmocka_unit_test(test_many_addresses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
