/* The mirror driver: hands partitions to their mirror's pipeline and persists the transitions the pipelines complete (kmirror/mirror.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <event2/dns.h>

#include "kmirror/log.h"
#include "mirror_int.h"

/* Transitions in flight at once: the store runs mutations one by one and bounds its queue. */
#define KM_MIRROR_DRIVER_INFLIGHT 32
/*
 * Partitions of one topic settled by one store write: a start of a topic with many partitions is
 * one Produce round, not one per partition (docs/state.md, "Write path").
 */
#define KM_MIRROR_DRIVER_BATCH 1024
/*
 * A transition the store refused for now (busy with a full queue, loading, a timeout) goes back
 * into the queue: the queue waits RETRY_MIN_MS, doubled while refusals go on, to RETRY_MAX_MS. Its
 * partition's pipeline waits for it (it is settling until the store says it moved).
 */
#define KM_MIRROR_DRIVER_RETRY_MIN_MS 100
#define KM_MIRROR_DRIVER_RETRY_MAX_MS 5000

/* One store write: partitions of one topic moving from one state to the next. */
typedef struct km_mirror_batch {
	km_mirror *mi;
	char *mirror, *topic;
	km_mp_state from, to;
	int32_t *parts;
	size_t n;
} km_mirror_batch;

typedef struct km_mirror_work {
	struct km_mirror_work *next;
	km_mirror *mi;
	int32_t partition;
	km_mp_state from, to;
	char *mirror, *topic;
	char *error; /* FAILED: the reason */
} km_mirror_work;

struct km_mirror {
	struct event_base *base;
	km_mirror_opts opts;
	char instance[256];
	km_state *st;
	km_pipeline **pipes;
	size_t npipes;
	km_mirror_families fam;
	struct evdns_base *dns; /* the mirrors' name lookups never block the loop (the proxy shares it) */
	struct event *run_ev;
	km_mirror_work *head, *tail;
	size_t inflight;
	int retry_ms;       /* the wait after the last refusal (0: none since the last success) */
	int64_t hold_until; /* no transition is sent before this (monotonic ms) */
	bool freeing;
	struct km_mprep *preps; /* destination topics being created or grown (topics.c) */
	km_sync *sync;          /* metadata sync (sync.c) */
	km_lease *lease;        /* which mirrors this kmirrord runs (lease.c) */
	struct event *rebalance_ev;
	/*
	 * Mirrors gained (gaining) wait for the store's writes asked for before the gain
	 * (km_state_write_ticket), then for a follow round that started after those
	 * (km_state_follow_ticket, once follow_asked), since fresh_since.
	 */
	bool gaining, follow_asked;
	bool regaining;         /* rebalance hands gained mirrors to their pipelines (dispatch resumes a retired one) */
	uint64_t write_ticket, fresh_ticket;
	int64_t fresh_since;
	char self[600];         /* km_mirror_self */
	km_report *report;      /* its record in __mirror_state (report.c) */
	km_metric_series *owned, *gained, *lost; /* kmirror_mirrors_owned, kmirror_mirror_handovers_total */
};

static void rebalance(void *arg);
static void count_owned(km_mirror *mi);
static void rebalance_cb(evutil_socket_t fd, short what, void *arg);
static bool releasing(void *arg, int32_t slot);

static void work_free(km_mirror_work *w)
{
	free(w->error);
	free(w->mirror);
	free(w->topic);
	free(w);
}

static void schedule(km_mirror *mi)
{
	int64_t wait;

	if (!mi->head || mi->inflight >= KM_MIRROR_DRIVER_INFLIGHT || mi->freeing)
		return;
	wait = mi->hold_until - km_mono_ms();
	if (wait > 0) {
		struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)((wait % 1000) * 1000)};
		event_add(mi->run_ev, &tv);
	} else {
		event_active(mi->run_ev, 0, 0);
	}
}

