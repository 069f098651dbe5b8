/* Proxy-internal: the hot path's counters by API key (counters.c), and the registry families they are read through. */
#ifndef KMIRROR_PROXY_COUNTERS_H
#define KMIRROR_PROXY_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>

#include "kmirror/error.h"
#include "kmirror/metrics.h"
#include "kmirror/proxy.h"

/* The counters' slot of an API key (0..KM_PROXY_API_SLOTS-1), or -1 when it has none; and back. */
int km_proxy_api_slot(int16_t api_key);
int16_t km_proxy_slot_api(int slot);
void km_metrics_request(km_proxy_counters *m, int16_t api_key);
void km_metrics_latency(km_proxy_counters *m, int16_t api_key, double seconds);
/* One mirror RPC answered with error code (nonzero) for the api key: kmirror_mirror_rpc_errors_total. */
void km_metrics_mirror_rpc_error(km_proxy_counters *m, int16_t api_key, int code);
km_err km_proxy_counters_register(km_proxy_counters *c, km_metrics *reg) __attribute__((warn_unused_result));

/*
 * A log line that a flood would repeat (a refused connection): written at most once per
 * KM_LOG_GATE_MS. km_log_gate_pass says whether to write one at now_ms, and in *held how many
 * were held back since the last.
 */
#define KM_LOG_GATE_MS 10000
typedef struct km_log_gate {
	uint64_t last_ms;
	uint64_t held;
} km_log_gate;

static inline bool km_log_gate_pass(km_log_gate *g, uint64_t now_ms, uint64_t *held)
{
	if (g->last_ms && now_ms - g->last_ms < KM_LOG_GATE_MS) {
		g->held++;
		return false;
	}
	*held = g->held;
	g->held = 0;
	g->last_ms = now_ms ? now_ms : 1;
	return true;
}

#endif
