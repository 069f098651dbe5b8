/* Metadata sync, the module: one sync per mirror, a tick that starts the cycles due, the status describe shows. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "mirror/sync/sync.h"

const char *km_sync_kind_name(km_sync_kind k)
{
	static const char *const names[KM_SYNC__COUNT] = {"topics", "configs", "partitions", "groups", "acls"};
	return (unsigned)k < KM_SYNC__COUNT ? names[k] : "?";
}

static void stat_series(km_sync *s, msync *m)
{
	for (int k = 0; k < KM_SYNC__COUNT; k++) {
		const char *ok[] = {m->mirror, km_sync_kind_name(k), "ok"}, *bad[] = {m->mirror, km_sync_kind_name(k), "error"};
		const char *two[] = {m->mirror, km_sync_kind_name(k)};
		m->st[k] = (sstat){.last_sync_ms = -1, .last_error_ms = -1};
		if (s->f_runs) {
			m->st[k].m_runs_ok = km_metric_series_get(s->f_runs, ok);
			m->st[k].m_runs_err = km_metric_series_get(s->f_runs, bad);
			m->st[k].m_changes = km_metric_series_get(s->f_changes, two);
			m->st[k].m_last = km_metric_series_get(s->f_last, two);
		}
	}
	if (s->f_skipped) {
		const char *one[] = {m->mirror};
		m->m_skipped = km_metric_series_get(s->f_skipped, one);
	}
}

/*
 * The steps' "last success" gauges are shown while this kmirrord runs the mirror's sync and once a
 * step succeeded here (step_end shows it): no 0 from an instance that does not run it, or from a
 * mirror with nothing to sync (its topics all stopped), for an alert to take as a sync failing.
 */
static void last_hide(msync *m)
{
	for (int k = 0; k < KM_SYNC__COUNT; k++)
		if (m->st[k].m_last)
			km_metric_series_show(m->st[k].m_last, false);
}

static msync *find(km_sync *s, const char *mirror)
{
	for (msync *m = s ? s->head : NULL; m; m = m->next)
		if (!strcmp(m->mirror, mirror))
			return m;
	return NULL;
}

static void msync_free(msync *m)
{
	if (m->cy)
		km_sy_cycle_free(m->cy);
	for (int k = 0; k < KM_SYNC__COUNT; k++)
		free(m->st[k].last_error);
	km_sy_list_free(m->warned, m->nwarned);
	km_sy_list_free(m->skipping, m->nskipping);
	free(m->mirror);
	free(m);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	km_sync *s = arg;
	km_state *st = km_mirror_store(s->mi);
	int64_t now = km_wall_ms();
	struct timeval tv = {TICK_MS / 1000, (TICK_MS % 1000) * 1000};

	(void)fd;
	(void)what;
	if (s->freeing)
		return;
	if (st && km_state_ready(st)) {
		for (msync *m = s->head; m; m = m->next)
			m->seen = false;
		for (size_t i = 0; i < km_state_mirror_count(st); i++) {
			const km_state_mirror *sm = km_state_mirror_at(st, i);
			msync *m = find(s, km_state_mirror_name(sm));
			km_mirror_options mo;
			if (!m) {
				if (!(m = calloc(1, sizeof(*m))) || !(m->mirror = strdup(km_state_mirror_name(sm)))) {
					free(m);
					continue;
				}
				m->s = s;
				stat_series(s, m);
				last_hide(m);
				m->next = s->head;
				s->head = m;
			}
			m->seen = true;
			if (m->owner != km_mirror_owns(s->mi, m->mirror, false)) {
				m->owner = !m->owner;
				KM_INFO(COMP, 0, "%s: metadata sync %s", m->mirror,
					m->owner ? "runs in this kmirrord now" : "moved to another kmirrord");
				if (m->cy && !m->owner) {
					km_sy_cycle_free(m->cy);
					m->cy = NULL;
				}
				if (!m->owner)
					last_hide(m);
				m->next_ms = 0;
			}
			if (m->cy || now < m->next_ms || !m->owner)
				continue;
			if (km_state_mirror_options(sm, &mo) != KM_OK)
				continue;
			if (km_sy_cycle_start(m, sm, &mo))
				m->next_ms = now + mo.metadata_refresh_interval_ms;
			else
				last_hide(m); /* nothing to sync */
			km_opt_free(km_state_mirror_option_table(), &mo);
		}
		/* Mirrors deleted: their sync goes (a cycle in progress ends). */
		for (msync **pp = &s->head; *pp;) {
			msync *m = *pp;
			if (m->seen) {
				pp = &m->next;
				continue;
			}
			*pp = m->next;
			msync_free(m);
		}
	}
	event_add(s->tick, &tv);
}

km_sync *km_sync_new(km_mirror *mi)
{
	km_sync *s = calloc(1, sizeof(*s));
	const km_mirror_opts *o = km_mirror_get_opts(mi);
	struct timeval tv = {0, 0};

	if (!s)
		return NULL;
	s->mi = mi;
	if (o->metrics) {
		const km_metric_desc d[] = {
			{.name = "kmirror_mirror_sync_runs_total",
			 .help = "Metadata sync steps run, per mirror and kind (topics, configs, partitions, groups, acls), by result.",
			 .type = KM_METRIC_COUNTER, .labels = {"mirror", "kind", "result", NULL}},
			{.name = "kmirror_mirror_sync_changes_total",
			 .help = "Changes the metadata sync made on the destination: configs set or removed, partitions "
				 "added, committed offsets copied, ACLs created or deleted.",
			 .type = KM_METRIC_COUNTER, .labels = {"mirror", "kind", NULL}},
			{.name = "kmirror_mirror_sync_last_success_timestamp_seconds",
			 .help = "When the metadata sync step last completed without an error (seconds since the epoch).",
			 .type = KM_METRIC_GAUGE, .labels = {"mirror", "kind", NULL}},
			{.name = "kmirror_mirror_sync_groups_skipped",
			 .help = "Consumer groups the last sync skipped: they have members on the destination.",
			 .type = KM_METRIC_GAUGE, .labels = {"mirror", NULL}},
		};
		km_metric_family **f[] = {&s->f_runs, &s->f_changes, &s->f_last, &s->f_skipped};
		for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
			*f[i] = km_metrics_family(o->metrics, &d[i]);
	}
	s->tick = event_new(km_mirror_base(mi), -1, 0, on_tick, s);
	if (!s->tick) {
		free(s);
		return NULL;
	}
	event_add(s->tick, &tv);
	return s;
}

void km_sync_free(km_sync *s)
{
	if (!s)
		return;
	s->freeing = true;
	while (s->head) {
		msync *m = s->head;
		s->head = m->next;
		msync_free(m);
	}
	event_free(s->tick);
	free(s);
}

bool km_mirror_sync_status(km_mirror *mi, const char *mirror, km_sync_kind kind, km_sync_status *out, bool *owner)
{
	msync *m = mirror && (unsigned)kind < KM_SYNC__COUNT ? find(km_mirror_sync(mi), mirror) : NULL;

	*out = (km_sync_status){.last_sync_ms = -1, .last_error_ms = -1};
	if (owner)
		*owner = m && m->owner;
	if (!m)
		return false;
	const sstat *st = &m->st[kind];
	*out = (km_sync_status){st->last_sync_ms, st->compared, st->changes_last, st->changes_total, st->skipped,
				st->errors_total, st->last_error, st->last_error_ms};
	return true;
}
