/*
 * kmirror mirror module: what moves mirrored partitions through their states. Today that is the
 * driver that completes the transitions an operator starts (there are no fetch pipelines yet):
 * PREPARING -> MIRRORING, PAUSING -> PAUSED, STOPPING -> STOPPED, each persisted by the state
 * store like every change. The data plane replaces the first with its reconcile and the others
 * with stopping its pipelines (docs/mirror.md).
 */
#ifndef KMIRROR_MIRROR_H
#define KMIRROR_MIRROR_H

#include <stdint.h>

#include <event2/event.h>

#include "kmirror/state.h"

typedef struct km_mirror km_mirror;

km_mirror *km_mirror_new(struct event_base *base);
/* The store whose partitions this module drives (set once, right after km_state_new). */
void km_mirror_attach(km_mirror *mi, km_state *st);
/* After the store is freed (the store may still call back while it is freed). */
void km_mirror_free(km_mirror *mi);

/*
 * The state store's callbacks (km_state_opts.on_ready and .on_partition, with arg the km_mirror):
 * on_ready picks up partitions left in a transient state by a previous run; on_partition reacts
 * to each committed change. Both only queue work: it runs on a later loop iteration.
 */
void km_mirror_state_ready(void *arg);
void km_mirror_partition_changed(void *arg, const char *mirror, const char *topic, int32_t partition,
				 km_mp_state from, km_mp_state to);

#endif
