/* Proxy-internal: the proxy's own state (listeners, brokers, metadata refresh, drain); sessions see it only through km_session_host. */
#ifndef KMIRROR_PROXY_INT_H
#define KMIRROR_PROXY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/listener.h>

#include "kmirror/cluster.h"
#include "kmirror/daemon_config.h"
#include "kmirror/metrics.h"
#include "kmirror/net.h"
#include "kmirror/proxy.h"
#include "proxy/apis.h"
#include "proxy/counters.h"
#include "proxy/features.h"
#include "proxy/rewrite.h"
#include "proxy/session.h"

/* An HTTP listener and its connections (http.c). */
typedef struct km_http km_http;

/* The client-facing listener of an upstream broker (where it lives is in km_proxy.upstream). */
typedef struct km_broker {
	struct km_proxy *px;
	int32_t node_id;
	struct evconnlistener *listener;
	struct event *resume_ev; /* re-enables the listener after an accept failure (EMFILE) */
} km_broker;

struct km_proxy {
	struct event_base *base;
	struct evdns_base *dns;
	km_config cfg;
	struct evconnlistener *bootstrap;
	km_broker bootstrap_b; /* node -1: the bootstrap listener's argument */
	km_broker **brokers;
	size_t nbrokers, capbrokers;
	km_http *http;              /* http_listen */
	km_http *admin_http;        /* admin_listen; NULL: the admin routes are on http */
	SSL_CTX *admin_tls;         /* admin_listen's TLS; NULL: plain HTTP */
	km_proxy_apis *apis;      /* what happens to each API's requests and responses */
	km_session_host host;     /* what the sessions see of the proxy */
	km_proxy_features features; /* what the features read (host.features points here) */
	km_session_set *sessions;
	struct event *tick_ev;
	/* the upstream: bootstrap rotation and the brokers' addresses, learned from every answer */
	km_cluster *upstream;
	SSL_CTX *own_tls;         /* upstream's clients (kmirrord's own connections): with upstream_tls_cert_file */
	/* metadata refresh */
	km_net_client *meta;      /* the refresh in flight (a bootstrap client of upstream), one-shot */
	uint64_t meta_last_ok_ms;
	uint64_t meta_next_ms;
	uint64_t meta_backoff_ms; /* after failures: 1 s, doubling up to metadata_refresh_ms */
	/* drain */
	bool draining;
	struct event *drain_ev;
	size_t drain_per_round;
	uint64_t drain_deadline_ms;
	void (*drain_done)(void *arg);
	void *drain_arg;
	/* upstream swap (swap.c) */
	km_proxy_swap_ops swap_ops;
	void *gen;                    /* the current upstream's modules (the daemon's handle) */
	struct km_swap *swap;         /* the swap being prepared; NULL: none */
	struct km_prev_upstream *prev; /* previous upstreams whose sessions still drain */
	char swap_last[512];          /* the last swap's outcome, for km_proxy_swap_status */
	km_proxy_counters metrics;
	km_metrics *registry;     /* served on /metrics */
	km_metrics *own_registry; /* when the caller gave none */
};

uint64_t km_proxy_now_ms(const km_proxy *px);
/* s as a JSON string, quoted and escaped (NULL: ""). */
void km_proxy_json_str(struct evbuffer *out, const char *s);
/* proxy.c for swap.c: the rewriting context (learn: where learned brokers go, NULL: nowhere), a metadata refresh now. */
void km_proxy_fill_rewrite_ctx(km_proxy *px, km_rewrite_ctx *ctx,
			       void (*learn)(void *arg, int32_t node_id, km_str host, int32_t port, km_str rack), void *arg);
void km_proxy_refresh_now(km_proxy *px);
/*
 * proxy.c for swap.c: a new px->upstream from px->cfg (after the old one was given away or freed);
 * carry: an old cluster whose broker addresses the new one starts with (a reload), or NULL.
 */
km_err km_proxy_upstream_new(km_proxy *px, const km_cluster *carry);
/* swap.c for proxy.c: free what swaps hold (at km_proxy_free). */
void km_proxy_swap_free(km_proxy *px);
/*
 * http.c for proxy.c: the HTTP listeners of px->cfg (none when http_listen and admin_listen are
 * unset); their limits after a reload (for new connections); their end.
 */
km_err km_proxy_http_start(km_proxy *px, char *err, size_t errlen) __attribute__((warn_unused_result));
void km_proxy_http_reload(km_proxy *px);
void km_proxy_http_free(km_proxy *px);
/*
 * The body of POST /admin/upstream (the new bootstrap list) as text for km_proxy_swap: at most
 * cap - 1 bytes, no NUL byte, trailing newlines and spaces dropped. false with why set when it is
 * none of that (HTTP 400).
 */
bool km_proxy_admin_body(struct evbuffer *body, char *text, size_t cap, char *why, size_t whylen);

#endif
