/* Internals of the mirror module: the driver (transitions), the connections of a mirror, and the pipelines. */
#ifndef KMIRROR_MIRROR_INT_H
#define KMIRROR_MIRROR_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kmirror/clock.h"
#include "kmirror/cluster.h"
#include "kmirror/mirror.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/net.h"
#include "kmirror/options.h"
#include "kmirror/rpc.h"

#define KM_MIRROR_COMP "mirror"

/* ---- the connections of a mirror (conn.c) ---- */

/*
 * The mirror's source cluster from its configuration: bootstrap.servers, security.protocol,
 * ssl.* (a TLS context returned in *tls_out, the caller frees it after the cluster), sasl.*
 * (sasl.username / sasl.password, or a JAAS line), client.id (default
 * kmirrord/<instance>/<mirror>/<purpose>). NULL with why set when the configuration is unusable.
 */
km_cluster *km_mirror_source_cluster(km_mirror *mi, const km_state_mirror *m, const char *purpose,
				     int64_t max_frame, SSL_CTX **tls_out, void (*on_change)(void *arg), void *arg,
				     char *why, size_t whylen);
/* The destination as kmirrord's own client (the upstream settings), client.id kmirrord/<instance>/<mirror>/<purpose>. */
km_cluster *km_mirror_dest_cluster(km_mirror *mi, const char *mirror, const char *purpose,
				   void (*on_change)(void *arg), void *arg);

/* ---- the driver's services for the pipelines ---- */


struct event_base *km_mirror_base(km_mirror *mi);
/* Asynchronous name resolution for the mirrors' clients (NULL: synchronous). */
struct evdns_base *km_mirror_dns(km_mirror *mi);
km_state *km_mirror_store(km_mirror *mi);
const km_mirror_opts *km_mirror_get_opts(km_mirror *mi);
/*
 * The work a transient state stands for is done: persist from -> to for the partition (batched with
 * others of the same topic). error: for FAILED, the reason.
 */
void km_mirror_settle(km_mirror *mi, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
		      km_mp_state to, const char *error);

/* ---- destination topics (topics.c) ---- */

struct km_mprep;
/* The head of the mirror's list of preparations and growths in progress (topics.c keeps it). */
struct km_mprep **km_mirror_prep_list(km_mirror *mi);
/* Answer every preparation in progress (shutting down) and free them all. */
void km_mirror_topics_shutdown(km_mirror *mi);

/* The per-partition metric families (NULL without a registry): series by pointer into each partition. */
typedef struct km_mirror_families {
	km_metric_family *records, *bytes, *batches, *lag, *lag_ms, *skipped, *errors;
	km_metric_family *fetches; /* per mirror: {mirror, kind} */
	km_metric_family *ahead;   /* per mirror: partitions fetched while writing */
	km_metric_family *produces; /* per mirror: {mirror, lane} */
	km_metric_family *fenced;  /* per mirror: batches refused for an older epoch of its writer */
	km_metric_family *reachable, *fetched_at; /* per mirror: its source as the pipeline last saw it */
} km_mirror_families;
const km_mirror_families *km_mirror_metric_families(km_mirror *mi);

/* ---- metadata sync (sync/) ---- */

typedef struct km_sync km_sync;
km_sync *km_sync_new(km_mirror *mi);
/* Ends every cycle in progress (their requests fail quietly) and frees the module's sync state. */
void km_sync_free(km_sync *s);
/* The module's sync (driver.c holds it). */
km_sync *km_mirror_sync(km_mirror *mi);

/* ---- which kmirrord syncs which mirror (lease.c) ---- */

/*
 * The destination's consumer group whose members are the kmirrords in front of it, by default
 * (mirror_sync_group), and the tag of the lease's client id. Neither it nor its generations are
 * ever synced.
 */
#define KM_SYNC_GROUP "__kmirror-sync"
typedef struct km_lease km_lease;
/* The group the lease joins now: mirror_sync_group or the generation __mirror_state names. */
const char *km_lease_group(const km_lease *l);
/* Whether name is a sync group of kmirrords (the default's or mirror_sync_group's, or a generation): never synced. */
bool km_mirror_is_sync_group(km_mirror *mi, const char *name);
km_lease *km_lease_new(km_mirror *mi);
/* Join the group (once the state is loaded: the state topic's name and partitions are known). */
void km_lease_start(km_lease *l);
/* Leaves the group (a heartbeat with epoch -1, not waited for) and frees. */
void km_lease_free(km_lease *l);
/* Whether this kmirrord runs mirror now: it owns the mirror's state topic partition, or it is alone. */
bool km_lease_owns(const km_lease *l, const char *mirror);
/*
 * changed(arg) runs whenever the owned set moves (an assignment, a fence, a lost session, alone);
 * a partition revoked stays reported as owned (the group gives it to nobody else) while
 * busy(arg, slot) says its mirrors are still being let go of.
 */
void km_lease_on_change(km_lease *l, void (*changed)(void *arg), bool (*busy)(void *arg, int32_t slot), void *arg);
/* No heartbeat answered for one and a half intervals: it owns nothing until the next answer. */
bool km_lease_stale(const km_lease *l);
/* The state topic partition whose owner runs mirror (-1: not known yet). */
int32_t km_lease_slot(const km_lease *l, const char *mirror);
/*
 * Whether this kmirrord runs mirror's metadata sync and (mirror_pipelines = owned) its pipelines:
 * the lease's answer, every mirror with mirror_pipelines = all (the lease still decides the sync),
 * none with mirror_pipelines = none (driver.c).
 */