static void queue(km_mirror *mi, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
		  km_mp_state to, const char *error)
{
	km_mirror_work *w = calloc(1, sizeof(*w));

	if (!w || !(w->mirror = strdup(mirror)) || !(w->topic = strdup(topic)) ||
	    (error && !(w->error = strdup(error)))) {
		KM_ERROR("mirror", 0, "%s/%s-%d: out of memory queueing its %s -> %s transition", mirror, topic,
			     (int)partition, km_mp_state_name(from), km_mp_state_name(to));
		if (w)
			work_free(w);
		return;
	}
	w->mi = mi;
	w->partition = partition;
	w->from = from;
	w->to = to;
	if (mi->tail)
		mi->tail->next = w;
	else
		mi->head = w;
	mi->tail = w;
	schedule(mi);
}

/* The partition's committed state now, or UNKNOWN when it is gone (stopped and deleted meanwhile). */
static km_mp_state current(const km_state *st, const km_mirror_work *w)
{
	const km_state_topic *t = km_state_topic_find(st, w->topic, strlen(w->topic));
	km_state_partition_info pi;

	if (!t || strcmp(km_state_mirror_name(km_state_topic_mirror(t)), w->mirror) != 0)
		return KM_MP_UNKNOWN;
	/* Partitions are listed in order and usually dense: index = partition is the common case. */
	if ((size_t)w->partition < km_state_topic_partition_count(t)) {
		km_state_topic_partition(t, (size_t)w->partition, &pi);
		if (pi.partition == w->partition)
			return pi.state;
	}
	for (size_t i = 0; i < km_state_topic_partition_count(t); i++) {
		km_state_topic_partition(t, i, &pi);
		if (pi.partition == w->partition)
			return pi.state;
	}
	return KM_MP_UNKNOWN;
}

static void batch_free(km_mirror_batch *b)
{
	free(b->mirror);
	free(b->topic);
	free(b->parts);
	free(b);
}

/*
 * After a store answer: a refusal for now holds the queue back (KM_MIRROR_DRIVER_RETRY_*) and says
 * true, so that the caller queues its partitions again; a success ends the hold.
 */
static bool refused_for_now(km_mirror *mi, const km_state_result *res)
{
	if (res->code == KM_OK) {
		mi->retry_ms = 0;
		return false;
	}
	if (!km_err_retriable(res->code) || mi->freeing)
		return false;
	mi->retry_ms = mi->retry_ms ? mi->retry_ms * 2 : KM_MIRROR_DRIVER_RETRY_MIN_MS;
	if (mi->retry_ms > KM_MIRROR_DRIVER_RETRY_MAX_MS)
		mi->retry_ms = KM_MIRROR_DRIVER_RETRY_MAX_MS;
	mi->hold_until = km_mono_ms() + mi->retry_ms;
	return true;
}

static void transition_done(void *arg, const km_state_result *res)
{
	km_mirror_batch *b = arg;
	km_mirror *mi = b->mi;

	mi->inflight--;
	if (refused_for_now(mi, res)) {
		KM_INFO("mirror", 0, "%s/%s: %zu partition(s) (first %d) %s -> %s not persisted yet: %s: %s; again in %d ms",
			b->mirror, b->topic, b->n, (int)b->parts[0], km_mp_state_name(b->from), km_mp_state_name(b->to),
			km_err_name(res->code), res->message ? res->message : "", mi->retry_ms);
		for (size_t i = 0; i < b->n; i++)
			queue(mi, b->mirror, b->topic, b->parts[i], b->from, b->to, NULL);
	} else if (res->code != KM_OK) {
		/* The store keeps the partitions where they were; the next start-up picks them up again. */
		KM_WARN("mirror", 0, "%s/%s: could not move %zu partition(s) (first %d) %s -> %s: %s: %s", b->mirror,
			b->topic, b->n, (int)b->parts[0], km_mp_state_name(b->from), km_mp_state_name(b->to),
			km_err_name(res->code), res->message ? res->message : "");
	}
	batch_free(b);
	schedule(mi);
}

/* Moves w into b when it is the same topic and transition; false otherwise. */
static bool batch_take(km_mirror_batch *b, km_mirror_work *w)
{
	if (b->n >= KM_MIRROR_DRIVER_BATCH || w->from != b->from || w->to != b->to || w->error ||
	    strcmp(w->topic, b->topic) || strcmp(w->mirror, b->mirror))
		return false;
	b->parts[b->n++] = w->partition;
	return true;
}

