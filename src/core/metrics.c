/* The metrics registry: families of labelled series, a cap on series per family, Prometheus text rendering. */
#define _GNU_SOURCE /* fwrite_unlocked, fputs_unlocked, ferror_unlocked */
#include <dirent.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kmirror/log.h"
#include "kmirror/hash.h"
#include "kmirror/metrics.h"

struct km_metric_series {
	char *values[KM_METRICS_MAX_LABELS];
	km_metric_family *family;
	bool hidden; /* km_metric_series_show */
	/* What is rendered: the registry's own storage below, or the owner's. */
	const uint64_t *value;
	const uint64_t *buckets;
	const uint64_t *count;
	const double *sum;
	uint64_t own_value;
	uint64_t *own_buckets;
	uint64_t own_count;
	double own_sum;
};

struct km_metric_family {
	km_metrics *registry;
	char *name, *help;
	km_metric_type type;
	char *labels[KM_METRICS_MAX_LABELS];
	size_t nlabels;
	size_t max_series;
	double *bounds;
	size_t nbounds;
	bool hide_empty;
	double scale; /* 0: the integer as it is */
	km_metric_series **series; /* in the order they were made */
	size_t nseries, capseries;
	/*
	 * The same series by their label values (open addressing, a power of two at most half full),
	 * so that registering one of tens of thousands (a series per mirrored partition) is not a scan
	 * of all the others: that made a start of 10,000 partitions quadratic.
	 */
	km_metric_series **index;
	size_t nindex;
	km_metric_series *overflow; /* not counted against max_series */
	bool warned;
};

/* What km_metrics_add_process's families read, refreshed at each render. */
typedef struct km_process {
	uint64_t rss, vsize, fds, max_fds, cpu_us, start_us; /* the last two rendered in seconds */
} km_process;

struct km_metrics {
	km_metric_family **families;
	size_t nfamilies, capfamilies;
	uint64_t dropped;
	km_metrics *parent;    /* a child registry (km_metrics_new_child) */
	km_metrics **children; /* rendered after the families, newest first */
	size_t nchildren, capchildren;
	km_process *proc; /* km_metrics_add_process; NULL: none */
};

static bool name_ok(const char *s, bool colon)
{
	if (!s || !*s || (*s >= '0' && *s <= '9'))
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
		      (colon && *s == ':')))
			return false;
	return true;
}

static bool desc_ok(const km_metrics *m, const km_metric_desc *d)
{
	if (!name_ok(d->name, true) || !d->help)
		return false;
	for (size_t i = 0; i < m->nfamilies; i++)
		if (strcmp(m->families[i]->name, d->name) == 0)
			return false;
	for (size_t i = 0; i < KM_METRICS_MAX_LABELS && d->labels[i]; i++) {
		/* "__" names are reserved by Prometheus; "le" is the histogram's own. */
		if (!name_ok(d->labels[i], false) || strncmp(d->labels[i], "__", 2) == 0 ||
		    (d->type == KM_METRIC_HISTOGRAM && strcmp(d->labels[i], "le") == 0))
			return false;
		for (size_t j = 0; j < i; j++)
			if (strcmp(d->labels[i], d->labels[j]) == 0)
				return false;
	}
	if (d->type == KM_METRIC_HISTOGRAM) {
		if (!d->bounds || !d->nbounds)
			return false;
		for (size_t i = 1; i < d->nbounds; i++)
			if (!(d->bounds[i] > d->bounds[i - 1]))
				return false;
	}
	return true;
}

/* Double an array of pointers (8 to start with); false and unchanged when out of memory. */
static bool grow(void **arr, size_t *cap, size_t elem)
{
	size_t ncap = *cap ? *cap * 2 : 8;
	void *n = realloc(*arr, ncap * elem);
	if (!n)
		return false;
	*arr = n;
	*cap = ncap;
	return true;
}

static void family_free(km_metric_family *f);

km_metric_family *km_metrics_family(km_metrics *m, const km_metric_desc *d)
{
	km_metric_family *f;

	if (!desc_ok(m, d))
		return NULL;
	if (m->nfamilies == m->capfamilies && !grow((void **)&m->families, &m->capfamilies, sizeof(*m->families)))
		return NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->registry = m;
	f->type = d->type;
	f->max_series = d->max_series ? d->max_series : KM_METRICS_DEFAULT_MAX_SERIES;
	f->hide_empty = d->hide_empty;
	f->scale = d->scale == 1 ? 0 : d->scale;
	if (!(f->name = strdup(d->name)) || !(f->help = strdup(d->help)))
		goto fail;
	for (; f->nlabels < KM_METRICS_MAX_LABELS && d->labels[f->nlabels]; f->nlabels++)
		if (!(f->labels[f->nlabels] = strdup(d->labels[f->nlabels])))
			goto fail;
	if (d->type == KM_METRIC_HISTOGRAM) {
		f->nbounds = d->nbounds;
		if (!(f->bounds = malloc(d->nbounds * sizeof(*f->bounds))))
			goto fail;
		memcpy(f->bounds, d->bounds, d->nbounds * sizeof(*f->bounds));
	}
	m->families[m->nfamilies++] = f;
	return f;
fail:
	family_free(f);
	return NULL;
}

