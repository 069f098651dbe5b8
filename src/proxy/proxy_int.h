/* Proxy-internal structures shared by proxy.c (listeners, brokers, drain) and session.c (per-client forwarding). */
#ifndef KMIRROR_PROXY_INT_H
#define KMIRROR_PROXY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/http.h>
#include <event2/listener.h>

#include "kmirror/daemon_config.h"
#include "kmirror/metrics.h"
#include "kmirror/net.h"
#include "kmirror/proxy.h"
#include "proxy/rewrite.h"

typedef struct km_session km_session;

/* An upstream broker learned from metadata, and the client-facing listener for it. */
typedef struct km_broker {
	struct km_proxy *px;
	int32_t node_id;
	char host[256];
	uint16_t port;
	struct evconnlistener *listener;
	struct event *resume_ev; /* re-enables the listener after an accept failure (EMFILE) */
} km_broker;

struct km_proxy {
	struct event_base *base;
	struct evdns_base *dns;
	km_config cfg;
	SSL_CTX *server_tls;
	SSL_CTX *upstream_tls;
	struct evconnlistener *bootstrap;
	km_broker bootstrap_b; /* node -1: the bootstrap listener's argument */
	km_broker **brokers;
	size_t nbrokers, capbrokers;
	struct evhttp *http;
	km_session *sessions; /* doubly linked, newest first */
	size_t nsessions;
	km_session *dead;     /* closed sessions, freed by reap_ev at the end of the loop iteration */
	struct event *reap_ev;
	struct event *tick_ev;
	/* metadata refresh */
	km_net_client *meta;
	int meta_next_upstream;
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
	km_proxy_counters metrics;
	km_metrics *registry;     /* served on /metrics */
	km_metrics *own_registry; /* when the caller gave none */
	uint64_t next_session_id;
};

uint64_t km_proxy_now_ms(const km_proxy *px);

/* counters.c: the hot path's requests and latencies by API key, and the families they are read through. */
void km_metrics_request(km_proxy_counters *m, int16_t api_key);
void km_metrics_latency(km_proxy_counters *m, int16_t api_key, double seconds);
km_err km_proxy_counters_register(km_proxy_counters *c, km_metrics *reg) __attribute__((warn_unused_result));
void km_proxy_rewrite_ctx(km_proxy *px, km_rewrite_ctx *ctx);
/* Where broker node_id lives upstream; false when unknown. */
bool km_proxy_broker_addr(const km_proxy *px, int32_t node_id, const char **host, uint16_t *port);

/* session.c */
void km_session_accept(km_proxy *px, int fd, int32_t node_id);
/* Close now (both sides); the memory goes at the end of the loop iteration. */
void km_session_close(km_session *s, const char *why);
/* Periodic checks: idle, stalled frames, overdue responses. */
void km_session_tick(km_session *s, uint64_t now);
/* Ask a session to close at the next request boundary (drain). Returns false if already closing. */
bool km_session_drain(km_session *s);
bool km_session_is_draining(const km_session *s);
km_session *km_session_next(const km_session *s);
void km_session_free(km_session *s);
/* Free the sessions closed so far (runs at the end of a loop iteration, and at shutdown). */
void km_session_reap(km_proxy *px);

#endif