static void single_done(void *arg, const km_state_result *res)
{
	km_mirror_work *w = arg;
	km_mirror *mi = w->mi;

	mi->inflight--;
	if (refused_for_now(mi, res)) {
		KM_INFO("mirror", 0, "%s/%s-%d: %s -> %s not persisted yet: %s: %s; again in %d ms", w->mirror, w->topic,
			(int)w->partition, km_mp_state_name(w->from), km_mp_state_name(w->to), km_err_name(res->code),
			res->message ? res->message : "", mi->retry_ms);
		queue(mi, w->mirror, w->topic, w->partition, w->from, w->to, w->error);
	} else if (res->code != KM_OK) {
		KM_WARN("mirror", 0, "%s/%s-%d: could not move %s -> %s: %s: %s", w->mirror, w->topic,
			(int)w->partition, km_mp_state_name(w->from), km_mp_state_name(w->to), km_err_name(res->code),
			res->message ? res->message : "");
	}
	work_free(w);
	schedule(mi);
}

static void run_cb(evutil_socket_t fd, short what, void *arg)
{
	km_mirror *mi = arg;

	(void)fd;
	(void)what;
	if (mi->hold_until > km_mono_ms()) {
		schedule(mi); /* woken early (a new transition queued): the hold runs on */
		return;
	}
	while (mi->head && mi->inflight < KM_MIRROR_DRIVER_INFLIGHT) {
		km_mirror_work *w = mi->head, **pp;
		km_mirror_batch *b;

		mi->head = w->next;
		if (!mi->head)
			mi->tail = NULL;
		w->next = NULL;
		if (!mi->st || current(mi->st, w) != w->from) {
			work_free(w); /* moved on meanwhile (stopped while preparing, ...): nothing to settle */
			continue;
		}
		if (w->error) {
			/* A failure carries its own reason: written alone. */
			mi->inflight++;
			km_state_partition_set(mi->st, w->mirror, w->topic, w->partition, w->to, w->error, single_done, w);
			continue;
		}
		b = calloc(1, sizeof(*b));
		if (!b || !(b->parts = malloc(KM_MIRROR_DRIVER_BATCH * sizeof(*b->parts)))) {
			free(b);
			/* Settle this one alone; the rest waits for memory. */
			mi->inflight++;
			km_state_partition_set(mi->st, w->mirror, w->topic, w->partition, w->to, NULL, single_done, w);
			continue;
		}
		b->mi = mi;
		b->from = w->from;
		b->to = w->to;
		b->mirror = w->mirror;
		b->topic = w->topic;
		w->mirror = w->topic = NULL;
		b->parts[b->n++] = w->partition;
		work_free(w);
		/* The queued partitions of the same topic and transition go in the same write. */
		for (pp = &mi->head; *pp;) {
			km_mirror_work *o = *pp;
			if (current(mi->st, o) == o->from && batch_take(b, o)) {
				*pp = o->next;
				if (mi->tail == o)
					mi->tail = NULL;
				work_free(o);
				continue;
			}
			pp = &o->next;
		}
		if (!mi->tail)
			for (km_mirror_work *t = mi->head; t; t = t->next)
				mi->tail = t;
		mi->inflight++;
		km_state_partitions_set(mi->st, b->mirror, b->topic, b->parts, b->n, b->to, NULL, transition_done, b);
	}
}

#define PART_LABELS {"mirror", "topic", "partition", NULL}
/* Mirrored partitions, several series each: the cap is well above the 10,000 partitions a kmirrord holds. */
#define PART_SERIES 200000