static void series_free(km_metric_series *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < KM_METRICS_MAX_LABELS; i++)
		free(s->values[i]);
	free(s->own_buckets);
	free(s);
}

static void family_free(km_metric_family *f)
{
	for (size_t i = 0; i < f->nseries; i++)
		series_free(f->series[i]);
	series_free(f->overflow);
	free(f->series);
	free(f->index);
	for (size_t i = 0; i < f->nlabels; i++)
		free(f->labels[i]);
	free(f->bounds);
	free(f->name);
	free(f->help);
	free(f);
}

km_metrics *km_metrics_new(void)
{
	static const km_metric_desc dropped = {
		.name = KM_METRICS_DROPPED_NAME,
		.help = "Label sets folded into a family's overflow series because the family was at its series cap.",
		.type = KM_METRIC_COUNTER,
	};
	km_metrics *m = calloc(1, sizeof(*m));
	km_metric_family *f;

	if (!m)
		return NULL;
	f = km_metrics_family(m, &dropped);
	if (!f || !km_metric_series_ptr(f, NULL, &m->dropped)) {
		km_metrics_free(m);
		return NULL;
	}
	return m;
}

km_metrics *km_metrics_new_child(km_metrics *parent)
{
	km_metrics *m;

	if (parent->nchildren == parent->capchildren &&
	    !grow((void **)&parent->children, &parent->capchildren, sizeof(*parent->children)))
		return NULL;
	if (!(m = km_metrics_new()))
		return NULL;
	m->parent = parent;
	parent->children[parent->nchildren++] = m;
	return m;
}

void km_metrics_free(km_metrics *m)
{
	if (!m)
		return;
	if (m->parent) {
		km_metrics *p = m->parent;
		for (size_t i = 0; i < p->nchildren; i++)
			if (p->children[i] == m) {
				memmove(&p->children[i], &p->children[i + 1], (p->nchildren - i - 1) * sizeof(*p->children));
				p->nchildren--;
				break;
			}
	}
	for (size_t i = 0; i < m->nchildren; i++)
		m->children[i]->parent = NULL;
	free(m->children);
	for (size_t i = 0; i < m->nfamilies; i++)
		family_free(m->families[i]);
	free(m->families);
	free(m->proc);
	free(m);
}

/* A new series with copies of the label values (or all KM_METRICS_OVERFLOW); not yet in the family. */
static km_metric_series *series_new(km_metric_family *f, const char *const *values)
{
	km_metric_series *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->family = f;
	for (size_t i = 0; i < f->nlabels; i++) {
		const char *v = values ? values[i] : KM_METRICS_OVERFLOW;
		if (!(s->values[i] = strdup(v ? v : ""))) {
			series_free(s);
			return NULL;
		}
	}
	s->value = &s->own_value;
	s->count = &s->own_count;
	s->sum = &s->own_sum;
	if (f->type == KM_METRIC_HISTOGRAM) {
		if (!(s->own_buckets = calloc(f->nbounds, sizeof(*s->own_buckets)))) {
			series_free(s);
			return NULL;
		}
		s->buckets = s->own_buckets;
	}
	return s;
}

/* FNV-1a over the label values, each ended by a zero byte (so ("ab", "c") and ("a", "bc") differ). */
static size_t values_hash(const km_metric_family *f, const char *const *values)
{
	uint64_t h = KM_FNV1A_INIT;
	for (size_t j = 0; j < f->nlabels; j++) {
		const char *v = values[j] ? values[j] : "";
		h = km_fnv1a(h, v, strlen(v) + 1); /* with the zero byte that ends the value */
	}
	return (size_t)h;
}

static bool values_equal(const km_metric_family *f, const km_metric_series *s, const char *const *values)
{
	for (size_t j = 0; j < f->nlabels; j++)
		if (strcmp(s->values[j], values[j] ? values[j] : "") != 0)
			return false;
	return true;
}

