/* Proxy-internal: what the features read per session host; sessions carry it without looking inside. */
#ifndef KMIRROR_PROXY_FEATURES_H
#define KMIRROR_PROXY_FEATURES_H

#include <stdint.h>

#include "proxy/offsets.h"
#include "proxy/readonly.h"
#include "proxy/session.h"

/* One per session host: the proxy's own, and one per previous upstream after a swap. */
struct km_proxy_features {
	km_ro_lookup read_only; /* which topics are read-only (filled from the state store); active NULL: none */
	km_off_lookup offsets;  /* the offset maps of mirror topics (filled from the state store); active NULL: none */
	/*
	 * Until then (ms, the event base's clock): a Fetch partition answered OFFSET_OUT_OF_RANGE
	 * reaches the client as OFFSET_NOT_AVAILABLE, which every client retries at the same position.
	 * Set after an upstream swap (swap.c), where a position may be the previous cluster's.
	 */
	uint64_t fetch_oor_hold_until_ms;
};

/* The features' data of the session's host. */
static inline const km_proxy_features *km_proxy_features_of(const km_session *s)
{
	return km_session_host_of(s)->features;
}

#endif