static void make_families(km_mirror *mi, km_metrics *reg)
{
	static const km_metric_desc d[] = {
		{.name = "kmirror_mirror_records_total", .help = "Records written into the destination, per partition.",
		 .type = KM_METRIC_COUNTER, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_bytes_total", .help = "Record batch bytes written into the destination, per partition.",
		 .type = KM_METRIC_COUNTER, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_batches_total", .help = "Record batches written into the destination, per partition.",
		 .type = KM_METRIC_COUNTER, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_lag_records", .help = "The source's high watermark minus the mirrored offset.",
		 .type = KM_METRIC_GAUGE, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_lag_seconds",
		 .help = "How far behind the source the mirror is in time: now minus the newest mirrored record's timestamp, 0 when caught up.",
		 .type = KM_METRIC_GAUGE, .labels = PART_LABELS, .max_series = PART_SERIES, .scale = 0.001},
		{.name = "kmirror_mirror_skipped_records_total",
		 .help = "Records the source's retention removed before the mirror read them (holes in the offset map).",
		 .type = KM_METRIC_COUNTER, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_errors_total", .help = "Errors on the partition's fetches and writes (each one reconciles, retries or fails it).",
		 .type = KM_METRIC_COUNTER, .labels = PART_LABELS, .max_series = PART_SERIES},
		{.name = "kmirror_mirror_fenced_writes_total",
		 .help = "Batches the destination refused because a newer epoch of the mirror's writer wrote the "
			 "partition: another kmirrord runs (or ran) the mirror.",
		 .type = KM_METRIC_COUNTER, .labels = {"mirror", NULL}, .max_series = 20000},
		{.name = "kmirror_mirror_fetch_requests_total",
		 .help = "Fetch requests sent to the source: full ones (every partition named), incremental ones (a fetch session's "
			 "changes only) and side ones (partitions that became ready while the broker's main Fetch waited, on a second connection).",
		 .type = KM_METRIC_COUNTER, .labels = {"mirror", "kind", NULL}, .max_series = 20000},
		{.name = "kmirror_mirror_fetches_ahead_total",
		 .help = "Partitions put in a Fetch while their last fetched batches were still being written (all sent, "
			 "not all acknowledged): fetching and writing a partition overlap.",
		 .type = KM_METRIC_COUNTER, .labels = {"mirror", NULL}, .max_series = 20000},
		{.name = "kmirror_mirror_produce_requests_total",
		 .help = "Produce requests sent to the destination, per write lane (one of the connections to each "
			 "destination broker the mirror's partitions are spread over).",
		 .type = KM_METRIC_COUNTER, .labels = {"mirror", "lane", NULL}, .max_series = 20000},
		{.name = "kmirror_mirror_source_reachable",
		 .help = "1 when the pipeline's last contact with the mirror's source cluster succeeded, 0 when it could "
			 "not reach it (refused, DNS, timeout, authentication); only where the pipeline runs.",
		 .type = KM_METRIC_GAUGE, .labels = {"mirror", NULL}, .max_series = 20000},
		{.name = "kmirror_mirror_last_fetch_timestamp_seconds",
		 .help = "When the source last answered a Fetch of the mirror (seconds since the epoch): the lag "
			 "stands still while the source is away, this does not advance.",
		 .type = KM_METRIC_GAUGE, .labels = {"mirror", NULL}, .max_series = 20000, .scale = 0.001},
	};
	static const km_metric_desc own[] = {
		{.name = "kmirror_mirrors_owned",
		 .help = "Mirrors whose pipelines run in this kmirrord (mirror_pipelines = owned: those the group "
			 "mirror_sync_group gives it; all: every mirror with a partition to run).",
		 .type = KM_METRIC_GAUGE},
		{.name = "kmirror_mirror_handovers_total",
		 .help = "Mirrors this kmirrord took over (gained) or let go of (lost) as the group mirror_sync_group "
			 "moved them.",
		 .type = KM_METRIC_COUNTER, .labels = {"direction", NULL}},
	};
	km_metric_family **f[] = {&mi->fam.records, &mi->fam.bytes,   &mi->fam.batches, &mi->fam.lag,
				  &mi->fam.lag_ms,  &mi->fam.skipped, &mi->fam.errors,  &mi->fam.fenced,
				  &mi->fam.fetches, &mi->fam.ahead,   &mi->fam.produces, &mi->fam.reachable,
				  &mi->fam.fetched_at};
	km_metric_family *owned = km_metrics_family(reg, &own[0]), *moved = km_metrics_family(reg, &own[1]);
	const char *gained[] = {"gained"}, *lost[] = {"lost"};

	mi->owned = owned ? km_metric_series_get(owned, NULL) : NULL;
	mi->gained = moved ? km_metric_series_get(moved, gained) : NULL;
	mi->lost = moved ? km_metric_series_get(moved, lost) : NULL;
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
		*f[i] = km_metrics_family(reg, &d[i]);
}