static km_metric_series *series_find(const km_metric_family *f, const char *const *values)
{
	if (!f->nindex)
		return NULL;
	for (size_t i = values_hash(f, values) & (f->nindex - 1);; i = (i + 1) & (f->nindex - 1)) {
		km_metric_series *s = f->index[i];
		if (!s)
			return NULL;
		if (values_equal(f, s, values))
			return s;
	}
}

static void index_put(km_metric_family *f, km_metric_series *s)
{
	size_t i = values_hash(f, (const char *const *)s->values) & (f->nindex - 1);
	while (f->index[i])
		i = (i + 1) & (f->nindex - 1);
	f->index[i] = s;
}

/* Room in the index for one more series (rebuilt twice as large when half full); false when out of memory. */
static bool index_room(km_metric_family *f)
{
	size_t n = f->nindex ? f->nindex : 16;
	km_metric_series **old = f->index;
	size_t nold = f->nindex;

	while ((f->nseries + 1) * 2 > n)
		n *= 2;
	if (n == f->nindex)
		return true;
	if (!(f->index = calloc(n, sizeof(*f->index)))) {
		f->index = old;
		return false;
	}
	f->nindex = n;
	for (size_t i = 0; i < nold; i++)
		if (old[i])
			index_put(f, old[i]);
	free(old);
	return true;
}

static void count_dropped(km_metric_family *f)
{
	f->registry->dropped++;
	if (f->warned)
		return;
	f->warned = true;
	KM_WARN("metrics", 0, "%s is at its cap of %zu series: new label sets are folded into one", f->name,
		f->max_series);
}

/* Find or make a series; over the cap, the overflow series when fold, else NULL. NULL also for no memory. */
static km_metric_series *series_lookup(km_metric_family *f, const char *const *values, bool fold)
{
	static const char *const none[KM_METRICS_MAX_LABELS] = {"", "", "", ""};
	km_metric_series *s;

	if (!values)
		values = none;
	if ((s = series_find(f, values)))
		return s;
	if (f->nseries >= f->max_series) {
		count_dropped(f);
		if (!fold)
			return NULL;
		if (!f->overflow)
			f->overflow = series_new(f, NULL);
		return f->overflow;
	}
	if (f->nseries == f->capseries && !grow((void **)&f->series, &f->capseries, sizeof(*f->series)))
		return NULL;
	if (!index_room(f) || !(s = series_new(f, values)))
		return NULL;
	f->series[f->nseries++] = s;
	index_put(f, s);
	return s;
}

km_metric_series *km_metric_series_get(km_metric_family *f, const char *const *values)
{
	return series_lookup(f, values, true);
}

km_metric_series *km_metric_series_ptr(km_metric_family *f, const char *const *values, const uint64_t *value)
{
	km_metric_series *s;
	if (f->type == KM_METRIC_HISTOGRAM || !(s = series_lookup(f, values, false)))
		return NULL;
	s->value = value;
	return s;
}

km_metric_series *km_metric_histogram_ptr(km_metric_family *f, const char *const *values, const uint64_t *buckets,
					  const uint64_t *count, const double *sum)
{
	km_metric_series *s;
	if (f->type != KM_METRIC_HISTOGRAM || !(s = series_lookup(f, values, false)))
		return NULL;
	s->buckets = buckets;
	s->count = count;
	s->sum = sum;
	return s;
}

void km_metric_series_show(km_metric_series *s, bool shown)
{
	s->hidden = !shown;
}

void km_metric_inc(km_metric_series *s, uint64_t n)
{
	s->own_value += n;
}

void km_metric_set(km_metric_series *s, int64_t v)
{
	s->own_value = (uint64_t)v;
}

size_t km_metrics_bucket(const double *bounds, size_t nbounds, double v)
{
	size_t b;
	for (b = 0; b < nbounds; b++)
		if (v <= bounds[b])
			break;
	return b;
}

void km_metric_observe(km_metric_series *s, double v)
{
	size_t b = km_metrics_bucket(s->family->bounds, s->family->nbounds, v);
	if (b < s->family->nbounds)
		s->own_buckets[b]++;
	s->own_count++;
	s->own_sum += v;
}

uint64_t km_metric_value(const km_metric_series *s)
{
	return *s->value;
}

/* ---- rendering ---- */

/*
 * The page is written with the stream locked once (km_metrics_render) and the unlocked calls: a
 * page of 10,000 partitions is about 70,000 series and 6 MB, rendered on the event loop, and a
 * locked call per character and an fprintf per number made it three times as long.
 */
static void put(FILE *out, const char *s, size_t n)
{
	fwrite_unlocked(s, 1, n, out);
}

static void put_str(FILE *out, const char *s)
{
	fputs_unlocked(s, out);
}

