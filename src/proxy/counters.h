/* Proxy-internal: the hot path's counters by API key (counters.c), and the registry families they are read through. */
#ifndef KMIRROR_PROXY_COUNTERS_H
#define KMIRROR_PROXY_COUNTERS_H

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

#endif
