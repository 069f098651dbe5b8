/* A Kafka cluster as a client sees it: bootstrap addresses, the brokers the metadata names, a client per broker. */
#ifndef KMIRROR_CLUSTER_H
#define KMIRROR_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/msg/metadata_response.h"
#include "kmirror/net.h"
#include "kmirror/options.h"

typedef struct km_cluster km_cluster;

/*
 * side names the cluster in logs ("source", "destination"). tmpl: the client options every
 * connection gets (its strings are copied; on_state/arg are replaced: on_change(arg) runs on a
 * later loop iteration whenever a client becomes ready or fails, or a dropped one was freed).
 * on_change may be NULL.
 */
km_cluster *km_cluster_new(struct event_base *base, const char *side, const km_net_client_opts *tmpl,
			   const km_hostport *boot, size_t nboot, void (*on_change)(void *arg), void *arg);
void km_cluster_free(km_cluster *cl);
/*
 * A client to any broker: a connected, healthy broker the metadata named, else the bootstrap
 * client (connecting to the next bootstrap address in turn after a failure). NULL: cannot connect,
 * or the reconnect backoff runs (on_change is called when it ends: docs/net.md, "Reconnects").
 */
km_net_client *km_cluster_any(km_cluster *cl);
/* The client of broker id (connecting on first use); NULL when no metadata names it, or while its reconnect backoff runs. */
km_net_client *km_cluster_node(km_cluster *cl, int32_t id);
/*
 * Connections a cluster keeps to one broker at most: lanes, each a client of its own, so that a
 * slow request on one does not hold the requests of another (a broker answers each connection's
 * requests one at a time, in order: docs/net.md, "Lanes").
 */
#define KM_CLUSTER_LANES 16
/* km_cluster_node of one lane (0 .. KM_CLUSTER_LANES - 1; lane 0 is km_cluster_node's client). */
km_net_client *km_cluster_lane(km_cluster *cl, int32_t id, unsigned lane);
/* Whether c failed (the next km_cluster_any / _node gives a fresh client); true for a client not ours. */
bool km_cluster_failed(km_cluster *cl, const km_net_client *c);
/* Whether c is connected and negotiated; a failed one is dropped (the next use reconnects). NULL: false. */
bool km_cluster_usable(km_cluster *cl, km_net_client *c);
/* Forget c after an error on it: the next use reconnects. Safe from inside c's callbacks. */
void km_cluster_drop(km_cluster *cl, km_net_client *c);
/* Take the brokers of a Metadata response (clients of unchanged addresses are kept; none: no news). */
km_err km_cluster_brokers(km_cluster *cl, const km_metadata_response *r) __attribute__((warn_unused_result));
/*
 * Learn one broker from any answer that names it (the proxy's rewriting sees them all). KM_OK and
 * *moved when it was known at another address (its client is dropped), KM_ERR_INVAL for an address
 * that cannot be one.
 */
km_err km_cluster_learn(km_cluster *cl, int32_t id, const char *host, size_t hostlen, int32_t port, bool *moved)
	__attribute__((warn_unused_result));
/* Where broker id lives; false when no answer named it. */
bool km_cluster_addr(const km_cluster *cl, int32_t id, const char **host, uint16_t *port);
/* The broker ids known: up to cap of them in out; returns how many there are. */
size_t km_cluster_node_ids(const km_cluster *cl, int32_t *out, size_t cap);
const char *km_cluster_side(const km_cluster *cl);
/* No connection to any of its brokers is up, and the last attempt failed (refused, DNS, timeout, TLS, SASL). */
bool km_cluster_unreachable(const km_cluster *cl);
/* Why the cluster's last connection failed (km_net_client_reason of it); "" when none has. */
const char *km_cluster_last_error(const km_cluster *cl);
/* Connections the cluster has opened (each reconnect is one; a down broker is retried with backoff). */
uint64_t km_cluster_attempts(const km_cluster *cl);

#endif
