/* Internals of metadata sync (docs/mirror.md, "Metadata sync"): a mirror's sync, its cycle, the cycle's data. */
#ifndef KMIRROR_MIRROR_SYNC_H
#define KMIRROR_MIRROR_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/clock.h"
#include "kmirror/msg/incremental_alter_configs_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/wire.h"
#include "mirror/mirror_int.h"

#define COMP KM_MIRROR_COMP

/* The module looks at its mirrors this often (a cycle starts when one is due). */
#define TICK_MS 1000
/* A step waits this long at most for the brokers it needs (connections, answers). */
#define STEP_TIMEOUT_MS 20000
/* Wire values (Kafka's): resource TOPIC for configs, ANY for ACL filters, pattern/operation/permission ANY. */
enum { K_RES_TOPIC = 2, K_ANY = 1, K_PATTERN_ANY = 1, K_DYNAMIC_TOPIC_CONFIG = 1 };
enum { K_OP_SET = 0, K_OP_DELETE = 1 };
enum { K_SECURITY_DISABLED = 54, K_GROUP_ID_NOT_FOUND = 69, K_GROUP_COORDINATOR_KEY = 0 };
/*
 * Versions: Metadata v1+ (topic errors by name), DescribeConfigs v1+ (config source),
 * IncrementalAlterConfigs v0+, ListGroups v4+ (group states; v5 adds types), FindCoordinator v4+ (many
 * keys, Kafka 3.0), OffsetFetch v8-9 (many groups, topics by name), OffsetCommit v2-9 (topics by name),
 * DescribeAcls / CreateAcls / DeleteAcls v1+ (pattern types).
 */
enum {
	META_LO = 1, META_HI = 12, DC_LO = 1, DC_HI = 4, IAC_LO = 0, IAC_HI = 1, LG_LO = 4, LG_HI = 5, FC_LO = 4,
	FC_HI = 6, OF_LO = 8, OF_HI = 9, OC_LO = 2, OC_HI = 9, ACL_LO = 1, ACL_HI = 3, DSO_LO = 0, DSO_HI = 1,
	ASO_LO = 0, ASO_HI = 0,
};

/* One step's status, owned here (km_sync_status is its read view). */
typedef struct sstat {
	int64_t last_sync_ms, compared, changes_last, changes_total, skipped, errors_total, last_error_ms;
	char *last_error;
	km_metric_series *m_runs_ok, *m_runs_err, *m_changes, *m_last;
} sstat;

typedef struct sync_cycle sync_cycle;

/* One mirror's sync. */
typedef struct msync {
	struct msync *next;
	struct km_sync *s;
	char *mirror;
	sstat st[KM_SYNC__COUNT];
	bool owner;
	int64_t next_ms;      /* when the next cycle is due */
	sync_cycle *cy;       /* the cycle in progress, NULL: none */
	char **warned;        /* topics warned about unclean.leader.election.enable */
	size_t nwarned;
	char **skipping;      /* groups skipped in the last cycle (one log line when that changes) */
	size_t nskipping;
	km_metric_series *m_skipped;
	bool seen;            /* still in the store (a tick's sweep) */
} msync;

struct km_sync {
	km_mirror *mi;
	msync *head;
	struct event *tick;
	km_metric_family *f_runs, *f_changes, *f_last, *f_skipped;
	bool freeing;
};

typedef struct kv {
	const char *name, *value;
} kv;

typedef struct stopic {
	const char *name;
	int32_t store_parts, src_parts;
	bool cfg_src, cfg_dst; /* DescribeConfigs answered for it on that side */
	kv *want;              /* the source's values to have */
	size_t nwant;
	kv *have;              /* set on the destination topic */
	size_t nhave;
	bool unclean;
	km_incremental_alter_configs_request_alterable_config *chg; /* what its IncrementalAlterConfigs changes */
	int32_t nchange;
} stopic;

typedef struct soff {
	int32_t topic, partition;
	int64_t offset;
	const char *meta;
} soff;

typedef struct sgroup {
	const char *name;
	bool share; /* a share group (KIP-932): start offsets, physical on the destination */
	bool skip, src_ok, dst_ok, commit_failed;
	int32_t src_coord, dst_coord;
	soff *src, *dst;
	size_t nsrc, ndst;
	size_t ncommit; /* offsets in its commit */
} sgroup;