const km_mirror_families *km_mirror_metric_families(km_mirror *mi)
{
	return &mi->fam;
}

bool km_mirror_source_next(km_mirror *mi, size_t *cursor, km_mirror_source *out)
{
	while (*cursor < mi->npipes)
		if (km_pipeline_source(mi->pipes[(*cursor)++], out))
			return true;
	return false;
}

km_mirror *km_mirror_new(const km_mirror_opts *opts)
{
	km_mirror *mi = calloc(1, sizeof(*mi));

	if (!mi)
		return NULL;
	mi->opts = *opts;
	mi->base = opts->base;
	if (opts->instance && *opts->instance)
		snprintf(mi->instance, sizeof(mi->instance), "%s", opts->instance);
	else if (gethostname(mi->instance, sizeof(mi->instance) - 1) != 0 || !mi->instance[0])
		snprintf(mi->instance, sizeof(mi->instance), "kmirrord");
	mi->opts.instance = mi->instance;
	if (opts->cfg && opts->cfg->http_listen.port)
		snprintf(mi->self, sizeof(mi->self), "%s@%s%s%s:%u", mi->instance,
			 strchr(opts->cfg->http_listen.host, ':') ? "[" : "", opts->cfg->http_listen.host,
			 strchr(opts->cfg->http_listen.host, ':') ? "]" : "", (unsigned)opts->cfg->http_listen.port);
	else
		snprintf(mi->self, sizeof(mi->self), "%s", mi->instance);
	/* Sources are named by the operator: an unresolvable or slow name must not stall the proxy. */
	mi->dns = evdns_base_new(mi->base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE);
	if (!mi->dns)
		KM_WARN("mirror", 0, "no asynchronous name resolution (resolv.conf unreadable?): source names resolve "
			"synchronously");
	if (opts->metrics)
		make_families(mi, opts->metrics);
	mi->run_ev = event_new(mi->base, -1, 0, run_cb, mi);
	mi->rebalance_ev = event_new(mi->base, -1, 0, rebalance_cb, mi);
	mi->sync = km_sync_new(mi);
	mi->lease = km_lease_new(mi);
	if (!mi->run_ev || !mi->rebalance_ev || !mi->sync || !mi->lease) {
		if (mi->run_ev)
			event_free(mi->run_ev);
		if (mi->rebalance_ev)
			event_free(mi->rebalance_ev);
		km_sync_free(mi->sync);
		km_lease_free(mi->lease);
		free(mi);
		return NULL;
	}
	km_lease_on_change(mi->lease, rebalance, releasing, mi);
	if (!(mi->report = km_report_new(mi)))
		KM_WARN("mirror", 0, "out of memory: this kmirrord does not report itself in the state topic");
	return mi;
}

static km_pipeline *pipeline_find(km_mirror *mi, const char *mirror);

/*
 * The ownership term of a mirror here (km_state_owner_check): 0 while this kmirrord does not run
 * it; otherwise one past its pipeline's life, which a retirement moves on, so that a write of a
 * life retired is never made in the next.
 */
static uint64_t owner_term(void *arg, const char *mirror)
{
	km_mirror *mi = arg;
	km_pipeline *pl;

	if (!km_mirror_owns(mi, mirror, true))
		return 0;
	pl = pipeline_find(mi, mirror);
	return pl ? (uint64_t)km_pipeline_life(pl) + 1 : 1;
}

void km_mirror_attach(km_mirror *mi, km_state *st)
{
	/* A store the module leaves (NULL: one that outlives the module) asks it no more. */
	if (mi->st && mi->st != st)
		km_state_owner_check(mi->st, NULL, NULL);
	mi->st = st;
	mi->gaining = false; /* tickets of another store say nothing of this one */
	if (st)
		km_state_owner_check(st, owner_term, mi);
	schedule(mi);
}

