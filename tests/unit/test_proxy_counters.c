/* Unit tests for the proxy's counters as /metrics shows them: names, labels and values through the registry. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/version.h"
#include "proxy/proxy_int.h"

static void test_rendered_names(void **state)
{
	km_proxy_counters c;
	km_metrics *m = km_metrics_new();
	char *text = NULL;
	size_t len;
	FILE *f;

	memset(&c, 0, sizeof(c));
	assert_int_equal(km_proxy_counters_register(&c, m), KM_OK);
	/* the same names twice in one registry are refused */
	assert_int_not_equal(km_proxy_counters_register(&c, m), KM_OK);
	c.client_connections = 3;
	c.client_bytes_out = 1234;
	c.rejected[KM_REJECT_TLS_HELLO] = 2;
	c.rejected[KM_REJECT_MAX_CONNECTIONS_PER_IP] = 4;
	c.http_rejected[KM_HTTP_REJECT_UNAUTHORIZED] = 5;
	c.http_connections = 2;
	c.brokers_known = 3;
	c.draining = 1;
	km_metrics_request(&c, 3);
	km_metrics_request(&c, 3);
	km_metrics_request(&c, 200);
	km_metrics_request(&c, -1);
	km_metrics_latency(&c, 3, 0.0007);
	km_metrics_latency(&c, 3, 0.2);
	km_metrics_latency(&c, 3, 9.0);
	km_metrics_latency(&c, 500, 1.0); /* outside the table: not recorded */

	f = open_memstream(&text, &len);
	assert_int_equal(km_metrics_render(m, f), KM_OK);
	fclose(f);
	assert_non_null(strstr(text, "# TYPE kmirror_client_connections gauge\nkmirror_client_connections 3\n"));
	assert_non_null(strstr(text, "kmirror_client_bytes_out_total 1234\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_upstream_brokers gauge\nkmirror_upstream_brokers 3\n"));
	assert_non_null(strstr(text, "kmirror_draining 1\n"));
	assert_non_null(strstr(text, "kmirror_connections_rejected_total{reason=\"tls_on_plaintext\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_connections_rejected_total{reason=\"request_timeout\"} 0\n"));
	assert_non_null(strstr(text, "kmirror_connections_rejected_total{reason=\"max_connections_per_ip\"} 4\n"));
	assert_non_null(strstr(text, "kmirror_http_rejected_total{reason=\"too_many_headers\"} 0\n"));
	assert_non_null(strstr(text, "kmirror_http_rejected_total{reason=\"unauthorized\"} 5\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_http_connections gauge\nkmirror_http_connections 2\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_requests_total counter\nkmirror_requests_total{api=\"Metadata\"} 2\n"
				     "kmirror_requests_total{api=\"other\"} 2\n"));
	assert_null(strstr(text, "kmirror_requests_total{api=\"Produce\"}"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api=\"Metadata\",le=\"0.0005\"} 0\n"
				     "kmirror_request_latency_seconds_bucket{api=\"Metadata\",le=\"0.001\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api=\"Metadata\",le=\"0.25\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api=\"Metadata\",le=\"5\"} 2\n"
				     "kmirror_request_latency_seconds_bucket{api=\"Metadata\",le=\"+Inf\"} 3\n"
				     "kmirror_request_latency_seconds_sum{api=\"Metadata\"} 9.200700\n"
				     "kmirror_request_latency_seconds_count{api=\"Metadata\"} 3\n"));
	assert_null(strstr(text, "api=\"500\""));
	assert_null(strstr(text, "api_key="));
	assert_non_null(strstr(text, "# TYPE kmirror_build_info gauge\nkmirror_build_info{version=\"" KM_VERSION "\",openssl=\"OpenSSL "));
	assert_non_null(strstr(text, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total "));
	assert_non_null(strstr(text, "\nprocess_open_fds "));
	free(text);
	km_metrics_free(m);
}

/* Kafka's keys keep their own slots; the ten mirror RPCs get the ten after them; nothing else has one. */
static void test_api_slots(void **state)
{
	bool used[KM_PROXY_API_SLOTS] = {false};
	(void)state;
	assert_int_equal(km_proxy_api_slot(0), 0);
	assert_int_equal(km_proxy_api_slot(KM_PROXY_MAX_API - 1), KM_PROXY_MAX_API - 1);
	assert_int_equal(km_proxy_api_slot(KM_PROXY_MAX_API), -1);
	assert_int_equal(km_proxy_api_slot(-1), -1);
	assert_int_equal(km_proxy_api_slot(31999), -1);
	assert_int_equal(km_proxy_api_slot(32000), KM_PROXY_MAX_API);
	assert_int_equal(km_proxy_api_slot(32009), KM_PROXY_API_SLOTS - 1);
	assert_int_equal(km_proxy_api_slot(32010), -1);
	assert_int_equal(km_proxy_api_slot(INT16_MAX), -1);
	assert_int_equal(km_proxy_api_slot(INT16_MIN), -1);
	for (int k = INT16_MIN; k <= INT16_MAX; k++) {
		int slot = km_proxy_api_slot((int16_t)k);
		if (slot < 0)
			continue;
		assert_true(slot < KM_PROXY_API_SLOTS);
		assert_false(used[slot]); /* one key per slot */
		used[slot] = true;
		assert_int_equal(km_proxy_slot_api(slot), k);
	}
	for (int i = 0; i < KM_PROXY_API_SLOTS; i++)
		assert_true(used[i]);
	assert_int_equal(km_proxy_slot_api(-1), -1);
	assert_int_equal(km_proxy_slot_api(KM_PROXY_API_SLOTS), -1);
}

/* The mirror RPCs show under their own api name, and their errors under kmirror_mirror_rpc_errors_total. */
static void test_mirror_rpc_series(void **state)
{
	km_proxy_counters c;
	km_metrics *m = km_metrics_new();
	char *text = NULL;
	size_t len;
	FILE *f;
	(void)state;

	memset(&c, 0, sizeof(c));
	km_metrics_mirror_rpc_error(&c, 32005, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR); /* before registering: ignored */
	assert_int_equal(km_proxy_counters_register(&c, m), KM_OK);
	km_metrics_request(&c, 32000);
	km_metrics_request(&c, 32005);
	km_metrics_request(&c, 32005);
	km_metrics_request(&c, 32009);
	km_metrics_request(&c, 32010);
	km_metrics_latency(&c, 32005, 0.003);
	km_metrics_latency(&c, 32010, 0.003); /* no slot: not recorded */
	km_metrics_mirror_rpc_error(&c, 32005, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR);
	km_metrics_mirror_rpc_error(&c, 32005, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR);
	km_metrics_mirror_rpc_error(&c, 32000, KM_KAFKA_CLUSTER_AUTHORIZATION_FAILED);
	km_metrics_mirror_rpc_error(&c, 32000, 0); /* no error: nothing */

	f = open_memstream(&text, &len);
	assert_int_equal(km_metrics_render(m, f), KM_OK);
	fclose(f);
	assert_non_null(strstr(text, "kmirror_requests_total{api=\"CreateMirror\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_requests_total{api=\"StartMirrorTopics\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_requests_total{api=\"LastMirroredOffsets\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_requests_total{api=\"other\"} 1\n"));
	assert_null(strstr(text, "api=\"32010\""));
	assert_null(strstr(text, "kmirror_requests_total{api=\"DeleteMirror\"}"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api=\"StartMirrorTopics\",le=\"0.005\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_count{api=\"StartMirrorTopics\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_mirror_rpc_errors_total{api=\"StartMirrorTopics\","
				     "error=\"TOPIC_NOT_IN_CLUSTER_MIRROR\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_mirror_rpc_errors_total{api=\"CreateMirror\","
				     "error=\"CLUSTER_AUTHORIZATION_FAILED\"} 1\n"));
	free(text);
	km_metrics_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rendered_names),
		cmocka_unit_test(test_api_slots),
		cmocka_unit_test(test_mirror_rpc_series),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
