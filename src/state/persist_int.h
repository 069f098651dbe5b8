/* Internals of __mirror_state's persistence (docs/state.md): the persister, its brokers, its requests. */
#ifndef KMIRROR_STATE_PERSIST_INT_H
#define KMIRROR_STATE_PERSIST_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/clock.h"
#include "kmirror/cluster.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/net.h"
#include "kmirror/rpc.h"
#include "state/state_int.h"

#define COMP "state"

#define FETCH_BYTES (8 << 20)
#define SCRATCH_BYTES (64 << 20)  /* a compressed state batch decompressed */
#define WRITE_ATTEMPTS 6
#define META_ATTEMPTS 20
#define META_UNKNOWN_WAIT_MS 5000 /* a topic just created: how long it may stay unknown to the broker asked */
#define META_UNKNOWN_RETRY_MS 200
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 10000

enum {
	K_ERR_OFFSET_OUT_OF_RANGE = 1,
	K_ERR_NOT_LEADER = 6,
	K_ERR_TIMED_OUT = 7,
	K_ERR_LEADER_NOT_AVAILABLE = 5,
	K_ERR_NOT_ENOUGH_REPLICAS = 19,
	K_ERR_NOT_ENOUGH_REPLICAS_AFTER = 20,
	K_ERR_TOPIC_EXISTS = 36,
	K_ERR_DUPLICATE_SEQ = 46,
	K_ERR_NOT_CONTROLLER = 41,
	K_ERR_COORD_NOT_AVAILABLE = 15,
	K_ERR_COORD_LOADING = 14,
	K_ERR_NOT_COORD = 16,
	K_ERR_UNKNOWN_TOPIC = 3,
	K_ERR_FENCED_LEADER_EPOCH = 74,
	K_ERR_UNKNOWN_LEADER_EPOCH = 75,
	K_ERR_OFFSET_NOT_AVAILABLE = 78,
};

/* One key's latest value while loading (key bytes -> value bytes or tombstone). */
typedef struct load_entry {
	uint8_t *key, *val;
	size_t klen, vlen;
	bool tomb;
	uint32_t hash;
	struct load_entry *next;
} load_entry;

typedef enum { PH_IDLE, PH_LOAD, PH_WRITE, PH_META, PH_FOLLOW } phase;