void km_mirror_free(km_mirror *mi)
{
	if (!mi)
		return;
	mi->freeing = true;
	km_mirror_topics_shutdown(mi);
	km_sync_free(mi->sync);
	mi->sync = NULL;
	km_lease_free(mi->lease); /* leaves the group: the others take this one's mirrors over at once */
	mi->lease = NULL;
	km_report_free(mi->report);
	mi->report = NULL;
	for (size_t i = 0; i < mi->npipes; i++)
		km_pipeline_free(mi->pipes[i]);
	free(mi->pipes);
	while (mi->head) {
		km_mirror_work *w = mi->head;
		mi->head = w->next;
		work_free(w);
	}
	event_free(mi->run_ev);
	event_free(mi->rebalance_ev);
	if (mi->dns)
		evdns_base_free(mi->dns, 1);
	free(mi);
}

struct km_mprep **km_mirror_prep_list(km_mirror *mi)
{
	return &mi->preps;
}

km_sync *km_mirror_sync(km_mirror *mi)
{
	return mi ? mi->sync : NULL;
}

struct evdns_base *km_mirror_dns(km_mirror *mi)
{
	return mi->dns;
}

struct event_base *km_mirror_base(km_mirror *mi)
{
	return mi->base;
}

km_state *km_mirror_store(km_mirror *mi)
{
	return mi->st;
}

const km_mirror_opts *km_mirror_get_opts(km_mirror *mi)
{
	return &mi->opts;
}

void km_mirror_settle(km_mirror *mi, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
		      km_mp_state to, const char *error)
{
	if (!mi->freeing)
		queue(mi, mirror, topic, partition, from, to, error);
}

static km_pipelines_mode mode(const km_mirror *mi)
{
	return mi->opts.cfg ? (km_pipelines_mode)mi->opts.cfg->mirror_pipelines : KM_PIPELINES_ALL;
}

const char *km_mirror_pipelines_name(km_mirror *mi)
{
	switch (mode(mi)) {
	case KM_PIPELINES_OWNED:
		return "owned";
	case KM_PIPELINES_NONE:
		return "none";
	default:
		return "all";
	}
}

bool km_mirror_owns(km_mirror *mi, const char *mirror, bool pipelines)
{
	if (!mi || mode(mi) == KM_PIPELINES_NONE)
		return false;
	if (pipelines && mode(mi) == KM_PIPELINES_ALL)
		return true;
	return km_lease_owns(mi->lease, mirror);
}

const char *km_mirror_self(km_mirror *mi)
{
	return mi->self;
}

const char *km_mirror_owner(km_mirror *mi, const char *mirror)
{
	switch (mode(mi)) {
	case KM_PIPELINES_ALL:
		return mi->self;
	case KM_PIPELINES_OWNED:
		return km_lease_owns(mi->lease, mirror) ? mi->self : km_lease_owner(mi->lease, mirror);
	default:
		return NULL;
	}
}

static km_pipeline *pipeline_find(km_mirror *mi, const char *mirror)
{
	for (size_t i = 0; i < mi->npipes; i++)
		if (!strcmp(km_pipeline_name(mi->pipes[i]), mirror))
			return mi->pipes[i];
	return NULL;
}

/*
 * The mirror's pipeline, created on first use, or resumed when it was retired (the mirror came
 * back to this kmirrord). Pipelines live until the module is freed (the store's answers may still
 * reach them, and metric series point into them); one whose mirror was deleted just holds nothing.
 */
static km_pipeline *pipeline_of(km_mirror *mi, const char *mirror)
{
	km_pipeline **np, *pl = pipeline_find(mi, mirror);

	if (pl)
		return !km_pipeline_retired_at(pl) || km_pipeline_resume(pl) ? pl : NULL;
	if (!(pl = km_pipeline_new(mi, mirror)))
		return NULL;
	np = realloc(mi->pipes, (mi->npipes + 1) * sizeof(*np));
	if (!np) {
		km_pipeline_free(pl);
		return NULL;
	}
	mi->pipes = np;
	mi->pipes[mi->npipes++] = pl;
	count_owned(mi);
	return pl;
}

