/*
 * kmirror mirror module: the data plane (docs/mirror.md). Per mirror a pipeline fetches record
 * batches from the source and writes the same batches into the destination as the mirror's own
 * producer, keeping each partition's offset map in the state store; the driver completes the
 * transitions an operator starts once the pipeline has done their work: PREPARING -> MIRRORING
 * after reconcile, PAUSING -> PAUSED and STOPPING -> STOPPED once the partition's writes drained,
 * each persisted by the state store like every change.
 */
#ifndef KMIRROR_MIRROR_H
#define KMIRROR_MIRROR_H

#include <stdint.h>

#include <event2/event.h>

#include "kmirror/daemon_config.h"
#include "kmirror/metrics.h"
#include "kmirror/state.h"

typedef struct km_mirror km_mirror;

typedef struct km_mirror_opts {
	struct event_base *base;
	/* The destination: cfg->upstream (bootstrap), its SASL settings, and tls (NULL: plaintext). */
	const km_config *cfg;
	SSL_CTX *tls;
	km_metrics *metrics; /* NULL: none */
	const char *instance; /* names this kmirrord in client ids and producer ids; NULL: the host name */
} km_mirror_opts;

/* opts and what it points to must outlive the module. */
km_mirror *km_mirror_new(const km_mirror_opts *opts);
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
