/* The proxy's counters: plain fields on the hot path, registered by pointer in the metrics registry. */
#include <stdio.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "kmirror/api.h"
#include "kmirror/version.h"
#include "kmirror/msg/api_keys.h"
#include "proxy/proxy_int.h"

_Static_assert(KM_API_LAST_MIRRORED_OFFSETS - KM_API_CREATE_MIRROR + 1 == KM_PROXY_MIRROR_APIS,
	       "one counter slot per mirror RPC");

const double km_proxy_latency_bounds[KM_PROXY_LATENCY_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
								  0.05,   0.1,   0.25,   0.5,   1.0,  5.0};

/* Kafka's keys are dense from 0; kmirror's own ten follow them, so the arrays stay small. */
int km_proxy_api_slot(int16_t api_key)
{
	if (api_key >= 0 && api_key < KM_PROXY_MAX_API)
		return api_key;
	if (api_key >= KM_API_CREATE_MIRROR && api_key <= KM_API_LAST_MIRRORED_OFFSETS)
		return KM_PROXY_MAX_API + (api_key - KM_API_CREATE_MIRROR);
	return -1;
}

int16_t km_proxy_slot_api(int slot)
{
	if (slot >= 0 && slot < KM_PROXY_MAX_API)
		return (int16_t)slot;
	if (slot >= KM_PROXY_MAX_API && slot < KM_PROXY_API_SLOTS)
		return (int16_t)(KM_API_CREATE_MIRROR + (slot - KM_PROXY_MAX_API));
	return -1;
}

void km_metrics_request(km_proxy_counters *m, int16_t api_key)
{
	int k = km_proxy_api_slot(api_key);
	if (k >= 0)
		m->requests[k]++;
	else
		m->requests_unknown++;
}

void km_metrics_latency(km_proxy_counters *m, int16_t api_key, double seconds)
{
	int k = km_proxy_api_slot(api_key);
	size_t b;
	if (k < 0)
		return;
	b = km_metrics_bucket(km_proxy_latency_bounds, KM_PROXY_LATENCY_BUCKETS, seconds);
	if (b < KM_PROXY_LATENCY_BUCKETS)
		m->latency_bucket[k][b]++;
	m->latency_count[k]++;
	m->latency_sum[k] += seconds;
}

void km_metrics_mirror_rpc_error(km_proxy_counters *m, int16_t api_key, int code)
{
	const km_api_info *api = km_api_lookup(api_key);
	const char *v[2];
	km_metric_series *s;
	if (!m->mirror_rpc_errors || !code || !api)
		return;
	v[0] = api->name;
	v[1] = km_err_name((km_err)code);
	/* A scan of a few series, on the error path only. */
	if ((s = km_metric_series_get(m->mirror_rpc_errors, v)))
		km_metric_inc(s, 1);
}

const char *km_reject_reason_name(km_reject_reason r)
{
	static const char *const names[KM_REJECT__COUNT] = {
		"frame_too_large", "bad_frame_size",  "tls_on_plaintext", "http_on_kafka_port",
		"bad_request_header", "frame_timeout", "idle_timeout",     "request_timeout",
		"state_timeout",   "max_connections", "max_connections_per_ip",
	};
	return (unsigned)r < KM_REJECT__COUNT ? names[r] : "unknown";
}

const char *km_http_reject_reason_name(km_http_reject_reason r)
{
	static const char *const names[KM_HTTP_REJECT__COUNT] = {
		"max_connections", "request_timeout", "too_many_headers", "unauthorized",
	};
	return (unsigned)r < KM_HTTP_REJECT__COUNT ? names[r] : "unknown";
}