/* A committed state: hand the partition to its pipeline, or settle what needs no work. */
static void dispatch(km_mirror *mi, const char *mirror, const char *topic, int32_t partition, km_mp_state state)
{
	km_pipeline *pl;

	if (mi->freeing || !mi->st)
		return;
	switch (state) {
	case KM_MP_PREPARING:
	case KM_MP_MIRRORING:
	case KM_MP_PAUSING:
	case KM_MP_STOPPING:
		if (!km_mirror_owns(mi, mirror, true))
			return; /* another kmirrord runs it (mirror_pipelines) */
		pl = pipeline_find(mi, mirror);
		if (mi->gaining && (!pl || km_pipeline_retired_at(pl)))
			return; /* gained: rebalance starts it once the state read is fresh */
		if (pl && km_pipeline_retired_at(pl) && !mi->regaining && mode(mi) == KM_PIPELINES_OWNED) {
			/*
			 * Lost, and owned again by what the lease says now (a heartbeat answered after it
			 * went stale): it runs again only through rebalance, from a fresh view, never from a
			 * transition read meanwhile (docs/reliability.md, finding 36).
			 */
			event_active(mi->rebalance_ev, EV_TIMEOUT, 0);
			return;
		}
		break;
	default:
		/* PAUSED, STOPPED, FAILED: a pipeline that holds it lets it go. */
		if ((pl = pipeline_find(mi, mirror)))
			km_pipeline_partition(pl, topic, partition, state);
		return;
	}
	pl = pipeline_of(mi, mirror);
	if (!pl) {
		KM_ERROR("mirror", 0, "%s/%s-%d: out of memory starting its pipeline", mirror, topic, (int)partition);
		return;
	}
	km_pipeline_partition(pl, topic, partition, state);
}

/* Every partition of mirror m, handed to dispatch as the store holds it. */
static void dispatch_mirror(km_mirror *mi, const km_state_mirror *m)
{
	km_state_partition_info pi;

	for (size_t j = 0; j < km_state_mirror_topic_count(m); j++) {
		const km_state_topic *t = km_state_mirror_topic_at(m, j);
		for (size_t k = 0; k < km_state_topic_partition_count(t); k++) {
			km_state_topic_partition(t, k, &pi);
			dispatch(mi, km_state_mirror_name(m), km_state_topic_name(t), pi.partition, pi.state);
		}
	}
}

/* kmirror_mirrors_owned: the pipelines that run here now. */
static void count_owned(km_mirror *mi)
{
	int64_t n = 0;
	if (!mi->owned)
		return;
	for (size_t i = 0; i < mi->npipes; i++)
		n += !km_pipeline_retired_at(mi->pipes[i]);
	km_metric_set(mi->owned, n);
}

/* Whether this kmirrord owns a mirror whose pipeline does not run here: one gained. */
static bool gained_any(km_mirror *mi)
{
	for (size_t i = 0; i < km_state_mirror_count(mi->st); i++) {
		const char *name = km_state_mirror_name(km_state_mirror_at(mi->st, i));
		km_pipeline *pl = pipeline_find(mi, name);
		if ((!pl || km_pipeline_retired_at(pl)) && km_mirror_owns(mi, name, true))
			return true;
	}
	return false;
}

/*
 * Mirrors gained start from a view of the state that holds every write their former owner made: a
 * follow round that started after the gain, ended caught up (the former owner's writes were
 * answered before the group gave the mirror on). Reconcile on an older view took the former
 * owner's writer for a foreign one (docs/reliability.md, finding 13). The former owner may be this
 * kmirrord, in an earlier life of the pipeline: its writes asked for before the gain are answered
 * first (dropped, their term gone, or made), so that none lands after reconcile read the writer
 * (finding 37). False: asked again shortly.
 */
static bool fresh_for_gain(km_mirror *mi)
{
	struct timeval tv = {0, 20 * 1000};

	if (!mi->gaining) {
		mi->gaining = true;
		mi->follow_asked = false;
		mi->write_ticket = km_state_write_ticket(mi->st);
		mi->fresh_since = km_mono_ms();
	}
	if (!mi->follow_asked && km_state_write_reached(mi->st, mi->write_ticket)) {
		mi->follow_asked = true;
		mi->fresh_ticket = km_state_follow_ticket(mi->st);
	}
	if (mi->follow_asked && km_state_follow_reached(mi->st, mi->fresh_ticket)) {
		mi->gaining = false;
		return true;
	}
	if (km_mono_ms() - mi->fresh_since > 5000 && mi->fresh_since > 0) {
		if (mi->follow_asked)
			KM_WARN("mirror", 0, "mirrors gained wait for this kmirrord to read the state topic (%s): it has "
				"not read it to its end for 5 s; they start once it has", km_state_topic_name_of_store(mi->st));
		else
			KM_WARN("mirror", 0, "mirrors gained wait for this kmirrord's earlier writes to the state topic "
				"(%s): not answered for 5 s; they start once they are", km_state_topic_name_of_store(mi->st));
		mi->fresh_since = -1; /* said once per gain */
	}
	event_add(mi->rebalance_ev, &tv);
	return false;
}

