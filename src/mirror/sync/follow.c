/* The sync cycle's first step: the source's new topics that match the mirror's patterns, started (docs/mirror.md, "Metadata sync"). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "mirror/sync/sync.h"

/* Topics one cycle starts at most; the rest wait for the next cycle. */
#define FOLLOW_MAX 1000

/*
 * A start in flight: the preparation (the destination topics created) and then the store's start.
 * It outlives the cycle when the cycle ends first (its mirror deleted, its sync moved): cy is NULL
 * then and the answers are dropped (the next cycle sees what was done).
 */
struct sy_follow {
	sync_cycle *cy;
	km_mirror *mi;
	char *mirror;
	char **names;
	size_t n;
};

static void follow_free(struct sy_follow *f)
{
	if (f->cy)
		f->cy->follow = NULL;
	km_sy_list_free(f->names, f->n);
	free(f->mirror);
	free(f);
}

/* Each topic refused is the step's error (the first one named, with how many). */
static void note_refused(sync_cycle *cy, const km_state_topic_result *res, size_t n, const char *const *names)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (res[i].code && !bad++)
			first = i;
	if (bad)
		km_sy_step_error(cy, "%zu topic%s matching mirror.topics.include not started; %s: %s", bad,
				 bad == 1 ? "" : "s", names[first],
				 res[first].message ? res[first].message : km_err_message(res[first].code));
}

static void stored(void *arg, const km_state_result *res)
{
	struct sy_follow *f = arg;
	sync_cycle *cy = f->cy;

	if (cy) {
		if (res->code)
			km_sy_step_error(cy, "the store refused the start of %zu topics: %s", f->n,
					 res->message ? res->message : km_err_message(res->code));
		else
			note_refused(cy, res->topics, res->ntopics < f->n ? res->ntopics : f->n, (const char *const *)f->names);
		for (size_t i = 0; !res->code && i < res->ntopics && i < f->n; i++)
			if (!res->topics[i].code) {
				KM_INFO(COMP, 0, "%s: started topic %s (it matches mirror.topics.include)", f->mirror,
					f->names[i]);
				cy->changes++;
			}
		km_sy_follow_done(cy);
	}
	follow_free(f);
}

static void prepared(void *arg, km_err code, const char *message, const km_state_topic_result *res, size_t n)
{
	struct sy_follow *f = arg;
	km_state *st = km_mirror_store(f->mi);
	size_t k = 0;

	if (!f->cy || !st) {
		follow_free(f);
		return;
	}
	if (code) {
		km_sy_step_error(f->cy, "creating the destination topics of %zu new source topics: %s", f->n,
				 message ? message : km_err_message(code));
		km_sy_follow_done(f->cy);
		follow_free(f);
		return;
	}
	note_refused(f->cy, res, n < f->n ? n : f->n, (const char *const *)f->names);
	/* The ones prepared go to the store, in order; the refused ones are freed now. */
	for (size_t i = 0; i < f->n; i++) {
		if (i < n && !res[i].code)
			f->names[k++] = f->names[i];
		else
			free(f->names[i]);
	}
	f->n = k;
	if (!k) {
		km_sy_follow_done(f->cy);
		follow_free(f);
		return;
	}
	km_state_topics_follow(st, f->mirror, (const char *const *)f->names, f->n, stored, f);
}

void km_sy_follow_take(sync_cycle *cy, const km_metadata_response *r)
{
	km_state *st = km_mirror_store(cy->m->s->mi);

	for (int32_t i = 0; st && i < r->topics.count && cy->ncand < FOLLOW_MAX; i++) {
		const km_metadata_response_topic *t = &r->topics.items[i];
		const char *name;
		if (t->error_code || t->is_internal || t->name.len <= 0 || (t->name.len >= 2 && !memcmp(t->name.p, "__", 2)))
			continue;
		/* A topic the store holds, in this mirror (in any state) or another, is not the pattern's. */
		if (km_state_topic_find(st, t->name.p, (size_t)t->name.len))
			continue;
		if (!(name = km_sy_adup(&cy->a, t->name)) || !km_name_filter_match(cy->topics, name))
			continue;
		cy->cand = km_sy_agrow(&cy->a, cy->cand, cy->ncand, &cy->capcand, sizeof(*cy->cand));
		if (!cy->cand)
			return km_sy_step_error(cy, "out of memory");
		cy->cand[cy->ncand++] = name;
	}
	cy->compared = r->topics.count;
}

bool km_sy_follow_start(sync_cycle *cy)
{
	struct sy_follow *f;

	if (!cy->ncand)
		return false;
	if (!(f = calloc(1, sizeof(*f))) || !(f->names = calloc(cy->ncand, sizeof(*f->names))) ||
	    !(f->mirror = strdup(cy->m->mirror))) {
		if (f)
			free(f->names);
		free(f);
		km_sy_step_error(cy, "out of memory");
		return false;
	}
	for (size_t i = 0; i < cy->ncand; i++)
		if ((f->names[f->n] = strdup(cy->cand[i])))
			f->n++;
	f->cy = cy;
	f->mi = cy->m->s->mi;
	cy->follow = f;
	KM_INFO(COMP, 0, "%s: %zu new source topic%s match%s mirror.topics.include (first %s): starting", f->mirror,
		f->n, f->n == 1 ? "" : "s", f->n == 1 ? "es" : "", f->n ? f->names[0] : "?");
	km_mirror_prepare_start(f->mi, f->mirror, (const char *const *)f->names, f->n, false, prepared, f);
	return true;
}

void km_sy_follow_detach(sync_cycle *cy)
{
	if (cy->follow)
		cy->follow->cy = NULL;
	cy->follow = NULL;
}
