/* Metadata sync: topic configs, partitions, consumer group offsets and ACLs follow the source (docs/mirror.md, "Metadata sync"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/log.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* One step's status, owned here (km_sync_status is its read view). */
typedef struct sstat {
	int64_t last_sync_ms, compared, changes_last, changes_total, skipped, errors_total, last_error_ms;
	char *last_error;
} sstat;

/* One mirror's sync. */
typedef struct msync {
	struct msync *next;
	char *mirror;
	sstat st[KM_SYNC__COUNT];
	bool owner;
} msync;

struct km_sync {
	km_mirror *mi;
	msync *head;
};

const char *km_sync_kind_name(km_sync_kind k)
{
	static const char *const names[KM_SYNC__COUNT] = {"configs", "partitions", "groups", "acls"};
	return (unsigned)k < KM_SYNC__COUNT ? names[k] : "?";
}

km_sync *km_sync_new(km_mirror *mi)
{
	km_sync *s = calloc(1, sizeof(*s));
	if (s)
		s->mi = mi;
	return s;
}

void km_sync_free(km_sync *s)
{
	if (!s)
		return;
	while (s->head) {
		msync *m = s->head;
		s->head = m->next;
		for (int k = 0; k < KM_SYNC__COUNT; k++)
			free(m->st[k].last_error);
		free(m->mirror);
		free(m);
	}
	free(s);
}

static msync *find(km_sync *s, const char *mirror)
{
	for (msync *m = s ? s->head : NULL; m; m = m->next)
		if (!strcmp(m->mirror, mirror))
			return m;
	return NULL;
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
