/* kmirror metrics registry: labelled counters, gauges and histograms with bounded series, in Prometheus text format. */
#ifndef KMIRROR_METRICS_H
#define KMIRROR_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kmirror/error.h"

#define KM_METRICS_MAX_LABELS 4
#define KM_METRICS_DEFAULT_MAX_SERIES 1000
/* Every label value of the series that new label sets fold into once a family is at its cap. */
#define KM_METRICS_OVERFLOW "_overflow"
#define KM_METRICS_DROPPED_NAME "kmirror_metrics_series_dropped_total"

typedef struct km_metrics km_metrics; /* the registry */
typedef struct km_metric_family km_metric_family;
typedef struct km_metric_series km_metric_series;

typedef enum {
	KM_METRIC_COUNTER,
	KM_METRIC_GAUGE,
	KM_METRIC_HISTOGRAM,
} km_metric_type;

typedef struct km_metric_desc {
	const char *name; /* [a-zA-Z_:][a-zA-Z0-9_:]* */
	const char *help;
	km_metric_type type;
	const char *labels[KM_METRICS_MAX_LABELS]; /* label names; the first NULL ends them */
	size_t max_series;     /* distinct label sets kept; 0: KM_METRICS_DEFAULT_MAX_SERIES */
	const double *bounds;  /* histograms: bucket upper bounds, ascending (+Inf is implicit) */
	size_t nbounds;
	bool hide_empty;       /* leave out series at 0 (histograms: with no observation) */
	/*
	 * Counters and gauges: the value rendered is the kept integer times scale (0: 1), so an owner
	 * keeps milliseconds or clock ticks and the exposition says seconds, as Prometheus names want.
	 */
	double scale;
} km_metric_desc;

/* A registry; it always holds KM_METRICS_DROPPED_NAME, the label sets folded into overflow series. */
km_metrics *km_metrics_new(void);
/*
 * A registry rendered as part of parent's exposition, after parent's families, the newest child
 * first; a family whose name came earlier is left out (a module made twice, as at an upstream swap,
 * shows its newest instance). km_metrics_free of the child detaches it; free children first.
 */
km_metrics *km_metrics_new_child(km_metrics *parent);
/* Frees the families and series; the owners of series by pointer must not use them afterwards. */
void km_metrics_free(km_metrics *m);

/* Add a family; NULL for a bad description (name, labels, bounds), a name already taken, or no memory. */
km_metric_family *km_metrics_family(km_metrics *m, const km_metric_desc *d);

/*
 * The series of f with these label values (one per label name; NULL when f has none), made on first
 * use and owned by the registry. A lookup is a scan: look up once and keep the handle. Beyond the
 * family's cap the overflow series is returned and the dropped counter goes up. NULL: no memory.
 */
km_metric_series *km_metric_series_get(km_metric_family *f, const char *const *values);
/*
 * A counter or gauge series whose value lives in the owner's *value (a plain field the hot path
 * increments); read at render time, so it must outlive the registry's use. Beyond the cap: NULL
 * (and counted as dropped), as there is no sum of pointers to fold into.
 */
km_metric_series *km_metric_series_ptr(km_metric_family *f, const char *const *values, const uint64_t *value);
/*
 * A histogram series kept by its owner: buckets[f's nbounds] non-cumulative counts (an observation
 * above the last bound is only in *count), the count and the sum. Rendered cumulative.
 */
km_metric_series *km_metric_histogram_ptr(km_metric_family *f, const char *const *values, const uint64_t *buckets,
					  const uint64_t *count, const double *sum);

/* Leave a series out of the exposition (shown false) or put it back: a value this process does not know now. */
void km_metric_series_show(km_metric_series *s, bool shown);

/* Registry-owned series: counters go up, gauges are set, histograms observe. */
void km_metric_inc(km_metric_series *s, uint64_t n);
void km_metric_set(km_metric_series *s, int64_t v);
void km_metric_observe(km_metric_series *s, double v);
/* Current value of a counter or gauge series (a gauge's as its int64_t bits). */
uint64_t km_metric_value(const km_metric_series *s);

/* The bucket v falls in: the first bound >= v, or nbounds when above all (for histograms by pointer). */
size_t km_metrics_bucket(const double *bounds, size_t nbounds, double v);

/*
 * The standard process families (process_resident_memory_bytes, process_cpu_seconds_total, ...),
 * read from /proc/self when rendered; Linux only (elsewhere they are not added).
 */
km_err km_metrics_add_process(km_metrics *m) __attribute__((warn_unused_result));

/* The Prometheus text exposition (version 0.0.4) of every family, in the order they were added. */
km_err km_metrics_render(const km_metrics *m, FILE *out);

#endif