struct km_state_persist {
	km_state *st;
	bool closing;
	uint64_t gen;              /* bumps when an operation restarts: late answers of the old one are dropped */
	km_cluster *cl;            /* the destination: bootstrap, the brokers the metadata names, a client each */
	bool exists;
	int32_t nparts;
	int32_t *leaders;
	int64_t pid;
	int16_t epoch;
	int32_t *seq;
	struct event *timer;
	void (*timer_fn)(km_state_persist *io);
	/* a step waiting for its client's ApiVersions (the versions it encodes with) */
	km_net_client *wait_c;
	int32_t wait_id;           /* the broker wait_c is the client of (KM_PS_ANY: any broker) */
	void (*wait_fn)(km_state_persist *io);
	/*
	 * The waited client of broker down_id failed: the step resumed for it in generation down_gen
	 * gets no client for that broker (its send fails and its error path backs off), rather than a
	 * new connection at once (the cluster reconnects a failed broker on the next ask).
	 */
	bool down;
	int32_t down_id;
	uint64_t down_gen;
	int16_t used[7];           /* the last version sent of each key of versions[] (-1: none yet) */
	int64_t lts;               /* the ListOffsets timestamp being asked (-2 earliest, -1 latest) */
	int backoff_ms;
	phase ph;
	bool load_wanted;          /* a reload was asked while a write finished */
	/* load */
	int32_t lpart;
	int64_t lo, hi, next;
	int empty_fetches;
	load_entry **map;
	size_t mapn, mapcount;
	uint8_t *scratch;
	size_t nrecords;
	size_t stale_kept;         /* runner's records not taken: written under an earlier partition record */
	int64_t load_start_ms;     /* km_mono_ms at the load's start */
	/* write */
	const km_state_rec *recs;
	size_t nrecs;
	km_state_write_cb wcb;
	int attempts;
	int32_t *rpart;            /* partition of each record */
	int32_t layout_parts;      /* nparts when rpart/pdone were computed */
	bool *pdone;               /* per state partition: acknowledged (or not part of the write) */
	int32_t *pcount;           /* records per partition */
	size_t outstanding;
	bool wfail;                /* a non-retriable error was seen */
	bool wretry;
	char wmsg[512];
	/* the state topic's cleanup.policy check: how the step that asked for it goes on */
	void (*chk_ok)(km_state_persist *io);
	void (*chk_fail)(km_state_persist *io, const char *why);      /* the check could not be made: retry */
	void (*chk_fatal)(km_state_persist *io, const char *message); /* the topic is not compacted */
	/* following (persist_follow.c): from where the load ended, every state partition */
	struct event *fev;         /* the next round */
	km_cluster *fcl;           /* connections of its own: a long-polled Fetch would hold a write up */
	km_net_client *fwait;      /* the client of fcl a round waits for */
	int64_t *fpos;             /* per state partition: the next offset to read */
	int64_t *fhw;              /* per state partition: its high watermark in the round's answer */
	int32_t fparts;            /* entries of fpos and fhw */
	int fout;                  /* the round's Fetch requests not answered yet */
	/*
	 * A round runs beside a write (docs/state.md, "Following"): its answers carry fgen, which a
	 * load (or the round's end) moves on, not gen. It applies what it read only when it read past
	 * every write of this kmirrord acknowledged meanwhile (wend), else the next round does.
	 */
	uint64_t fgen;
	bool fround;               /* a round's Fetch requests are out */
	uint64_t fstarted;         /* rounds started */
	uint64_t fapplied;         /* the number of the last round that ended caught up (km_state_follow_ticket) */
	/*
	 * This kmirrord's records acknowledged but maybe not read by following yet (docs/state.md,
	 * "Rounds run beside writes"): a model rebuilt from what was read gets them again, those at or
	 * past where following read their partition; dropped once it read past them.
	 */
	struct km_ps_own *own;
	size_t nown, capown;
	uint64_t wblind_at;        /* fstarted when a write was acknowledged at offsets not known: a later round only */
	bool freload;              /* a round was answered OFFSET_OUT_OF_RANGE: load again once no write runs */
	int fbackoff_ms;           /* a round's backoff (a write's retries have backoff_ms) */
	bool ffail;                /* the round failed: metadata again, after a backoff */
	bool fdirty;               /* the map holds records another producer wrote, not in the model yet */
	bool fchecked;             /* the topic's policy was checked (by the load, or when following found it) */
	int64_t foldest_ms;        /* the oldest such record's batch timestamp (-1: none) */
	/* topics metadata */
	char **mnames;
	size_t mn;
	km_state_meta_cb mcb;
	int64_t munknown_until_ms; /* an unknown topic is asked again until then (a broker learns a new topic late) */
};

typedef struct req_ctx {
	km_state_persist *io;
	uint64_t gen;       /* io->gen, or io->fgen for a follow round's request (follow) */
	bool follow;
	int32_t node_id;
	int32_t partition;
} req_ctx;


/* ---- persist.c: the persister's brokers and requests ---- */

/* A cluster of the destination as kmirrord itself; on_change(io) when one of its clients is ready or failed. */
km_cluster *km_ps_cluster_new(km_state_persist *io, void (*on_change)(void *arg));

#define KM_PS_ANY (-1)     /* a client to any broker (node ids are never negative) */

