/* Proxy-internal: the hot path's counters by API key (counters.c), and the registry families they are read through. */
#ifndef KMIRROR_PROXY_COUNTERS_H
#define KMIRROR_PROXY_COUNTERS_H

#include <stdint.h>

#include "kmirror/error.h"
#include "kmirror/metrics.h"
#include "kmirror/proxy.h"

void km_metrics_request(km_proxy_counters *m, int16_t api_key);
void km_metrics_latency(km_proxy_counters *m, int16_t api_key, double seconds);
km_err km_proxy_counters_register(km_proxy_counters *c, km_metrics *reg) __attribute__((warn_unused_result));

#endif
