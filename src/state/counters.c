/* The state store's metrics: plain fields in the store, registered by pointer in the metrics registry (docs/state.md, "Metrics"). */
#include <stddef.h>
#include <string.h>

#include "state/state_int.h"

const double km_state_write_bounds[KM_STATE_WRITE_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
							      0.1,   0.25,   0.5,   1.0,  5.0,   30.0};

void km_state_counters_write(km_state_counters *c, bool ok, double seconds)
{
	size_t b = km_metrics_bucket(km_state_write_bounds, KM_STATE_WRITE_BUCKETS, seconds);

	if (!ok) {
		c->write_failures++;
		return;
	}
	c->writes++;
	if (b < KM_STATE_WRITE_BUCKETS)
		c->write_bucket[b]++;
	c->write_count++;
	c->write_sum += seconds;
}

void km_state_counters_follow(km_state_counters *c, double delay_s)
{
	size_t b;

	c->follows++;
	if (delay_s < 0)
		return;
	c->follow_last_ms = (int64_t)(delay_s * 1000);
	b = km_metrics_bucket(km_state_write_bounds, KM_STATE_WRITE_BUCKETS, delay_s);
	if (b < KM_STATE_WRITE_BUCKETS)
		c->follow_bucket[b]++;
	c->follow_count++;
	c->follow_sum += delay_s;
}

void km_state_counters_count(km_state_counters *c, const km_state_model *m)
{
	c->mirrors = m->nmirrors;
	c->topics = 0;
	memset(c->partitions, 0, sizeof(c->partitions));
	for (size_t i = 0; i < m->nmirrors; i++) {
		c->topics += m->mirrors[i]->ntopics;
		for (size_t j = 0; j < m->mirrors[i]->ntopics; j++) {
			const km_state_topic *t = m->mirrors[i]->topics[j];
			for (size_t k = 0; k < t->nparts; k++)
				if (t->parts[k].present && (unsigned)t->parts[k].state < KM_MP__COUNT)
					c->partitions[t->parts[k].state]++;
		}
	}
}

void km_state_health_get(const km_state *st, km_state_health *out)
{
	*out = (km_state_health){
		.loaded = km_state_ready(st),
		.fatal = km_state_fatal_message(st),
		.writes = st->ctr.writes,
		.write_failures = st->ctr.write_failures,
		.follows = st->ctr.follows,
		.follow_delay_ms = km_state_follow_delay_ms(st),
	};
}

/* The unlabelled families: one field each. */
static const struct {
	const char *name, *help;
	km_metric_type type;
	size_t offset;
	double scale; /* what the field's unit is in seconds (0: not a time) */
} plain[] = {
#define C(f) offsetof(km_state_counters, f)
	{"kmirror_state_writes_total", "Changes written to __mirror_state and acknowledged.", KM_METRIC_COUNTER, C(writes)},
	{"kmirror_state_write_failures_total", "Changes whose write to __mirror_state failed for good.",
	 KM_METRIC_COUNTER, C(write_failures)},
	{"kmirror_state_loads_total", "Reads of __mirror_state to its end (start-up, after a failed write).",
	 KM_METRIC_COUNTER, C(loads)},
	{"kmirror_state_records_loaded_total", "Records read from __mirror_state by loads.", KM_METRIC_COUNTER,
	 C(records_loaded)},
	{"kmirror_state_load_duration_seconds", "How long the last load of __mirror_state took.", KM_METRIC_GAUGE,
	 C(load_ms), 0.001},
	{"kmirror_state_ready", "1 once __mirror_state has been read back (mirror RPCs are answered).",
	 KM_METRIC_GAUGE, C(ready)},
	{"kmirror_state_follows_total", "Changes another kmirrord wrote to __mirror_state, applied here by following it.",
	 KM_METRIC_COUNTER, C(follows)},
	{"kmirror_state_mirrors", "Mirrors defined.", KM_METRIC_GAUGE, C(mirrors)},
	{"kmirror_state_mirror_topics", "Topics in a mirror (any state).", KM_METRIC_GAUGE, C(topics)},
#undef C
};

km_err km_state_counters_register(km_state_counters *c, km_metrics *reg)
{
	static const km_metric_desc latency = {
		.name = "kmirror_state_write_latency_seconds",
		.help = "Time from a change's write to __mirror_state until every partition acknowledged it (retries included).",
		.type = KM_METRIC_HISTOGRAM,
		.bounds = km_state_write_bounds,
		.nbounds = KM_STATE_WRITE_BUCKETS,
	};
	static const km_metric_desc follow = {
		.name = "kmirror_state_follow_delay_seconds",
		.help = "Time from another kmirrord's write to __mirror_state (its batch timestamp) until this one applied it.",
		.type = KM_METRIC_HISTOGRAM,
		.bounds = km_state_write_bounds,
		.nbounds = KM_STATE_WRITE_BUCKETS,
	};
	static const km_metric_desc parts = {
		.name = "kmirror_state_partitions",
		.help = "Mirrored partitions by state.",
		.type = KM_METRIC_GAUGE,
		.labels = {"state"},
		.max_series = KM_MP__COUNT,
	};
	km_metric_family *f;

	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		km_metric_desc d = {
			.name = plain[i].name, .help = plain[i].help, .type = plain[i].type, .scale = plain[i].scale};
		f = km_metrics_family(reg, &d);
		if (!f || !km_metric_series_ptr(f, NULL, (const uint64_t *)((const char *)c + plain[i].offset)))
			return KM_ERR_NOMEM;
	}
	if (!(f = km_metrics_family(reg, &latency)) ||
	    !km_metric_histogram_ptr(f, NULL, c->write_bucket, &c->write_count, &c->write_sum))
		return KM_ERR_NOMEM;
	if (!(f = km_metrics_family(reg, &follow)) ||
	    !km_metric_histogram_ptr(f, NULL, c->follow_bucket, &c->follow_count, &c->follow_sum))
		return KM_ERR_NOMEM;
	if (!(f = km_metrics_family(reg, &parts)))
		return KM_ERR_NOMEM;
	/* UNKNOWN is never stored: a partition without a record is not mirrored. */
	for (int s = KM_MP_PREPARING; s < KM_MP__COUNT; s++) {
		const char *v[] = {km_mp_state_name((km_mp_state)s)};
		if (!km_metric_series_ptr(f, v, &c->partitions[s]))
			return KM_ERR_NOMEM;
	}
	return KM_OK;
}
