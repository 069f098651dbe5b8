/* kmirror proxy: listeners, client sessions with their upstream connections, endpoint rewriting, drain and reload. */
#ifndef KMIRROR_PROXY_H
#define KMIRROR_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "kmirror/daemon_config.h"
#include "kmirror/error.h"
#include "kmirror/metrics.h"
#include "kmirror/mirror.h"
#include "kmirror/state.h"

typedef struct km_proxy km_proxy;

/*
 * Per-key counters and histograms have one slot per Kafka API key below KM_PROXY_MAX_API, then one
 * per mirror RPC (api keys 32000 up, KM_PROXY_MIRROR_APIS of them): km_proxy_api_slot maps a key.
 */
#define KM_PROXY_MAX_API 128
#define KM_PROXY_MIRROR_APIS 10
#define KM_PROXY_API_SLOTS (KM_PROXY_MAX_API + KM_PROXY_MIRROR_APIS)
#define KM_PROXY_LATENCY_BUCKETS 12

typedef enum {
	KM_REJECT_TOO_LARGE = 0,
	KM_REJECT_BAD_SIZE,
	KM_REJECT_TLS_HELLO,
	KM_REJECT_HTTP,
	KM_REJECT_BAD_HEADER,
	KM_REJECT_FRAME_TIMEOUT,
	KM_REJECT_IDLE_TIMEOUT,
	KM_REJECT_REQUEST_TIMEOUT,
	KM_REJECT_STATE_TIMEOUT,
	KM_REJECT_MAX_CONNECTIONS,        /* refused at accept: max_connections open */
	KM_REJECT_MAX_CONNECTIONS_PER_IP, /* refused at accept: max_connections_per_ip open from that address */
	KM_REJECT__COUNT,
} km_reject_reason;

/* Why the HTTP endpoint refused a connection or a request (kmirror_http_rejected_total{reason}). */
typedef enum {
	KM_HTTP_REJECT_MAX_CONNECTIONS = 0,
	KM_HTTP_REJECT_REQUEST_TIMEOUT,
	KM_HTTP_REJECT_TOO_MANY_HEADERS,
	KM_HTTP_REJECT_UNAUTHORIZED,      /* an admin request without the right token, or the token file unusable */
	KM_HTTP_REJECT__COUNT,
} km_http_reject_reason;

/*
 * The proxy's counters: plain fields the hot path increments, read by the metrics registry through
 * pointers (counters.c names them: kmirror_client_connections, kmirror_requests_total{api_key}, ...).
 */
typedef struct km_proxy_counters {
	uint64_t client_connections;          /* gauge */
	uint64_t client_connections_total;
	uint64_t upstream_connections;        /* gauge */
	uint64_t upstream_connects_total;
	uint64_t upstream_errors_total;       /* failed connects, resets, bad frames from upstream */
	uint64_t client_bytes_in, client_bytes_out;
	uint64_t upstream_bytes_in, upstream_bytes_out;
	uint64_t rejected[KM_REJECT__COUNT];
	uint64_t responses_rewritten_total;
	uint64_t spliced_bytes_total;         /* response bytes moved socket to socket with splice(2) */
	uint64_t splices_total;               /* the ranges they moved in */
	uint64_t fetch_oor_held_total;        /* OFFSET_OUT_OF_RANGE answered OFFSET_NOT_AVAILABLE after a swap */
	uint64_t fetch_tail_waits_total;      /* Fetch requests held a moment at the mirror's tail */
	uint64_t fetch_tail_waits_woken_total; /* of those, the ones a tail move ended before the 50 ms */
	uint64_t brokers_known;               /* gauge */
	uint64_t requests[KM_PROXY_API_SLOTS]; /* by km_proxy_api_slot */
	uint64_t requests_unknown;            /* api key with no slot */
	uint64_t latency_bucket[KM_PROXY_API_SLOTS][KM_PROXY_LATENCY_BUCKETS]; /* non-cumulative */
	uint64_t latency_count[KM_PROXY_API_SLOTS];
	double latency_sum[KM_PROXY_API_SLOTS];
	uint64_t draining;                    /* gauge: 1 while draining on SIGTERM */
	uint64_t http_connections;            /* gauge: HTTP connections open, every HTTP listener */
	uint64_t http_rejected[KM_HTTP_REJECT__COUNT];
	km_metric_family *mirror_rpc_errors;  /* kmirror_mirror_rpc_errors_total{api,error}, registry-owned */
} km_proxy_counters;

