/* The mirror driver: completes the state transitions an operator starts, until pipelines do it (kmirror/mirror.h). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "kmirror/mirror.h"

/* Transitions in flight at once: the store runs mutations one by one and bounds its queue. */
#define KM_MIRROR_DRIVER_INFLIGHT 32

typedef struct km_mirror_work {
	struct km_mirror_work *next;
	km_mirror *mi;
	int32_t partition;
	km_mp_state from, to;
	char *mirror, *topic;
} km_mirror_work;

struct km_mirror {
	struct event_base *base;
	km_state *st;
	struct event *run_ev;
	km_mirror_work *head, *tail;
	size_t inflight;
	bool freeing;
};

/* The state a transient state settles in when no pipeline has to do anything first. */
static km_mp_state settle(km_mp_state s)
{
	switch (s) {
	case KM_MP_PREPARING:
		return KM_MP_MIRRORING;
	case KM_MP_PAUSING:
		return KM_MP_PAUSED;
	case KM_MP_STOPPING:
		return KM_MP_STOPPED;
	default:
		return KM_MP_UNKNOWN;
	}
}

static void work_free(km_mirror_work *w)
{
	free(w->mirror);
	free(w->topic);
	free(w);
}

static void schedule(km_mirror *mi)
{
	if (mi->head && mi->inflight < KM_MIRROR_DRIVER_INFLIGHT && !mi->freeing)
		event_active(mi->run_ev, 0, 0);
}

static void queue(km_mirror *mi, const char *mirror, const char *topic, int32_t partition, km_mp_state from)
{
	km_mirror_work *w = calloc(1, sizeof(*w));

	if (!w || !(w->mirror = strdup(mirror)) || !(w->topic = strdup(topic))) {
		KM_ERROR("mirror", 0, "%s/%s-%d: out of memory queueing its %s -> %s transition", mirror, topic,
			     (int)partition, km_mp_state_name(from), km_mp_state_name(settle(from)));
		if (w)
			work_free(w);
		return;
	}
	w->mi = mi;
	w->partition = partition;
	w->from = from;
	w->to = settle(from);
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
	for (size_t i = 0; i < km_state_topic_partition_count(t); i++) {
		km_state_topic_partition(t, i, &pi);
		if (pi.partition == w->partition)
			return pi.state;
	}
	return KM_MP_UNKNOWN;
}

static void transition_done(void *arg, const km_state_result *res)
{
	km_mirror_work *w = arg;
	km_mirror *mi = w->mi;

	mi->inflight--;
	if (res->code != KM_OK)
		/* The store keeps the partition where it was; the next start-up picks it up again. */
		KM_WARN("mirror", 0, "%s/%s-%d: could not move %s -> %s: %s: %s", w->mirror, w->topic,
			    (int)w->partition, km_mp_state_name(w->from), km_mp_state_name(w->to),
			    km_err_name(res->code), res->message ? res->message : "");
	work_free(w);
	schedule(mi);
}

static void run_cb(evutil_socket_t fd, short what, void *arg)
{
	km_mirror *mi = arg;

	(void)fd;
	(void)what;
	while (mi->head && mi->inflight < KM_MIRROR_DRIVER_INFLIGHT) {
		km_mirror_work *w = mi->head;

		mi->head = w->next;
		if (!mi->head)
			mi->tail = NULL;
		w->next = NULL;
		if (!mi->st || current(mi->st, w) != w->from) {
			work_free(w); /* moved on meanwhile (stopped while preparing, ...): nothing to settle */
			continue;
		}
		mi->inflight++;
		km_state_partition_set(mi->st, w->mirror, w->topic, w->partition, w->to, NULL, transition_done, w);
	}
}

km_mirror *km_mirror_new(struct event_base *base)
{
	km_mirror *mi = calloc(1, sizeof(*mi));

	if (!mi)
		return NULL;
	mi->base = base;
	mi->run_ev = event_new(base, -1, 0, run_cb, mi);
	if (!mi->run_ev) {
		free(mi);
		return NULL;
	}
	return mi;
}

void km_mirror_attach(km_mirror *mi, km_state *st)
{
	mi->st = st;
	schedule(mi);
}

void km_mirror_free(km_mirror *mi)
{
	if (!mi)
		return;
	mi->freeing = true;
	while (mi->head) {
		km_mirror_work *w = mi->head;
		mi->head = w->next;
		work_free(w);
	}
	event_free(mi->run_ev);
	free(mi);
}

void km_mirror_state_ready(void *arg)
{
	km_mirror *mi = arg;
	km_state_partition_info pi;

	if (!mi->st)
		return;
	for (size_t i = 0; i < km_state_mirror_count(mi->st); i++) {
		const km_state_mirror *m = km_state_mirror_at(mi->st, i);
		for (size_t j = 0; j < km_state_mirror_topic_count(m); j++) {
			const km_state_topic *t = km_state_mirror_topic_at(m, j);
			for (size_t k = 0; k < km_state_topic_partition_count(t); k++) {
				km_state_topic_partition(t, k, &pi);
				if (settle(pi.state) != KM_MP_UNKNOWN)
					queue(mi, km_state_mirror_name(m), km_state_topic_name(t), pi.partition, pi.state);
			}
		}
	}
}

void km_mirror_partition_changed(void *arg, const char *mirror, const char *topic, int32_t partition,
				 km_mp_state from, km_mp_state to)
{
	km_mirror *mi = arg;

	(void)from;
	if (settle(to) != KM_MP_UNKNOWN)
		queue(mi, mirror, topic, partition, to);
}
