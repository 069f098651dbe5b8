/* Open client connections per source address: a uthash table keyed by the address's bytes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A peer picks the table's size by connecting: running out of memory must not abort the daemon. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#include "proxy/peers.h"

/* The key: the family and the address, zero-padded, so equal addresses are equal bytes. */
typedef struct peer_key {
	uint8_t family;
	uint8_t addr[16];
} peer_key;

struct km_peer {
	peer_key key;
	uint32_t conns;
	UT_hash_handle hh;
};

static void key_of(const struct sockaddr *sa, peer_key *k)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	memset(k, 0, sizeof(*k));
	if (sa && sa->sa_family == AF_INET) {
		k->family = AF_INET;
		memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa && sa->sa_family == AF_INET6) {
		const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		/* A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: the same peer as a.b.c.d. */
		if (memcmp(a, mapped, sizeof(mapped)) == 0) {
			k->family = AF_INET;
			memcpy(k->addr, a + 12, 4);
		} else {
			k->family = AF_INET6;
			memcpy(k->addr, a, 16);
		}
	} else if (sa) {
		k->family = (uint8_t)sa->sa_family; /* no address to tell peers apart: one entry */
	}
}

km_peer *km_peers_take(km_peers *t, const struct sockaddr *sa, int64_t cap, bool *full)
{
	peer_key k;
	km_peer *p;

	*full = false;
	key_of(sa, &k);
	HASH_FIND(hh, t->head, &k, sizeof(k), p);
	if (p) {
		if (cap > 0 && p->conns >= (uint64_t)cap) {
			*full = true;
			return NULL;
		}
		p->conns++;
		return p;
	}
	if (!(p = calloc(1, sizeof(*p))))
		return NULL;
	p->key = k;
	p->conns = 1;
	HASH_ADD(hh, t->head, key, sizeof(p->key), p);
	if (!p->hh.tbl) { /* the table could not grow */
		free(p);
		return NULL;
	}
	return p;
}

void km_peers_release(km_peers *t, km_peer *p)
{
	if (!p)
		return;
	if (--p->conns)
		return;
	HASH_DEL(t->head, p);
	free(p);
}

size_t km_peers_count(const km_peers *t)
{
	return HASH_COUNT(t->head);
}

uint32_t km_peer_conns(const km_peer *p)
{
	return p->conns;
}

void km_peers_format(const struct sockaddr *sa, char *buf, size_t len)
{
	char a[INET6_ADDRSTRLEN];
	const void *src = NULL;

	if (sa && sa->sa_family == AF_INET)
		src = &((const struct sockaddr_in *)sa)->sin_addr;
	else if (sa && sa->sa_family == AF_INET6)
		src = &((const struct sockaddr_in6 *)sa)->sin6_addr;
	if (!src || !inet_ntop(sa->sa_family, src, a, sizeof(a)))
		snprintf(a, sizeof(a), "?");
	snprintf(buf, len, "%s", a);
}

void km_peers_clear(km_peers *t)
{
	km_peer *p, *tmp;
	HASH_ITER(hh, t->head, p, tmp) {
		HASH_DEL(t->head, p);
		free(p);
	}
}
