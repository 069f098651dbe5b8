/* kmirror metrics: counters, gauges and per-API latency histograms, rendered in Prometheus text format. */
#ifndef KMIRROR_METRICS_H
#define KMIRROR_METRICS_H

#include <stdint.h>

#include <event2/buffer.h>

#define KM_METRICS_MAX_API 128
#define KM_METRICS_BUCKETS 12

typedef enum {
	KM_REJECT_TOO_LARGE = 0,
	KM_REJECT_BAD_SIZE,
	KM_REJECT_TLS_HELLO,
	KM_REJECT_HTTP,
	KM_REJECT_BAD_HEADER,
	KM_REJECT_FRAME_TIMEOUT,
	KM_REJECT_IDLE_TIMEOUT,
	KM_REJECT_REQUEST_TIMEOUT,
	KM_REJECT__COUNT,
} km_reject_reason;

typedef struct km_metrics {
	uint64_t client_connections;          /* gauge */
	uint64_t client_connections_total;
	uint64_t upstream_connections;        /* gauge */
	uint64_t upstream_connects_total;
	uint64_t upstream_errors_total;       /* failed connects, resets, bad frames from upstream */
	uint64_t client_bytes_in, client_bytes_out;
	uint64_t upstream_bytes_in, upstream_bytes_out;
	uint64_t rejected[KM_REJECT__COUNT];
	uint64_t responses_rewritten_total;
	uint64_t reloads_ok, reloads_failed;
	uint64_t brokers_known;               /* gauge */
	uint64_t requests[KM_METRICS_MAX_API];
	uint64_t requests_unknown;            /* api key outside the table */
	uint64_t latency_bucket[KM_METRICS_MAX_API][KM_METRICS_BUCKETS]; /* non-cumulative */
	uint64_t latency_count[KM_METRICS_MAX_API];
	double latency_sum[KM_METRICS_MAX_API];
	int draining;                         /* gauge: 1 while draining on SIGTERM */
} km_metrics;

/* Upper bounds of the latency buckets, seconds (+Inf is implicit). */
extern const double km_metrics_bucket_bounds[KM_METRICS_BUCKETS];

void km_metrics_request(km_metrics *m, int16_t api_key);
void km_metrics_latency(km_metrics *m, int16_t api_key, double seconds);
const char *km_reject_reason_name(km_reject_reason r);
/* Append the Prometheus text exposition of m to out. */
void km_metrics_render(const km_metrics *m, struct evbuffer *out);

#endif