/* The unlabelled families: one field each. */
static const struct {
	const char *name, *help;
	km_metric_type type;
	size_t offset;
} plain[] = {
#define C(f) offsetof(km_proxy_counters, f)
	{"kmirror_client_connections", "Client connections open now.", KM_METRIC_GAUGE, C(client_connections)},
	{"kmirror_client_connections_total", "Client connections accepted.", KM_METRIC_COUNTER,
	 C(client_connections_total)},
	{"kmirror_upstream_connections", "Upstream broker connections open now.", KM_METRIC_GAUGE,
	 C(upstream_connections)},
	{"kmirror_upstream_connects_total", "Upstream broker connections attempted.", KM_METRIC_COUNTER,
	 C(upstream_connects_total)},
	{"kmirror_upstream_errors_total", "Upstream failures: failed connects, resets, timeouts, malformed frames.",
	 KM_METRIC_COUNTER, C(upstream_errors_total)},
	{"kmirror_client_bytes_in_total", "Bytes received from clients.", KM_METRIC_COUNTER, C(client_bytes_in)},
	{"kmirror_client_bytes_out_total", "Bytes sent to clients.", KM_METRIC_COUNTER, C(client_bytes_out)},
	{"kmirror_upstream_bytes_in_total", "Bytes received from upstream brokers.", KM_METRIC_COUNTER,
	 C(upstream_bytes_in)},
	{"kmirror_upstream_bytes_out_total", "Bytes sent to upstream brokers.", KM_METRIC_COUNTER,
	 C(upstream_bytes_out)},
	{"kmirror_responses_rewritten_total", "Responses whose broker endpoints were rewritten.", KM_METRIC_COUNTER,
	 C(responses_rewritten_total)},
	{"kmirror_spliced_bytes_total",
	 "Response bytes moved from a broker's socket to a client's with splice(2), never read into kmirrord "
	 "(counted in kmirror_client_bytes_out_total too).",
	 KM_METRIC_COUNTER, C(spliced_bytes_total)},
	{"kmirror_splices_total", "Spliced ranges those bytes moved in (a record set, or the rest of a response).",
	 KM_METRIC_COUNTER, C(splices_total)},
	{"kmirror_fetch_out_of_range_held_total",
	 "Fetch partitions the upstream answered OFFSET_OUT_OF_RANGE, passed on as OFFSET_NOT_AVAILABLE after an "
	 "upstream swap (swap_fetch_hold_ms).",
	 KM_METRIC_COUNTER, C(fetch_oor_held_total)},
	{"kmirror_fetch_tail_waits_total",
	 "Fetch requests held (50 ms at most) before they went upstream: the previous answer showed nothing, only "
	 "records past a mirror partition's tail, and the request asks for nothing before the tails.",
	 KM_METRIC_COUNTER, C(fetch_tail_waits_total)},
	{"kmirror_fetch_tail_waits_woken_total",
	 "Of those, the ones that went before the 50 ms because this kmirrord's pipeline moved the tail of a "
	 "partition they ask.",
	 KM_METRIC_COUNTER, C(fetch_tail_waits_woken_total)},
	{"kmirror_upstream_brokers", "Upstream brokers known from metadata.", KM_METRIC_GAUGE, C(brokers_known)},
	{"kmirror_draining", "1 while client connections are being drained for shutdown.", KM_METRIC_GAUGE,
	 C(draining)},
	{"kmirror_http_connections", "HTTP connections open now, every HTTP listener.", KM_METRIC_GAUGE,
	 C(http_connections)},
#undef C
};

