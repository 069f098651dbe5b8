/* Unit tests for the metrics registry: labels, escaping, the series cap, histograms, counters by pointer, many series. */
#define _GNU_SOURCE /* open_memstream */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/metrics.h"

static char *render(const km_metrics *m)
{
	char *text = NULL;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	assert_int_equal(km_metrics_render(m, f), KM_OK);
	fclose(f);
	return text;
}

static int count_of(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static void test_labels_and_types(void **state)
{
	static const km_metric_desc lag = {.name = "kmirror_mirror_lag",
					   .help = "Records behind.",
					   .type = KM_METRIC_GAUGE,
					   .labels = {"mirror", "topic", "partition"}};
	static const km_metric_desc copied = {.name = "kmirror_mirror_records_total",
					      .help = "Records copied.",
					      .type = KM_METRIC_COUNTER,
					      .labels = {"mirror"}};
	km_metrics *m = km_metrics_new();
	km_metric_family *g, *c;
	km_metric_series *s1, *s2, *again;
	char *text;

	assert_non_null(m);
	assert_non_null(g = km_metrics_family(m, &lag));
	assert_non_null(c = km_metrics_family(m, &copied));
	assert_null(km_metrics_family(m, &copied)); /* a name is registered once */
	s1 = km_metric_series_get(g, (const char *[]){"m1", "orders", "0"});
	s2 = km_metric_series_get(g, (const char *[]){"m1", "orders", "1"});
	again = km_metric_series_get(g, (const char *[]){"m1", "orders", "0"});
	assert_non_null(s1);
	assert_ptr_not_equal(s1, s2);
	assert_ptr_equal(s1, again);
	km_metric_set(s1, 42);
	km_metric_set(s2, -3);
	km_metric_inc(km_metric_series_get(c, (const char *[]){"m1"}), 5);
	km_metric_inc(km_metric_series_get(c, (const char *[]){"m1"}), 2);
	assert_int_equal(km_metric_value(km_metric_series_get(c, (const char *[]){"m1"})), 7);
	text = render(m);
	assert_int_equal(count_of(text, "# HELP kmirror_mirror_lag Records behind.\n"), 1);
	assert_int_equal(count_of(text, "# TYPE kmirror_mirror_lag gauge\n"), 1);
	assert_non_null(strstr(text, "kmirror_mirror_lag{mirror=\"m1\",topic=\"orders\",partition=\"0\"} 42\n"));
	assert_non_null(strstr(text, "kmirror_mirror_lag{mirror=\"m1\",topic=\"orders\",partition=\"1\"} -3\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_mirror_records_total counter\n"
				     "kmirror_mirror_records_total{mirror=\"m1\"} 7\n"));
	/* the registry's own counter is always there */
	assert_non_null(strstr(text, "# TYPE " KM_METRICS_DROPPED_NAME " counter\n" KM_METRICS_DROPPED_NAME " 0\n"));
	free(text);
	km_metrics_free(m);
}

static void test_bad_descriptions(void **state)
{
	static const double down[] = {1.0, 0.5};
	km_metrics *m = km_metrics_new();
	km_metric_desc d = {.name = "ok_name", .help = "h", .type = KM_METRIC_COUNTER};

	d.name = "9starts_with_digit";
	assert_null(km_metrics_family(m, &d));
	d.name = "has-dash";
	assert_null(km_metrics_family(m, &d));
	d.name = "ok_name";
	d.labels[0] = "__reserved";
	assert_null(km_metrics_family(m, &d));
	d.labels[0] = "a";
	d.labels[1] = "a";
	assert_null(km_metrics_family(m, &d));
	d.labels[1] = "bad:colon";
	assert_null(km_metrics_family(m, &d));
	d.labels[1] = NULL;
	d.type = KM_METRIC_HISTOGRAM;
	assert_null(km_metrics_family(m, &d)); /* no buckets */
	d.bounds = down;
	d.nbounds = 2;
	assert_null(km_metrics_family(m, &d)); /* not ascending */
	d.nbounds = 1;
	d.labels[0] = "le";
	assert_null(km_metrics_family(m, &d));
	d.labels[0] = "api";
	assert_non_null(km_metrics_family(m, &d));
	km_metrics_free(m);
}

static void test_escaping(void **state)
{
	static const km_metric_desc d = {.name = "kmirror_esc",
					 .help = "Back\\slash and\nnewline, \"quotes\" stay.",
					 .type = KM_METRIC_COUNTER,
					 .labels = {"topic"}};
	km_metrics *m = km_metrics_new();
	km_metric_family *f = km_metrics_family(m, &d);
	char *text;

	km_metric_inc(km_metric_series_get(f, (const char *[]){"a\"b\\c\nd"}), 1);
	text = render(m);
	assert_non_null(strstr(text, "# HELP kmirror_esc Back\\\\slash and\\nnewline, \"quotes\" stay.\n"));
	assert_non_null(strstr(text, "kmirror_esc{topic=\"a\\\"b\\\\c\\nd\"} 1\n"));
	free(text);
	km_metrics_free(m);
}

static void test_cardinality_cap(void **state)
{
	static const km_metric_desc d = {.name = "kmirror_part_bytes_total",
					 .help = "Bytes by partition.",
					 .type = KM_METRIC_COUNTER,
					 .labels = {"topic", "partition"},
					 .max_series = 3};
	km_metrics *m = km_metrics_new();
	km_metric_family *f = km_metrics_family(m, &d);
	km_metric_series *s[6], *first;
	uint64_t field = 9;
	char *text;

	for (int i = 0; i < 6; i++) {
		char p[8];
		snprintf(p, sizeof(p), "%d", i);
		s[i] = km_metric_series_get(f, (const char *[]){"t", p});
		assert_non_null(s[i]);
		km_metric_inc(s[i], 1);
	}
	/* the first three have their own series; the rest share the overflow series */
	assert_ptr_not_equal(s[2], s[3]);
	assert_ptr_equal(s[3], s[4]);
	assert_ptr_equal(s[4], s[5]);
	assert_int_equal(km_metric_value(s[3]), 3);
	/* a known label set still finds its own series at the cap */
	first = km_metric_series_get(f, (const char *[]){"t", "0"});
	assert_ptr_equal(first, s[0]);
	/* by pointer there is nothing to fold into: refused, and counted */
	assert_null(km_metric_series_ptr(f, (const char *[]){"t", "99"}, &field));
	text = render(m);
	assert_non_null(strstr(text, "kmirror_part_bytes_total{topic=\"t\",partition=\"2\"} 1\n"));
	assert_null(strstr(text, "partition=\"3\""));
	assert_non_null(strstr(text, "kmirror_part_bytes_total{topic=\"" KM_METRICS_OVERFLOW
				     "\",partition=\"" KM_METRICS_OVERFLOW "\"} 3\n"));
	assert_non_null(strstr(text, KM_METRICS_DROPPED_NAME " 4\n"));
	assert_int_equal(count_of(text, "# TYPE kmirror_part_bytes_total counter\n"), 1);
	free(text);
	km_metrics_free(m);
}

static void test_histogram(void **state)
{
	static const double bounds[] = {0.01, 0.1, 1};
	static const km_metric_desc d = {.name = "kmirror_fetch_seconds",
					 .help = "Fetch time.",
					 .type = KM_METRIC_HISTOGRAM,
					 .labels = {"mirror"},
					 .bounds = bounds,
					 .nbounds = 3};
	static const km_metric_desc plain = {
		.name = "kmirror_plain_seconds", .help = "No labels.", .type = KM_METRIC_HISTOGRAM,
		.bounds = bounds, .nbounds = 3};
	km_metrics *m = km_metrics_new();
	km_metric_family *f = km_metrics_family(m, &d), *p = km_metrics_family(m, &plain);
	km_metric_series *s = km_metric_series_get(f, (const char *[]){"m1"});
	char *text;

	assert_int_equal(km_metrics_bucket(bounds, 3, 0.01), 0); /* a bound is inclusive */
	assert_int_equal(km_metrics_bucket(bounds, 3, 0.0100001), 1);
	assert_int_equal(km_metrics_bucket(bounds, 3, 7), 3);
	km_metric_observe(s, 0.005);
	km_metric_observe(s, 0.05);
	km_metric_observe(s, 0.07);
	km_metric_observe(s, 2.0); /* above every bound: only +Inf */
	km_metric_observe(km_metric_series_get(p, NULL), 0.5);
	text = render(m);
	assert_non_null(strstr(text, "# TYPE kmirror_fetch_seconds histogram\n"
				     "kmirror_fetch_seconds_bucket{mirror=\"m1\",le=\"0.01\"} 1\n"
				     "kmirror_fetch_seconds_bucket{mirror=\"m1\",le=\"0.1\"} 3\n"
				     "kmirror_fetch_seconds_bucket{mirror=\"m1\",le=\"1\"} 3\n"
				     "kmirror_fetch_seconds_bucket{mirror=\"m1\",le=\"+Inf\"} 4\n"
				     "kmirror_fetch_seconds_sum{mirror=\"m1\"} 2.125000\n"
				     "kmirror_fetch_seconds_count{mirror=\"m1\"} 4\n"));
	assert_non_null(strstr(text, "kmirror_plain_seconds_bucket{le=\"0.1\"} 0\n"
				     "kmirror_plain_seconds_bucket{le=\"1\"} 1\n"
				     "kmirror_plain_seconds_bucket{le=\"+Inf\"} 1\n"
				     "kmirror_plain_seconds_sum 0.500000\n"
				     "kmirror_plain_seconds_count 1\n"));
	free(text);
	km_metrics_free(m);
}

/* The owner keeps plain fields; the registry reads them when it renders. */
static void test_by_pointer(void **state)
{
	static const double bounds[] = {1, 2};
	static const km_metric_desc req = {.name = "kmirror_req_total",
					   .help = "Requests.",
					   .type = KM_METRIC_COUNTER,
					   .labels = {"api_key"},
					   .hide_empty = true};
	static const km_metric_desc open = {.name = "kmirror_open", .help = "Open now.", .type = KM_METRIC_GAUGE};
	static const km_metric_desc lat = {.name = "kmirror_lat_seconds",
					   .help = "Latency.",
					   .type = KM_METRIC_HISTOGRAM,
					   .labels = {"api_key"},
					   .bounds = bounds,
					   .nbounds = 2,
					   .hide_empty = true};
	struct {
		uint64_t req[2], open;
		uint64_t buckets[2][2], count[2];
		double sum[2];
	} c = {{0}};
	km_metrics *m = km_metrics_new();
	km_metric_family *fr = km_metrics_family(m, &req), *fo = km_metrics_family(m, &open),
			 *fl = km_metrics_family(m, &lat);
	char *text;

	assert_non_null(km_metric_series_ptr(fr, (const char *[]){"0"}, &c.req[0]));
	assert_non_null(km_metric_series_ptr(fr, (const char *[]){"1"}, &c.req[1]));
	assert_non_null(km_metric_series_ptr(fo, NULL, &c.open));
	assert_non_null(km_metric_histogram_ptr(fl, (const char *[]){"0"}, c.buckets[0], &c.count[0], &c.sum[0]));
	assert_non_null(km_metric_histogram_ptr(fl, (const char *[]){"1"}, c.buckets[1], &c.count[1], &c.sum[1]));
	/* kinds must match */
	assert_null(km_metric_histogram_ptr(fr, (const char *[]){"2"}, c.buckets[0], &c.count[0], &c.sum[0]));
	assert_null(km_metric_series_ptr(fl, (const char *[]){"2"}, &c.open));
	text = render(m);
	/* empty series are left out, the families are still announced */
	assert_non_null(strstr(text, "# TYPE kmirror_req_total counter\n# HELP kmirror_open"));
	assert_non_null(strstr(text, "kmirror_open 0\n"));
	assert_null(strstr(text, "kmirror_lat_seconds_bucket"));
	free(text);
	c.req[1] += 3;
	c.open = 2;
	c.buckets[1][0] = 1; /* non-cumulative in the owner's fields */
	c.buckets[1][1] = 2;
	c.count[1] = 4;
	c.sum[1] = 7.5;
	text = render(m);
	assert_null(strstr(text, "kmirror_req_total{api_key=\"0\"}"));
	assert_non_null(strstr(text, "kmirror_req_total{api_key=\"1\"} 3\n"));
	assert_non_null(strstr(text, "kmirror_open 2\n"));
	assert_non_null(strstr(text, "kmirror_lat_seconds_bucket{api_key=\"1\",le=\"1\"} 1\n"
				     "kmirror_lat_seconds_bucket{api_key=\"1\",le=\"2\"} 3\n"
				     "kmirror_lat_seconds_bucket{api_key=\"1\",le=\"+Inf\"} 4\n"
				     "kmirror_lat_seconds_sum{api_key=\"1\"} 7.500000\n"
				     "kmirror_lat_seconds_count{api_key=\"1\"} 4\n"));
	assert_null(strstr(text, "api_key=\"0\",le="));
	free(text);
	km_metrics_free(m);
}

/*
 * Many series (one per mirrored partition: 10,000 partitions make 70,000): each label set finds
 * its own series again, label sets that concatenate alike stay apart, and registering them all
 * is not quadratic (200,000 here: a linear scan per registration would take minutes, not
 * milliseconds; the test's time shows it).
 */
static void test_many_series(void **state)
{
	static const km_metric_desc d = {.name = "kmirror_part_records_total",
					 .help = "Records by partition.",
					 .type = KM_METRIC_COUNTER,
					 .labels = {"mirror", "topic", "partition"},
					 .max_series = 300000};
	enum { N = 20000 }; /* the render of 200,000 took minutes under ASan */
	km_metrics *m = km_metrics_new();
	km_metric_family *f = km_metrics_family(m, &d);
	static uint64_t fields[N];
	static km_metric_series *s[N];
	km_metric_series *ab, *a_b;
	char *text;

	for (int i = 0; i < N; i++) {
		char t[32], p[16];
		snprintf(t, sizeof(t), "topic-%04d", i / 10);
		snprintf(p, sizeof(p), "%d", i % 10);
		fields[i] = (uint64_t)i;
		s[i] = km_metric_series_ptr(f, (const char *[]){"m", t, p}, &fields[i]);
		assert_non_null(s[i]);
	}
	for (int i = 0; i < N; i += 997) {
		char t[32], p[16];
		snprintf(t, sizeof(t), "topic-%04d", i / 10);
		snprintf(p, sizeof(p), "%d", i % 10);
		assert_ptr_equal(km_metric_series_get(f, (const char *[]){"m", t, p}), s[i]);
		assert_int_equal(km_metric_value(s[i]), i);
	}
	ab = km_metric_series_get(f, (const char *[]){"m", "ab", "c"});
	a_b = km_metric_series_get(f, (const char *[]){"m", "a", "bc"});
	assert_non_null(ab);
	assert_non_null(a_b);
	assert_ptr_not_equal(ab, a_b);
	text = render(m);
	assert_non_null(strstr(text, "kmirror_part_records_total{mirror=\"m\",topic=\"topic-1999\",partition=\"9\"} 19999\n"));
	assert_int_equal(count_of(text, "kmirror_part_records_total{"), N + 2);
	free(text);
	km_metrics_free(m);
}

/* A family with a scale renders its integers in the unit of its name: milliseconds kept, seconds shown. */
static void test_scale_and_hidden(void **state)
{
	static const km_metric_desc lag = {.name = "kmirror_mirror_lag_seconds",
					   .help = "Behind in time.",
					   .type = KM_METRIC_GAUGE,
					   .labels = {"mirror"},
					   .scale = 0.001};
	static const km_metric_desc at = {.name = "kmirror_last_seconds",
					  .help = "When.",
					  .type = KM_METRIC_GAUGE,
					  .scale = 0.001};
	static const km_metric_desc one = {.name = "kmirror_plain", .help = "Scale 1 is none.", .type = KM_METRIC_COUNTER,
					   .scale = 1};
	km_metrics *m = km_metrics_new();
	uint64_t ms = 1500, when = 1733400000123ULL;
	km_metric_family *f = km_metrics_family(m, &lag);
	km_metric_series *s, *neg, *t, *p;
	char *text;

	(void)state;
	assert_non_null(f);
	s = km_metric_series_ptr(f, (const char *[]){"m1"}, &ms);
	neg = km_metric_series_get(f, (const char *[]){"m2"});
	assert_non_null(s);
	assert_non_null(neg);
	km_metric_set(neg, -250);
	assert_non_null(t = km_metric_series_ptr(km_metrics_family(m, &at), NULL, &when));
	assert_non_null(p = km_metric_series_get(km_metrics_family(m, &one), NULL));
	km_metric_inc(p, 12345678901ULL);
	text = render(m);
	assert_non_null(strstr(text, "kmirror_mirror_lag_seconds{mirror=\"m1\"} 1.5\n"));
	assert_non_null(strstr(text, "kmirror_mirror_lag_seconds{mirror=\"m2\"} -0.25\n"));
	assert_non_null(strstr(text, "\nkmirror_last_seconds 1733400000.123\n"));
	assert_non_null(strstr(text, "\nkmirror_plain 12345678901\n"));
	free(text);

	/* A hidden series is left out until shown again; the family's header stays. */
	km_metric_series_show(s, false);
	ms = 0;
	text = render(m);
	assert_null(strstr(text, "mirror=\"m1\""));
	assert_non_null(strstr(text, "# TYPE kmirror_mirror_lag_seconds gauge\n"));
	free(text);
	km_metric_series_show(s, true);
	text = render(m);
	assert_non_null(strstr(text, "kmirror_mirror_lag_seconds{mirror=\"m1\"} 0\n"));
	free(text);
	km_metrics_free(m);
}

/* Child registries (an upstream swap's modules): rendered after the parent, the newest child winning a name. */
static void test_children(void **state)
{
	static const km_metric_desc own = {.name = "kmirror_own", .help = "Parent's.", .type = KM_METRIC_GAUGE};
	static const km_metric_desc mod = {.name = "kmirror_module", .help = "A module's.", .type = KM_METRIC_GAUGE};
	km_metrics *m = km_metrics_new();
	km_metrics *old = km_metrics_new_child(m), *cur = km_metrics_new_child(m);
	char *text;

	km_metric_set(km_metric_series_get(km_metrics_family(m, &own), NULL), 1);
	km_metric_set(km_metric_series_get(km_metrics_family(old, &mod), NULL), 2);
	km_metric_set(km_metric_series_get(km_metrics_family(cur, &mod), NULL), 3);
	text = render(m);
	assert_non_null(strstr(text, "kmirror_own 1\n"));
	assert_non_null(strstr(text, "kmirror_module 3\n"));    /* the newest */
	assert_null(strstr(text, "kmirror_module 2\n"));

	/* one dropped family only: the children's own are left out */
	assert_null(strstr(strstr(text, "# TYPE " KM_METRICS_DROPPED_NAME) + 1, "# TYPE " KM_METRICS_DROPPED_NAME));
	free(text);
	km_metrics_free(cur); /* the previous one shows again */
	text = render(m);
	assert_non_null(strstr(text, "kmirror_module 2\n"));
	free(text);
	km_metrics_free(old);
	text = render(m);
	assert_null(strstr(text, "kmirror_module"));
	free(text);
	km_metrics_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_labels_and_types), cmocka_unit_test(test_bad_descriptions),
		cmocka_unit_test(test_escaping),         cmocka_unit_test(test_cardinality_cap),
		cmocka_unit_test(test_histogram),        cmocka_unit_test(test_by_pointer),
		cmocka_unit_test(test_many_series),      cmocka_unit_test(test_children),
		cmocka_unit_test(test_scale_and_hidden),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
