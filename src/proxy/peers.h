/* Proxy-internal: open client connections counted per source address, for max_connections_per_ip (peers.c). */
#ifndef KMIRROR_PROXY_PEERS_H
#define KMIRROR_PROXY_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* One source address and how many connections it has open; in the table while that is above 0. */
typedef struct km_peer km_peer;

/* The table (a uthash head; empty: NULL). */
typedef struct km_peers {
	km_peer *head;
} km_peers;

/*
 * One more connection from sa's address (an IPv4-mapped IPv6 address counts as the IPv4 one): its
 * entry, to give back with km_peers_release when the connection closes. NULL when the address has
 * cap connections open already (*full set; cap 0: no cap) or memory ran out (*full clear).
 * One hash lookup.
 */
km_peer *km_peers_take(km_peers *t, const struct sockaddr *sa, int64_t cap, bool *full);
/* A connection of p's address closed (p NULL: nothing to do); p is freed with its last one. */
void km_peers_release(km_peers *t, km_peer *p);
/* Addresses with connections open. */
size_t km_peers_count(const km_peers *t);
/* Connections open from p's address. */
uint32_t km_peer_conns(const km_peer *p);
/* sa's address as text, for logs. */
void km_peers_format(const struct sockaddr *sa, char *buf, size_t len);
/* Free every entry (the connections are gone). */
void km_peers_clear(km_peers *t);

#endif