static void put_u64(FILE *out, uint64_t v)
{
	char b[24];
	size_t i = sizeof(b);
	do
		b[--i] = (char)('0' + v % 10);
	while (v /= 10);
	put(out, b + i, sizeof(b) - i);
}

static void put_i64(FILE *out, int64_t v)
{
	if (v < 0) {
		putc_unlocked('-', out);
		put_u64(out, 0 - (uint64_t)v);
	} else
		put_u64(out, (uint64_t)v);
}

/* A scaled value (%.15g), or a histogram's sum (%.6f: fixed). */
static void put_double(FILE *out, double v, bool fixed)
{
	char b[64];
	int n = fixed ? snprintf(b, sizeof(b), "%.6f", v) : snprintf(b, sizeof(b), "%.15g", v);
	if (n > 0)
		put(out, b, (size_t)n < sizeof(b) ? (size_t)n : sizeof(b) - 1);
}

/* HELP text escapes backslash and newline; label values also the double quote. */
static void put_escaped(FILE *out, const char *s, bool quote)
{
	const char *special = quote ? "\\\n\"" : "\\\n";
	for (;;) {
		size_t n = strcspn(s, special);
		put(out, s, n);
		s += n;
		if (!*s)
			return;
		put_str(out, *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : "\\\"");
		s++;
	}
}

/* {a="x",b="y"} with an optional le; nothing when there are no labels at all. */
static void put_labels(FILE *out, const km_metric_series *s, const char *le)
{
	const km_metric_family *f = s->family;
	if (!f->nlabels && !le)
		return;
	putc_unlocked('{', out);
	for (size_t i = 0; i < f->nlabels; i++) {
		if (i)
			putc_unlocked(',', out);
		put_str(out, f->labels[i]);
		put(out, "=\"", 2);
		put_escaped(out, s->values[i], true);
		putc_unlocked('"', out);
	}
	if (le) {
		put_str(out, f->nlabels ? ",le=\"" : "le=\"");
		put_str(out, le);
		putc_unlocked('"', out);
	}
	putc_unlocked('}', out);
}

/* name, suffix, labels (le optional), a space: the head of a sample line. */
static void put_head(FILE *out, const km_metric_series *s, const char *suffix, const char *le)
{
	put_str(out, s->family->name);
	put_str(out, suffix);
	put_labels(out, s, le);
	putc_unlocked(' ', out);
}

static void render_series(FILE *out, const km_metric_series *s)
{
	const km_metric_family *f = s->family;
	uint64_t cum = 0;
	char le[32];

	if (s->hidden)
		return;
	switch (f->type) {
	case KM_METRIC_COUNTER:
	case KM_METRIC_GAUGE:
		if (f->hide_empty && !*s->value)
			return;
		put_head(out, s, "", NULL);
		if (f->scale && *s->value) {
			double v = f->type == KM_METRIC_GAUGE ? (double)(int64_t)*s->value : (double)*s->value;
			put_double(out, v * f->scale, false);
		} else if (f->type == KM_METRIC_GAUGE)
			put_i64(out, (int64_t)*s->value);
		else
			put_u64(out, *s->value);
		putc_unlocked('\n', out);
		return;
	case KM_METRIC_HISTOGRAM:
		if (f->hide_empty && !*s->count)
			return;
		for (size_t b = 0; b < f->nbounds; b++) {
			cum += s->buckets[b];
			snprintf(le, sizeof(le), "%g", f->bounds[b]);
			put_head(out, s, "_bucket", le);
			put_u64(out, cum);
			putc_unlocked('\n', out);
		}
		put_head(out, s, "_bucket", "+Inf");
		put_u64(out, *s->count);
		putc_unlocked('\n', out);
		put_head(out, s, "_sum", NULL);
		put_double(out, *s->sum, true);
		putc_unlocked('\n', out);
		put_head(out, s, "_count", NULL);
		put_u64(out, *s->count);
		putc_unlocked('\n', out);
		return;
	}
}

/* Whether a family called name was rendered before f's turn: in root's families, or a child newer than upto. */
static bool rendered_before(const km_metrics *root, size_t upto, const char *name)
{
	for (size_t i = 0; i < root->nfamilies; i++)
		if (!strcmp(root->families[i]->name, name))
			return true;
	for (size_t c = root->nchildren; c-- > upto + 1;)
		for (size_t i = 0; i < root->children[c]->nfamilies; i++)
			if (!strcmp(root->children[c]->families[i]->name, name))
				return true;
	return false;
}