/* fn(io) in ms (one timer per persister). */
void km_ps_after(km_state_persist *io, int ms, void (*fn)(km_state_persist *));
/* The next backoff of the retries that keep theirs in *backoff_ms (doubling from 200 ms, capped at 10 s; 0 starts again). */
int km_ps_next_backoff(int *backoff_ms);
/* Whether c (the client of broker id, or KM_PS_ANY) is ready; else resume(io) runs when it is (or fails). */
bool km_ps_client_wait(km_state_persist *io, km_net_client *c, int32_t id, void (*resume)(km_state_persist *io));
/* The version of key to use on c; -1 with why when c cannot serve it. */
int16_t km_ps_version_for(km_net_client *c, int16_t key, char *why, size_t len);
/* A client to any broker (a bootstrap address until the metadata names brokers). */
km_net_client *km_ps_any(km_state_persist *io);
/* The client of broker id (from the state topic's metadata). */
km_net_client *km_ps_node(km_state_persist *io, int32_t id);
/* Forget c after a failure on it: the next ask reconnects (the next bootstrap address for one). */
void km_ps_drop(km_state_persist *io, km_net_client *c);
/* Call key with req (a km_<name>_request) on c, answered to cb with a req_ctx naming the node and partition. */
km_err km_ps_send_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, const void *req,
		      km_rpc_cb cb, int32_t node_id, int32_t partition);
/* The same for a follow round's request: its context carries io->fgen. */
km_err km_ps_send_follow_req(km_state_persist *io, km_net_client *c, int16_t key, int16_t ver, const void *req,
			     km_rpc_cb cb, int32_t node_id);
/* The persister of an answer's context (freed); NULL when the operation restarted since, or shuts down. */
km_state_persist *km_ps_ctx_take(void *arg, req_ctx *out);
/* Metadata for the topics names (no auto-creation) on c, answered to cb. */
km_err km_ps_send_metadata(km_state_persist *io, km_net_client *c, int16_t ver, char *const *names, size_t n,
			   km_rpc_cb cb);
/* The state topic's partitions and leaders from a Metadata answer. */
km_err km_ps_take_metadata(km_state_persist *io, const km_metadata_response *r, int16_t *topic_err);

/* ---- persist_policy.c ---- */

/*
 * DescribeConfigs of the state topic's cleanup.policy (it exists: the metadata named it), then
 * ok(io) when it is compact alone, fatal(io, message) when it is anything else (the message says
 * what to do), fail(io, why) when the answer does not tell (the caller retries).
 */
void km_ps_check_policy(km_state_persist *io, void (*ok)(km_state_persist *io),
			void (*fail)(km_state_persist *io, const char *why),
			void (*fatal)(km_state_persist *io, const char *message));

/* ---- persist_load.c ---- */

void km_ps_map_clear(km_state_persist *io);
/* The state topic is not compacted: nothing more is read or written, and the store stops for good. */
void km_ps_refused(km_state_persist *io, const char *message);
/* The model of the map (every key's latest value); KM_ERR_NOMEM. *bad: records that do not apply. */
km_err km_ps_build_model(km_state_persist *io, km_state_model *m, size_t *bad) __attribute__((warn_unused_result));
/*
 * A Fetch answer's records of one partition from *next (below hi) into the map; NULL or why not.
 * foreign, oldest_ms (may be NULL): a record written by another producer than io->pid, the oldest timestamp.
 */
const char *km_ps_take_records(km_state_persist *io, const km_fetch_response_partition_data *pd, int64_t *next,
			       int64_t hi, bool *foreign, int64_t *oldest_ms);

/* ---- persist_follow.c ---- */

/* Positions for every partition of the topic (new ones at 0); false when out of memory. */
bool km_ps_follow_positions(km_state_persist *io);
/* The next follow round in ms (it starts only while no other operation runs; each one's end kicks it). */
void km_ps_follow_kick(km_state_persist *io, int ms);
void km_ps_follow_free(km_state_persist *io);
/* The records of the write under way on state partition p were acknowledged from offset base on (-1: not known). */
void km_ps_follow_acked(km_state_persist *io, int32_t p, int64_t base);
/* The round out (if any) is dropped, and the writes acknowledged forgotten: a load rebuilds the map and the positions. */
void km_ps_follow_drop(km_state_persist *io);

#endif