typedef struct sacl {
	int8_t rtype, pattern, op, perm;
	const char *rname, *principal, *host;
} sacl;

typedef enum {
	PH_META, PH_FOLLOW, PH_CFG, PH_ALTER, PH_GROUPS, PH_COORD, PH_OFFSETS, PH_COMMIT, PH_ACLS, PH_ACLS_CHANGE, PH_END
} sphase;

/* A request of the phase: to a broker of a cluster (node -1: any), for item arg. */
typedef struct sreq {
	km_cluster *cl;
	int32_t node;
	int16_t key, lo, hi;
	size_t arg;
	bool sent, done;
	bool optional; /* a broker without the API: skipped, not an error (share groups) */
} sreq;

struct sync_cycle {
	msync *m;
	km_arena a;
	km_cluster *src, *dst;
	SSL_CTX *src_tls;
	char src_boot[256];
	km_name_filter *groups;
	km_acl_scope *acls;
	km_name_filter *topics;       /* mirror.topics.include / exclude; NULL: the mirror does not follow */
	const char **cand;            /* source topics to start (step 0), in the arena */
	size_t ncand, capcand;
	struct sy_follow *follow;     /* their start, while it runs */
	sphase ph;
	km_sync_kind step;     /* the step the phase belongs to */
	bool step_failed;
	int64_t deadline;
	struct event *ev;
	bool finished;
	sreq *rq;             /* the phase's requests */
	size_t nrq, caprq;
	char why[400];
	stopic *t;
	size_t nt;
	int32_t *src_nodes, *dst_nodes;
	size_t nsrc_nodes, ndst_nodes;
	sgroup *g;
	size_t ng, capg;
	char **dst_active; /* groups with members on the destination */
	size_t nactive, capactive;
	sacl *sa, *da;     /* in-scope bindings: source, destination */
	size_t nsa, nda, capsa, capda;
	sacl **create, **delete;
	size_t ncreate, ndelete;
	int64_t changes, compared;
};


/* ---- cycle.c ---- */

/* A copy of s in the arena (NUL-terminated). */
const char *km_sy_adup(km_arena *a, km_str s);
/* arr (n items of size, *cap allocated) with room for one more, in the arena; NULL: no memory. */
void *km_sy_agrow(km_arena *a, void *arr, size_t n, size_t *cap, size_t size);
void km_sy_list_free(char **l, size_t n);
/* The step fails with a message (the step's last error), the cycle goes on. */
void km_sy_step_error(sync_cycle *cy, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *km_sy_api_name(int16_t key);
/* "source" or "destination". */
const char *km_sy_side(const sync_cycle *cy, const km_cluster *cl);
/* Start a cycle of m; false when there is nothing to sync (no synced topic) or it cannot start. */
bool km_sy_cycle_start(msync *m, const km_state_mirror *sm, const km_mirror_options *mo);
void km_sy_cycle_free(sync_cycle *cy);

/* The step's start has answered: the cycle goes on. */
void km_sy_follow_done(sync_cycle *cy);

/* ---- follow.c ---- */

/* The source's Metadata of every topic: those to start (matching, not internal, in no mirror). */
void km_sy_follow_take(sync_cycle *cy, const km_metadata_response *r);
/* Start the topics found; true when a start runs (the cycle waits for km_sy_follow_done). */
bool km_sy_follow_start(sync_cycle *cy);
/* The cycle ends: a start in flight no longer reports to it. */
void km_sy_follow_detach(sync_cycle *cy);

/* ---- encode.c ---- */

/* What t's configs on the destination need to become the source's (t->chg); false: no memory. */
bool km_sy_plan_configs(sync_cycle *cy, stopic *t);
/* Whether the destination side of g holds offset o already. */
bool km_sy_dst_has(const sgroup *g, const soff *o);
/*
 * rq's request: the km_<name>_request of rq->key, in the cycle's arena, for km_rpc_call to encode at
 * the version the broker takes. NULL: no memory.
 */
const void *km_sy_request(sync_cycle *cy, sreq *rq);

/* ---- answers.c ---- */

/* rq's answer (msg: the decoded km_<name>_response of rq->key) taken into the cycle's data (an error fails the step). */
void km_sy_take(sync_cycle *cy, sreq *rq, const void *msg);

#endif