static void render_families(const km_metrics *m, const km_metrics *root, size_t child, FILE *out)
{
	static const char *const type_names[] = {"counter", "gauge", "histogram"};

	for (size_t i = 0; i < m->nfamilies; i++) {
		const km_metric_family *f = m->families[i];
		if (m != root && rendered_before(root, child, f->name))
			continue;
		put_str(out, "# HELP ");
		put_str(out, f->name);
		putc_unlocked(' ', out);
		put_escaped(out, f->help, false);
		put_str(out, "\n# TYPE ");
		put_str(out, f->name);
		putc_unlocked(' ', out);
		put_str(out, type_names[f->type]);
		putc_unlocked('\n', out);
		for (size_t j = 0; j < f->nseries; j++)
			render_series(out, f->series[j]);
		if (f->overflow)
			render_series(out, f->overflow);
	}
}

/* ---- process metrics ---- */

/* The process's start time after boot in clock ticks (field 22 of /proc/self/stat); false when unreadable. */
static bool proc_start(uint64_t *start)
{
	char buf[1024], *p;
	size_t n;
	FILE *f = fopen("/proc/self/stat", "r");

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name (field 2) is in parentheses and may hold spaces: count from its end. */
	if (!(p = strrchr(buf, ')')))
		return false;
	return sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
		      (unsigned long long *)start) == 1;
}

/* The boot time, seconds since the epoch (btime in /proc/stat); 0 when unknown. */
static uint64_t boot_time(void)
{
	char line[256];
	unsigned long long bt = 0;
	FILE *f = fopen("/proc/stat", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %llu", &bt) == 1)
			break;
	fclose(f);
	return bt;
}

static void process_read(km_process *p)
{
	unsigned long long size = 0, resident = 0;
	long page = sysconf(_SC_PAGESIZE);
	struct rusage ru;
	struct rlimit rl;
	FILE *f = fopen("/proc/self/statm", "r");
	DIR *d;

	if (f) {
		if (fscanf(f, "%llu %llu", &size, &resident) == 2) {
			p->vsize = size * (uint64_t)page;
			p->rss = resident * (uint64_t)page;
		}
		fclose(f);
	}
	if ((d = opendir("/proc/self/fd"))) {
		uint64_t n = 0;
		for (struct dirent *e; (e = readdir(d));)
			n += e->d_name[0] != '.';
		closedir(d);
		p->fds = n - 1; /* less the one opendir holds */
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		p->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
	if (getrusage(RUSAGE_SELF, &ru) == 0)
		p->cpu_us = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
			    (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

km_err km_metrics_add_process(km_metrics *m)
{
	static const struct {
		const char *name, *help;
		km_metric_type type;
		size_t offset;
		double scale;
	} fams[] = {
#define P(f) offsetof(km_process, f)
		{"process_resident_memory_bytes", "Resident memory size in bytes.", KM_METRIC_GAUGE, P(rss), 0},
		{"process_virtual_memory_bytes", "Virtual memory size in bytes.", KM_METRIC_GAUGE, P(vsize), 0},
		{"process_open_fds", "Number of open file descriptors.", KM_METRIC_GAUGE, P(fds), 0},
		{"process_max_fds", "Maximum number of open file descriptors.", KM_METRIC_GAUGE, P(max_fds), 0},
		{"process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", KM_METRIC_COUNTER,
		 P(cpu_us), 1e-6},
		{"process_start_time_seconds", "Start time of the process since unix epoch in seconds.", KM_METRIC_GAUGE,
		 P(start_us), 1e-6},
#undef P
	};
	long tck = sysconf(_SC_CLK_TCK);
	uint64_t start;

	if (m->proc || tck <= 0 || !proc_start(&start))
		return KM_OK; /* not Linux: no /proc to read them from */
	if (!(m->proc = calloc(1, sizeof(*m->proc))))
		return KM_ERR_NOMEM;
	m->proc->start_us = boot_time() * 1000000 + start * 1000000 / (uint64_t)tck;
	for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
		km_metric_desc d = {.name = fams[i].name, .help = fams[i].help, .type = fams[i].type, .scale = fams[i].scale};
		km_metric_family *f = km_metrics_family(m, &d);
		if (!f || !km_metric_series_ptr(f, NULL, (const uint64_t *)((const char *)m->proc + fams[i].offset)))
			return KM_ERR_NOMEM;
	}
	return KM_OK;
}

km_err km_metrics_render(const km_metrics *m, FILE *out)
{
	km_err rc;

	if (m->proc)
		process_read(m->proc);
	flockfile(out);
	render_families(m, m, 0, out);
	for (size_t c = m->nchildren; c-- > 0;)
		render_families(m->children[c], m, c, out);
	rc = ferror_unlocked(out) ? KM_ERR_IO : KM_OK;
	funlockfile(out);
	return rc;
}
