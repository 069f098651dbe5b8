/* kmirror proxy: listeners, client sessions with their upstream connections, endpoint rewriting, drain and reload. */
#ifndef KMIRROR_PROXY_H
#define KMIRROR_PROXY_H

#include <stddef.h>

#include <event2/event.h>

#include "kmirror/daemon_config.h"
#include "kmirror/error.h"
#include "kmirror/metrics.h"

typedef struct km_proxy km_proxy;

/*
 * Start serving: the bootstrap listener, the HTTP endpoint, and the metadata refresh that opens one
 * listener per upstream broker. cfg is copied (and must have passed km_config_validate).
 */
km_proxy *km_proxy_new(struct event_base *base, const km_config *cfg, char *err, size_t errlen);
/* Swap in a new configuration (already checked with km_config_check_reload). */
km_err km_proxy_reload(km_proxy *px, const km_config *next, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/*
 * Stop accepting, then close client connections gradually over drain_timeout_ms (in rounds every
 * drain_interval_ms, each connection between two requests); done is called when none is left.
 */
void km_proxy_drain(km_proxy *px, void (*done)(void *arg), void *arg);
void km_proxy_free(km_proxy *px);

km_metrics *km_proxy_metrics(km_proxy *px);
size_t km_proxy_session_count(const km_proxy *px);

#endif
