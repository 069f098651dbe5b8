/* Proxy-internal: client sessions behind a small interface (the proxy owns listeners and brokers; sessions own connections). */
#ifndef KMIRROR_PROXY_SESSION_H
#define KMIRROR_PROXY_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "kmirror/daemon_config.h"
#include "kmirror/error.h"
#include "kmirror/metrics.h"
#include "kmirror/mirror.h"
#include "kmirror/state.h"
#include "proxy/apis.h"
#include "proxy/counters.h"
#include "proxy/rewrite.h"

typedef struct km_session km_session;
typedef struct km_session_set km_session_set;
/* What the features read per host (features.h); the session passes it on and never looks inside. */
typedef struct km_proxy_features km_proxy_features;

/*
 * What sessions need from the proxy, and nothing else. The proxy owns this struct and keeps it
 * current (a reload replaces cfg's contents and the TLS contexts in place).
 */
typedef struct km_session_host {
	struct event_base *base;
	struct evdns_base *dns;
	const km_config *cfg;
	SSL_CTX *server_tls;   /* client side: NULL for plaintext */
	SSL_CTX *upstream_tls; /* upstream side: NULL for plaintext */
	km_proxy_counters *metrics;
	const km_proxy_apis *apis;
	km_state *state;       /* the mirror state store; NULL: no mirrors (km_proxy_set_state) */
	km_mirror *mirror;     /* the mirror module (creates destination topics); NULL: none (km_proxy_set_mirror) */
	km_proxy_features *features; /* the features' own data (read-only and offset lookups, the swap's Fetch hold) */
	km_session_set *sessions; /* the set the sessions live in (for km_session_answer from hooks) */
	/* The endpoint rewriting context (advertised host, ports, where learned brokers go). */
	void (*rewrite_ctx)(void *arg, km_rewrite_ctx *ctx);
	/* Where broker node_id lives upstream; false when unknown. */
	bool (*broker_addr)(void *arg, int32_t node_id, const char **host, uint16_t *port);
	void *arg;
} km_session_host;

km_session_set *km_session_set_new(const km_session_host *host);
/* Close every session and free them (not from inside a session callback). */
void km_session_set_free(km_session_set *set);
/*
 * A client connected from sa on the bootstrap port (node_id -1) or on broker node_id's port. Over
 * max_connections, or max_connections_per_ip from sa's address, fd is closed at once and counted
 * (kmirror_connections_rejected_total). The session dials its upstream when the client's first
 * request for the broker has been read, not before.
 */
void km_session_set_accept(km_session_set *set, int fd, const struct sockaddr *sa, int32_t node_id);
size_t km_session_set_count(const km_session_set *set);
/* The store st has loaded: sessions whose next request waited for it read on. */
void km_session_set_state_ready(km_session_set *set, const km_state *st);
/* A map's tail moved: the sessions whose Fetch waits at it read on now (docs/proxy.md, "A Fetch at the tail"). */
void km_session_set_tail_moved(km_session_set *set, const void *map);
/* Periodic checks of every session: idle, stalled frames, overdue responses. */
void km_session_set_tick(km_session_set *set, uint64_t now_ms);
/* Ask up to n sessions that are not draining yet to close at their next request boundary; returns how many. */
size_t km_session_set_drain(km_session_set *set, size_t n);
/* Close every session now (their memory goes at the end of the loop iteration). */
void km_session_set_close_all(km_session_set *set, const char *why);
/*
 * An upstream swap's generations: rehost moves every session on the set's host (the current one)
 * to to (the previous upstream's host, which must outlive them); new sessions keep getting the
 * set's host. The _of variants count, drain and close only the sessions on host.
 */
void km_session_set_rehost(km_session_set *set, const km_session_host *to);
size_t km_session_set_count_of(const km_session_set *set, const km_session_host *host);
size_t km_session_set_drain_of(km_session_set *set, const km_session_host *host, size_t n);
void km_session_set_close_of(km_session_set *set, const km_session_host *host, const char *why);

/*
 * A Fetch at the mirror's tail (docs/proxy.md, "A partition with nothing visible"): the broker
 * answers at once whatever lies past the tail, which the proxy hides, and the client asks again at
 * once. The streamed answer notes what it showed; a next request that asks for nothing before the
 * tails, after an answer that showed nothing but hid something, waits this long before it goes
 * upstream (once: then it goes whatever the tails say).
 */
#define KM_FETCH_TAIL_WAIT_MS 50
/* The answer showed a batch of a mapped partition: the next Fetch does not wait. */
void km_session_fetch_shown(km_session *s);
bool km_session_fetch_may_wait(const km_session *s);
/*
 * The answer blanked a partition at map's tail (its tail_logical then, the lookup's epoch then):
 * the next Fetch may wait, unless that tail has moved since (km_session_fetch_blanks). The first
 * KM_TAIL_MAPS are kept; km_session_fetch_shown and km_session_fetch_blanks_clear forget them.
 */
void km_session_fetch_blank_at(km_session *s, const void *map, int64_t tail, uint64_t epoch);
size_t km_session_fetch_blanks(const km_session *s, const void *const **maps, const int64_t **tails, uint64_t *epoch);
void km_session_fetch_blanks_clear(km_session *s);

uint64_t km_session_id(const km_session *s);
/* What the session sees of the proxy (hooks reach the state store and the session set through it). */
const km_session_host *km_session_host_of(const km_session *s);
/*
 * Answer a request that a LOCAL hook left pending (km_req.pending): body is the response body
 * (after the response header; moved out of body). It is sent once every earlier response has
 * been. KM_ERR_CLOSED when the session is gone, KM_ERR_INVAL when no such request is pending.
 */
km_err km_session_answer(km_session_set *set, uint64_t session_id, uint64_t seq, struct evbuffer *body);
/* Close a session whose pending request cannot be answered (the client retries on a new connection). */
void km_session_fail(km_session_set *set, uint64_t session_id, const char *why);

/*
 * A probe's outcome: err KM_OK with the response body (after the response header, len bytes,
 * valid during the call only), or KM_ERR_CLOSED with no body when the session closed first (then
 * the callback must not touch the session). Called exactly once.
 */
typedef void (*km_session_probe_cb)(void *arg, km_err err, const uint8_t *body, size_t len);
/*
 * Send a request the proxy made (body: after the request header, len bytes; copied) on the
 * session's own upstream connection, after everything the client sent on it so far (connected or
 * not yet: it waits with them), as the client's connection is authenticated: the broker
 * authorizes it as the caller. It takes its own FIFO entry; its response goes to cb, never to the
 * client. Called from a LOCAL or HOLD hook, it comes before that request's own entry, so the
 * answer made from it keeps the client's responses in order.
 */
km_err km_session_probe(km_session *s, int16_t key, int16_t version, const uint8_t *body, size_t len,
			km_session_probe_cb cb, void *arg) __attribute__((warn_unused_result));

#endif