/* Upper bounds of the latency buckets, seconds (+Inf is implicit). */
extern const double km_proxy_latency_bounds[KM_PROXY_LATENCY_BUCKETS];

const char *km_reject_reason_name(km_reject_reason r);
const char *km_http_reject_reason_name(km_http_reject_reason r);

/*
 * Start serving: the bootstrap listener, the HTTP endpoint, and the metadata refresh that opens one
 * listener per upstream broker. cfg is copied (and must have passed km_config_validate). The proxy's
 * counters are registered by pointer into metrics, which its HTTP endpoint serves: free the registry
 * after the proxy, and do not render it in between. NULL: the proxy keeps a registry of its own.
 */
km_proxy *km_proxy_new(struct event_base *base, const km_config *cfg, km_metrics *metrics, char *err,
		       size_t errlen);
/* Swap in a new configuration (already checked with km_config_check_reload). */
km_err km_proxy_reload(km_proxy *px, const km_config *next, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/*
 * Stop accepting, then close client connections gradually over drain_timeout_ms (in rounds every
 * drain_interval_ms, each connection between two requests); done is called when none is left.
 */
void km_proxy_drain(km_proxy *px, void (*done)(void *arg), void *arg);
void km_proxy_free(km_proxy *px);
/*
 * Give the proxy the mirror state store (kmirrord's main does, before serving): the mirror RPCs,
 * read-only mirror topics and mirror.name configs use it. Without one, mirror RPCs are answered
 * with an error and no topic is read-only. The store must outlive the proxy.
 */
void km_proxy_set_state(km_proxy *px, km_state *st);
/*
 * The store st has loaded (its on_ready), or read the state back again after a failed write (its
 * on_reread): requests that read the mirror state (Produce, Fetch, ListOffsets, ...) have waited
 * for it, unread, and go on now; /readyz and /healthz say ready.
 */
void km_proxy_state_ready(km_proxy *px, const km_state *st);
/*
 * Give the proxy the mirror module: StartMirrorTopics has it create topics missing on the
 * destination from the source (km_mirror_prepare_start). Without it such a topic is refused. The
 * module must outlive the proxy.
 */
void km_proxy_set_mirror(km_proxy *px, km_mirror *mi);

/*
 * Upstream swap (docs/proxy.md, "Upstream swap"): the proxy moves to another cluster on command,
 * keeping its listeners. What it needs from the daemon's main: prepare builds the modules of the new
 * upstream (state store, mirror module) from cfg (a copy the proxy keeps until its answer; the
 * modules must copy what they keep) and returns a handle, then reports once with
 * km_proxy_swap_ready (not from inside prepare); release frees a handle's modules, once no session
 * uses them (the previous upstream's after its drain, or a swap that failed).
 */
typedef struct km_proxy_swap_ops {
	void *(*prepare)(void *arg, const km_config *cfg);
	void (*release)(void *arg, void *handle);
	void *arg;
} km_proxy_swap_ops;
/* The ops and the handle of the modules given with km_proxy_set_state and km_proxy_set_mirror. */
void km_proxy_set_swap_ops(km_proxy *px, const km_proxy_swap_ops *ops, void *current);
/*
 * prepare's answer: err KM_OK with the handle's store (read back) and mirror module, or why not in
 * msg. True when the handle's modules now serve (the swap took effect); false when they were
 * released (the swap failed, or it had timed out).
 */
bool km_proxy_swap_ready(km_proxy *px, void *handle, km_state *st, km_mirror *mi, km_err err, const char *msg);
/*
 * Start a swap to upstream ("HOST:PORT,..."): KM_OK when started (done is called once, when the
 * proxy fronts the new cluster or the swap failed, with a message for the operator), or the reason
 * it cannot start in err. The new upstream is written to upstream_file before any client sees it.
 */
typedef void (*km_proxy_swap_done)(void *arg, km_err err, const char *msg);
km_err km_proxy_swap(km_proxy *px, const char *upstream, km_proxy_swap_done done, void *arg, char *err,
		     size_t errlen) __attribute__((warn_unused_result));
/* The swap's state as one JSON object: the upstream, a swap in progress, previous upstreams draining, the last outcome. */
void km_proxy_swap_status(km_proxy *px, struct evbuffer *out);
km_proxy_counters *km_proxy_metrics(km_proxy *px);
size_t km_proxy_session_count(const km_proxy *px);

#endif
