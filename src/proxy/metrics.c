/* Proxy metrics: cheap counters on the hot path, Prometheus text rendering for the HTTP endpoint. */
#include <stdio.h>

#include "kmirror/metrics.h"

const double km_metrics_bucket_bounds[KM_METRICS_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
							     0.05,   0.1,   0.25,   0.5,   1.0,  5.0};

void km_metrics_request(km_metrics *m, int16_t api_key)
{
	if (api_key >= 0 && api_key < KM_METRICS_MAX_API)
		m->requests[api_key]++;
	else
		m->requests_unknown++;
}

void km_metrics_latency(km_metrics *m, int16_t api_key, double seconds)
{
	int b;
	if (api_key < 0 || api_key >= KM_METRICS_MAX_API)
		return;
	for (b = 0; b < KM_METRICS_BUCKETS; b++)
		if (seconds <= km_metrics_bucket_bounds[b])
			break;
	if (b < KM_METRICS_BUCKETS)
		m->latency_bucket[api_key][b]++;
	m->latency_count[api_key]++;
	m->latency_sum[api_key] += seconds;
}

const char *km_reject_reason_name(km_reject_reason r)
{
	static const char *const names[KM_REJECT__COUNT] = {
		"frame_too_large", "bad_frame_size",  "tls_on_plaintext", "http_on_kafka_port",
		"bad_request_header", "frame_timeout", "idle_timeout",     "request_timeout",
	};
	return (unsigned)r < KM_REJECT__COUNT ? names[r] : "unknown";
}

static void counter(struct evbuffer *out, const char *name, const char *help, const char *type, uint64_t v)
{
	evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
			    (unsigned long long)v);
}

void km_metrics_render(const km_metrics *m, struct evbuffer *out)
{
	counter(out, "kmirror_client_connections", "Client connections open now.", "gauge", m->client_connections);
	counter(out, "kmirror_client_connections_total", "Client connections accepted.", "counter",
		m->client_connections_total);
	counter(out, "kmirror_upstream_connections", "Upstream broker connections open now.", "gauge",
		m->upstream_connections);
	counter(out, "kmirror_upstream_connects_total", "Upstream broker connections attempted.", "counter",
		m->upstream_connects_total);
	counter(out, "kmirror_upstream_errors_total",
		"Upstream failures: failed connects, resets, timeouts, malformed frames.", "counter",
		m->upstream_errors_total);
	counter(out, "kmirror_client_bytes_in_total", "Bytes received from clients.", "counter", m->client_bytes_in);
	counter(out, "kmirror_client_bytes_out_total", "Bytes sent to clients.", "counter", m->client_bytes_out);
	counter(out, "kmirror_upstream_bytes_in_total", "Bytes received from upstream brokers.", "counter",
		m->upstream_bytes_in);
	counter(out, "kmirror_upstream_bytes_out_total", "Bytes sent to upstream brokers.", "counter",
		m->upstream_bytes_out);
	counter(out, "kmirror_responses_rewritten_total", "Responses whose broker endpoints were rewritten.",
		"counter", m->responses_rewritten_total);
	counter(out, "kmirror_upstream_brokers", "Upstream brokers known from metadata.", "gauge", m->brokers_known);
	counter(out, "kmirror_draining", "1 while client connections are being drained for shutdown.", "gauge",
		(uint64_t)m->draining);

	evbuffer_add_printf(out, "# HELP kmirror_connections_rejected_total Client connections closed by a protocol "
				 "check or a timeout.\n# TYPE kmirror_connections_rejected_total counter\n");
	for (int r = 0; r < KM_REJECT__COUNT; r++)
		evbuffer_add_printf(out, "kmirror_connections_rejected_total{reason=\"%s\"} %llu\n",
				    km_reject_reason_name((km_reject_reason)r), (unsigned long long)m->rejected[r]);

	evbuffer_add_printf(out, "# HELP kmirror_config_reloads_total SIGHUP reloads.\n"
				 "# TYPE kmirror_config_reloads_total counter\n"
				 "kmirror_config_reloads_total{result=\"ok\"} %llu\n"
				 "kmirror_config_reloads_total{result=\"failed\"} %llu\n",
			    (unsigned long long)m->reloads_ok, (unsigned long long)m->reloads_failed);

	evbuffer_add_printf(out, "# HELP kmirror_requests_total Client requests by API key.\n"
				 "# TYPE kmirror_requests_total counter\n");
	for (int k = 0; k < KM_METRICS_MAX_API; k++)
		if (m->requests[k])
			evbuffer_add_printf(out, "kmirror_requests_total{api_key=\"%d\"} %llu\n", k,
					    (unsigned long long)m->requests[k]);
	evbuffer_add_printf(out, "kmirror_requests_total{api_key=\"other\"} %llu\n",
			    (unsigned long long)m->requests_unknown);

	evbuffer_add_printf(out, "# HELP kmirror_request_latency_seconds Time from a request's arrival to the "
				 "start of its response, by API key.\n"
				 "# TYPE kmirror_request_latency_seconds histogram\n");
	for (int k = 0; k < KM_METRICS_MAX_API; k++) {
		uint64_t cum = 0;
		if (!m->latency_count[k])
			continue;
		for (int b = 0; b < KM_METRICS_BUCKETS; b++) {
			cum += m->latency_bucket[k][b];
			evbuffer_add_printf(out, "kmirror_request_latency_seconds_bucket{api_key=\"%d\",le=\"%g\"} %llu\n", k,
					    km_metrics_bucket_bounds[b], (unsigned long long)cum);
		}
		evbuffer_add_printf(out, "kmirror_request_latency_seconds_bucket{api_key=\"%d\",le=\"+Inf\"} %llu\n", k,
				    (unsigned long long)m->latency_count[k]);
		evbuffer_add_printf(out, "kmirror_request_latency_seconds_sum{api_key=\"%d\"} %.6f\n", k,
				    m->latency_sum[k]);
		evbuffer_add_printf(out, "kmirror_request_latency_seconds_count{api_key=\"%d\"} %llu\n", k,
				    (unsigned long long)m->latency_count[k]);
	}
}