km_err km_proxy_counters_register(km_proxy_counters *c, km_metrics *reg)
{
	static const km_metric_desc rejected = {
		.name = "kmirror_connections_rejected_total",
		.help = "Client connections closed by a protocol check, a timeout or a connection cap.",
		.type = KM_METRIC_COUNTER,
		.labels = {"reason"},
		.max_series = KM_REJECT__COUNT,
	};
	static const km_metric_desc http_rejected = {
		.name = "kmirror_http_rejected_total",
		.help = "HTTP connections or requests refused by a limit, a timeout or the admin token check.",
		.type = KM_METRIC_COUNTER,
		.labels = {"reason"},
		.max_series = KM_HTTP_REJECT__COUNT,
	};
	static const km_metric_desc requests = {
		.name = "kmirror_requests_total",
		.help = "Client requests by API (\"other\": keys kmirrord does not know).",
		.type = KM_METRIC_COUNTER,
		.labels = {"api"},
		.max_series = KM_PROXY_API_SLOTS + 1,
		.hide_empty = true,
	};
	static const km_metric_desc latency = {
		.name = "kmirror_request_latency_seconds",
		.help = "Time from a request's arrival to the start of its response, by API.",
		.type = KM_METRIC_HISTOGRAM,
		.labels = {"api"},
		.max_series = KM_PROXY_API_SLOTS,
		.bounds = km_proxy_latency_bounds,
		.nbounds = KM_PROXY_LATENCY_BUCKETS,
		.hide_empty = true,
	};
	static const km_metric_desc rpc_errors = {
		.name = "kmirror_mirror_rpc_errors_total",
		.help = "Mirror RPC answers carrying an error, by RPC and error (each refused topic counts).",
		.type = KM_METRIC_COUNTER,
		.labels = {"api", "error"},
		.max_series = 200,
	};
	static const km_metric_desc build = {
		.name = "kmirror_build_info",
		.help = "Always 1: the kmirrord version and the OpenSSL and libevent it runs with, as labels.",
		.type = KM_METRIC_GAUGE,
		.labels = {"version", "openssl", "libevent"},
	};
	const char *build_v[] = {KM_VERSION, OpenSSL_version(OPENSSL_VERSION), event_get_version()};
	km_metric_family *f, *lat;
	km_metric_series *s;

	if (!(f = km_metrics_family(reg, &build)) || !(s = km_metric_series_get(f, build_v)) ||
	    km_metrics_add_process(reg) != KM_OK)
		return KM_ERR_NOMEM;
	km_metric_set(s, 1);
	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		km_metric_desc d = {.name = plain[i].name, .help = plain[i].help, .type = plain[i].type};
		f = km_metrics_family(reg, &d);
		if (!f || !km_metric_series_ptr(f, NULL, (const uint64_t *)((const char *)c + plain[i].offset)))
			return KM_ERR_NOMEM;
	}
	if (!(f = km_metrics_family(reg, &rejected)))
		return KM_ERR_NOMEM;
	for (int r = 0; r < KM_REJECT__COUNT; r++) {
		const char *v[] = {km_reject_reason_name((km_reject_reason)r)};
		if (!km_metric_series_ptr(f, v, &c->rejected[r]))
			return KM_ERR_NOMEM;
	}
	if (!(f = km_metrics_family(reg, &http_rejected)))
		return KM_ERR_NOMEM;
	for (int r = 0; r < KM_HTTP_REJECT__COUNT; r++) {
		const char *v[] = {km_http_reject_reason_name((km_http_reject_reason)r)};
		if (!km_metric_series_ptr(f, v, &c->http_rejected[r]))
			return KM_ERR_NOMEM;
	}
	if (!(f = km_metrics_family(reg, &requests)) || !(lat = km_metrics_family(reg, &latency)))
		return KM_ERR_NOMEM;
	for (int k = 0; k < KM_PROXY_API_SLOTS; k++) {
		const km_api_info *api = km_api_lookup(km_proxy_slot_api(k));
		char key[16];
		const char *v[] = {api ? api->name : key}; /* a key with no name here: its number */
		snprintf(key, sizeof(key), "%d", km_proxy_slot_api(k));
		if (!km_metric_series_ptr(f, v, &c->requests[k]) ||
		    !km_metric_histogram_ptr(lat, v, c->latency_bucket[k], &c->latency_count[k], &c->latency_sum[k]))
			return KM_ERR_NOMEM;
	}
	{
		const char *v[] = {"other"}; /* keys with no slot */
		if (!km_metric_series_ptr(f, v, &c->requests_unknown))
			return KM_ERR_NOMEM;
	}
	if (!(c->mirror_rpc_errors = km_metrics_family(reg, &rpc_errors)))
		return KM_ERR_NOMEM;
	return KM_OK;
}
