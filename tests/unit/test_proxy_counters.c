/* Unit tests for the proxy's counters as /metrics shows them: names, labels and values through the registry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

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
	assert_non_null(strstr(text, "# TYPE kmirror_requests_total counter\nkmirror_requests_total{api_key=\"3\"} 2\n"
				     "kmirror_requests_total{api_key=\"other\"} 2\n"));
	assert_null(strstr(text, "kmirror_requests_total{api_key=\"0\"}"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api_key=\"3\",le=\"0.0005\"} 0\n"
				     "kmirror_request_latency_seconds_bucket{api_key=\"3\",le=\"0.001\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api_key=\"3\",le=\"0.25\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_request_latency_seconds_bucket{api_key=\"3\",le=\"5\"} 2\n"
				     "kmirror_request_latency_seconds_bucket{api_key=\"3\",le=\"+Inf\"} 3\n"
				     "kmirror_request_latency_seconds_sum{api_key=\"3\"} 9.200700\n"
				     "kmirror_request_latency_seconds_count{api_key=\"3\"} 3\n"));
	assert_null(strstr(text, "api_key=\"500\""));
	free(text);
	km_metrics_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rendered_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