/*
 * The lease moved (mirror_pipelines = owned): pipelines of mirrors this kmirrord lost are retired
 * at once, so the lease can say they are released; mirrors it gained are handed to their pipeline
 * once the state read here is fresh, each partition reconciling from the persisted state before it
 * fetches.
 */
static void rebalance(void *arg)
{
	km_mirror *mi = arg;

	if (mi->freeing || !mi->st || mode(mi) != KM_PIPELINES_OWNED)
		return;
	for (size_t i = 0; i < mi->npipes; i++)
		if (!km_pipeline_retired_at(mi->pipes[i]) && !km_mirror_owns(mi, km_pipeline_name(mi->pipes[i]), true)) {
			km_pipeline_retire(mi->pipes[i], km_lease_stale(mi->lease)
								 ? "no heartbeat of this kmirrord was answered lately: the "
								   "group may have given the mirror to another one"
								 : "another kmirrord runs it now");
			if (mi->lost)
				km_metric_inc(mi->lost, 1);
		}
	if (!gained_any(mi)) {
		mi->gaining = false;
		count_owned(mi);
		return;
	}
	if (!fresh_for_gain(mi)) {
		count_owned(mi);
		return;
	}
	for (size_t i = 0; i < km_state_mirror_count(mi->st); i++) {
		const km_state_mirror *m = km_state_mirror_at(mi->st, i);
		km_pipeline *pl = pipeline_find(mi, km_state_mirror_name(m));
		if ((!pl || km_pipeline_retired_at(pl)) && km_mirror_owns(mi, km_state_mirror_name(m), true)) {
			mi->regaining = true;
			dispatch_mirror(mi, m);
			mi->regaining = false;
			/* A mirror with nothing to run (every topic stopped or paused) starts no pipeline. */
			if (!(pl = pipeline_find(mi, km_state_mirror_name(m))) || km_pipeline_retired_at(pl))
				continue;
			KM_INFO("mirror", 0, "mirror %s: its pipeline runs in this kmirrord now (group %s)",
				km_state_mirror_name(m), km_lease_group(mi->lease));
			if (mi->gained)
				km_metric_inc(mi->gained, 1);
		}
	}
	count_owned(mi);
}

static void rebalance_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	rebalance(arg);
}

void km_mirror_rebalance_soon(km_mirror *mi)
{
	if (!mi->freeing)
		event_active(mi->rebalance_ev, 0, 0);
}

/* Whether a mirror of state topic partition slot is still being let go of (km_pipeline_releasing). */
static bool releasing(void *arg, int32_t slot)
{
	km_mirror *mi = arg;

	for (size_t i = 0; i < mi->npipes; i++)
		if (km_pipeline_releasing(mi->pipes[i]) && km_lease_slot(mi->lease, km_pipeline_name(mi->pipes[i])) == slot)
			return true;
	return false;
}

void km_mirror_state_ready(void *arg)
{
	km_mirror *mi = arg;

	if (!mi->st)
		return;
	if (mode(mi) != KM_PIPELINES_NONE)
		km_lease_start(mi->lease); /* the state topic's name and partitions are known now */
	for (size_t i = 0; i < km_state_mirror_count(mi->st); i++)
		dispatch_mirror(mi, km_state_mirror_at(mi->st, i));
}

void km_mirror_partition_changed(void *arg, const char *mirror, const char *topic, int32_t partition,
				 km_mp_state from, km_mp_state to)
{
	km_mirror *mi = arg;

	(void)from;
	dispatch(mi, mirror, topic, partition, to);
}
