/* This kmirrord's own record in __mirror_state: who it is, what it runs, how far behind the state it is (docs/state.md, "Instances"). */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/log.h"
#include "kmirror/state.h"
#include "kmirror/version.h"
#include "mirror/mirror_int.h"

#define FIRST_MS 1000 /* after the load: the first record, and the retry while the store is not ready */

#define ALONE_WARN_MS (10 * 60 * 1000) /* how often a kmirrord running every mirror beside another says so */

struct km_report {
	km_mirror *mi;
	struct event *ev;
	int64_t start_ms;
	int64_t warned_ms; /* when check_alone last warned; 0: not yet */
	bool *inflight; /* shared with the write's answer, which may come after the report is freed */
};

static void arm(km_report *r, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	evtimer_add(r->ev, &tv);
}

static void written(void *arg, const km_state_result *res)
{
	bool *inflight = arg;
	if (res->code != KM_OK)
		KM_DEBUG("mirror", 0, "this kmirrord's record in the state topic was not written: %s",
			 res->message ? res->message : km_err_name(res->code));
	if (!inflight[1]) {
		inflight[0] = false;
		return;
	}
	free(inflight); /* the report is gone */
}

/*
 * mirror_pipelines = all is for a kmirrord alone in front of the destination. Another instance that
 * reported in the last three report intervals and runs pipelines (all, or owned) writes the same
 * mirrors: two writers of one partition fence each other, hide each other's batches, and a reader
 * through either may be shown a view the other then changes. Said at once and every 10 minutes
 * while it lasts (docs/mirror.md, "One kmirrord per mirror").
 */
static void check_alone(km_report *r, km_state *st, int64_t now)
{
	const km_state_instance *in;
	size_t n;

	if (strcmp(km_mirror_pipelines_name(r->mi), "all") != 0 || (r->warned_ms && now - r->warned_ms < ALONE_WARN_MS))
		return;
	in = km_state_instances(st, &n);
	for (size_t i = 0; i < n; i++) {
		if (!in[i].id || !strcmp(in[i].id, km_mirror_self(r->mi)) || !in[i].pipelines ||
		    !strcmp(in[i].pipelines, "none") || now - in[i].report_ms > 3 * KM_STATE_INSTANCE_REPORT_MS)
			continue;
		KM_WARN("mirror", 0, "this kmirrord runs every mirror (mirror_pipelines = all) while kmirrord %s "
			"(mirror_pipelines = %s, reported %.0f s ago) runs mirrors too, in front of the same state topic: "
			"both write the same partitions and hide each other's batches. With several kmirrords set "
			"mirror_pipelines = owned on every one (docs/mirror.md, \"One kmirrord per mirror\")",
			in[i].id, in[i].pipelines, (double)(now - in[i].report_ms) / 1000.0);
		r->warned_ms = now;
		return;
	}
}

static void report(evutil_socket_t fd, short what, void *arg)
{
	km_report *r = arg;
	km_state *st = km_mirror_store(r->mi);
	km_state_instance in;
	size_t n = st ? km_state_mirror_count(st) : 0;

	(void)fd;
	(void)what;
	if (!st || !km_state_ready(st)) {
		arm(r, FIRST_MS);
		return;
	}
	arm(r, KM_STATE_INSTANCE_REPORT_MS);
	if (r->inflight[0])
		return;
	memset(&in, 0, sizeof(in));
	in.id = (char *)km_mirror_self(r->mi);
	in.report_ms = km_wall_ms();
	in.start_ms = r->start_ms;
	in.state_delay_ms = km_state_follow_delay_ms(st);
	in.pipelines = (char *)km_mirror_pipelines_name(r->mi);
	in.version = (char *)KM_VERSION;
	if (n && !(in.owned = calloc(n, sizeof(*in.owned))))
		return;
	for (size_t i = 0; i < n; i++) {
		const char *name = km_state_mirror_name(km_state_mirror_at(st, i));
		if (km_mirror_owns(r->mi, name, true))
			in.owned[in.nowned++] = (char *)name;
	}
	r->inflight[0] = true;
	km_state_instance_write(st, &in, written, r->inflight);
	free(in.owned); /* the store encoded it */
	check_alone(r, st, in.report_ms);
}

km_report *km_report_new(km_mirror *mi)
{
	km_report *r = calloc(1, sizeof(*r));
	if (!r || !(r->inflight = calloc(2, sizeof(*r->inflight))) ||
	    !(r->ev = evtimer_new(km_mirror_base(mi), report, r))) {
		if (r)
			free(r->inflight);
		free(r);
		return NULL;
	}
	r->mi = mi;
	r->start_ms = km_wall_ms();
	arm(r, FIRST_MS);
	return r;
}

void km_report_free(km_report *r)
{
	if (!r)
		return;
	event_free(r->ev);
	if (r->inflight[0])
		r->inflight[1] = true; /* its answer frees it */
	else
		free(r->inflight);
	free(r);
}