bool km_mirror_owns(km_mirror *mi, const char *mirror, bool pipelines);
/* Who owns the state partition of mirror, as the group's last description says (NULL: not known). */
const char *km_lease_owner(const km_lease *l, const char *mirror);
/* The driver looks at which mirrors it owns on the next loop iteration (a pipeline found it lost its own). */
void km_mirror_rebalance_soon(km_mirror *mi);
/* mirror_pipelines as configured: "all", "owned" or "none". */
const char *km_mirror_pipelines_name(km_mirror *mi);

/* ---- this kmirrord's own record in __mirror_state (report.c) ---- */

typedef struct km_report km_report;
/* Writes the record every KM_STATE_INSTANCE_REPORT_MS while the store is ready (the first about a second after the load). */
km_report *km_report_new(km_mirror *mi);
void km_report_free(km_report *r);

/* ---- transactional producers on the destination (txn.c) ---- */

/*
 * One transactional id on the destination, carrying one source transaction of one partition at a
 * time (docs/mirror.md, "Transactions"). Its requests go out from km_txp_poll, which the owner
 * calls from its tick; on_change(arg) fires (on a later loop iteration at the earliest) whenever
 * the state moves.
 */
typedef struct km_txp km_txp;
typedef enum {
	KM_TXP_INIT,   /* FindCoordinator, InitProducerId (which aborts what an earlier owner left open) */
	KM_TXP_FREE,   /* a producer id and epoch, no transaction */
	KM_TXP_ADDING, /* AddPartitionsToTxn of its partition */
	KM_TXP_OPEN,   /* in a transaction on its partition: its batches may be produced */
	KM_TXP_ENDING, /* EndTxn sent; FREE once the coordinator took it (the markers follow) */
	KM_TXP_FAILED, /* a refusal that retrying does not cure: km_txp_error says which */
} km_txp_state;

/* A producer of topic/partition's transactions (its only partition: its sequences are that partition's). */
km_txp *km_txp_new(km_cluster *dst, const char *transactional_id, const char *topic, int32_t partition,
		   void (*on_change)(void *arg), void *arg);
void km_txp_free(km_txp *t);
/* Send what the state asks for when nothing is in flight; returns when (ms) it wants to be polled again. */
int64_t km_txp_poll(km_txp *t, int64_t now);
km_txp_state km_txp_state_of(const km_txp *t);
const char *km_txp_error(const km_txp *t);
const char *km_txp_id(const km_txp *t);
int64_t km_txp_pid(const km_txp *t);
int16_t km_txp_epoch(const km_txp *t);
/* The next base sequence on its partition, and moving it on by count records. */
int32_t km_txp_seq(const km_txp *t);
void km_txp_advance(km_txp *t, int32_t count);
/* FREE -> ADDING -> OPEN: a transaction on its partition. */
void km_txp_begin(km_txp *t);
/* OPEN -> ENDING -> FREE. */
void km_txp_end(km_txp *t, bool commit);
/* Any state -> INIT: InitProducerId again (the epoch moves on, what is open is aborted, sequences restart). */
void km_txp_fence(km_txp *t);
/* The state names, for messages. */
const char *km_txp_state_name(km_txp_state s);

/* ---- pipelines: one per mirror with partitions to run (pipeline/, docs/mirror.md "The pipeline") ---- */

typedef struct km_pipeline km_pipeline;

km_pipeline *km_pipeline_new(km_mirror *mi, const char *mirror);
void km_pipeline_free(km_pipeline *pl);
/*
 * Another kmirrord runs the mirror now: the pipeline lets its partitions go (connections closed,
 * batches and transactional producers dropped, tails cleared) and keeps only its names and
 * metric series, for km_pipeline_resume when the mirror comes back (docs/mirror.md, "One kmirrord
 * per mirror").
 */
void km_pipeline_retire(km_pipeline *pl, const char *why);
/* A retired pipeline runs again (its partitions are handed to it again, each reconciles first); false: no memory. */
bool km_pipeline_resume(km_pipeline *pl);
/*
 * A retired pipeline whose store writes are not all answered yet, for at most
 * KM_MIRROR_RELEASE_WAIT_MS after its retire: its mirror's handover waits for them.
 */
bool km_pipeline_releasing(const km_pipeline *pl);
/* When it was retired (ms); 0: it runs. */
int64_t km_pipeline_retired_at(const km_pipeline *pl);
/* Its life: moved on by each retirement (the ownership term's, km_state_owner_check). */
uint32_t km_pipeline_life(const km_pipeline *pl);
const char *km_pipeline_name(const km_pipeline *pl);
/* The committed state of one of the mirror's partitions changed (or is known after start-up). */
void km_pipeline_partition(km_pipeline *pl, const char *topic, int32_t partition, km_mp_state state);
/* Partitions the pipeline holds (running, or draining for a pause or a stop). */
size_t km_pipeline_count(const km_pipeline *pl);
/* Its source as the pipeline last saw it: false when it is retired or has not contacted the source yet. */
bool km_pipeline_source(const km_pipeline *pl, km_mirror_source *out);

#endif
